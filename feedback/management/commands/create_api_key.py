from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from feedback.models import ApiKeyScope
from feedback.services.api_keys import api_key_create
from training.serving.services import deployment_get_or_create


class Command(BaseCommand):
    help = "Create an API key for a deployment (created if missing) and print it once."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deployment", required=True, help="deployment name, e.g. support-bot")
        parser.add_argument(
            "--scopes",
            default="ingest",
            help=f"comma-separated, from: {', '.join(ApiKeyScope.values)} (default: ingest)",
        )
        parser.add_argument("--name", default="", help="a label for the key")
        parser.add_argument("--expires-in-days", type=int, default=None)
        parser.add_argument("--quiet", action="store_true", help="print only the key")

    def handle(self, *args, **opts) -> None:
        scopes = [s.strip() for s in opts["scopes"].split(",") if s.strip()]
        try:
            deployment = deployment_get_or_create(name=opts["deployment"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        expires_at = None
        if opts["expires_in_days"] is not None:
            expires_at = timezone.now() + timedelta(days=opts["expires_in_days"])
        try:
            created = api_key_create(deployment=deployment, scopes=scopes, name=opts["name"], expires_at=expires_at)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if opts["quiet"]:
            self.stdout.write(created.plaintext)
            return
        self.stdout.write(f"Deployment: {deployment.name}")
        self.stdout.write(f"Scopes:     {', '.join(created.api_key.scopes)}")
        self.stdout.write(f"Expires:    {expires_at.isoformat() if expires_at else 'never'}")
        self.stdout.write(self.style.SUCCESS(f"Key:        {created.plaintext}"))
        self.stdout.write("Store it now: only a hash is kept, it cannot be shown again.")
