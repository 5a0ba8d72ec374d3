from __future__ import annotations

from django.core.management.base import BaseCommand

from feedback.services.search import traces_search_index_missing


class Command(BaseCommand):
    help = "Build full-text search vectors for traces that have none (PostgreSQL), or for all with --all."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--all", action="store_true", help="rebuild every trace's vector")
        parser.add_argument("--batch", type=int, default=1000)

    def handle(self, *args, **opts) -> None:
        n = traces_search_index_missing(batch=opts["batch"], reindex_all=opts["all"])
        self.stdout.write(f"indexed {n} traces")
