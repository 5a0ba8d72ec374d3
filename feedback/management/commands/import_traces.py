from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from feedback.services.jsonl import traces_import_jsonl
from training.serving.services import deployment_get_or_create


class Command(BaseCommand):
    help = (
        "Import traces from a JSONL file in the OpenAI chat format: one "
        '{"messages": [...], "tools"?: [...], "external_id"?: ...} per line. '
        "Lines without external_id get one derived from their content, so re-importing is a no-op."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="path to a .jsonl file, or - for standard input")
        parser.add_argument("--deployment", default="default", help="deployment name (created if missing)")

    def handle(self, *args, **opts) -> None:
        deployment = deployment_get_or_create(name=opts["deployment"])
        try:
            stream = sys.stdin.buffer if opts["file"] == "-" else open(opts["file"], "rb")  # noqa: SIM115
        except OSError as exc:
            raise CommandError(f"cannot read {opts['file']}: {exc}") from exc
        with stream:
            report = traces_import_jsonl(deployment=deployment, stream=stream)
        for line in report.errors:
            self.stderr.write(line)
        self.stdout.write(
            f"{report.created} created, {report.exists} already stored, {report.appended} appended, "
            f"{len(report.errors)} errors"
        )
        if report.errors and not (report.created or report.exists or report.appended):
            raise CommandError("nothing imported")
