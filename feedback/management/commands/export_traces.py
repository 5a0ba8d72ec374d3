from __future__ import annotations

import sys

from django.core.management.base import BaseCommand

from feedback.models import Trace
from feedback.services.jsonl import traces_export_jsonl


class Command(BaseCommand):
    help = "Export traces as JSONL in the OpenAI chat fine-tuning format (messages + tools)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="output path, or - for standard output")
        parser.add_argument("--deployment", help="only this deployment's traces")
        parser.add_argument("--environment", help="only traces of this environment")

    def handle(self, *args, **opts) -> None:
        traces = Trace.objects.all()
        if opts.get("deployment"):
            traces = traces.filter(deployment__name=opts["deployment"])
        if opts.get("environment"):
            traces = traces.filter(environment=opts["environment"])
        if opts["file"] == "-":
            n = traces_export_jsonl(traces=traces, stream=sys.stdout.buffer)
        else:
            with open(opts["file"], "wb") as stream:
                n = traces_export_jsonl(traces=traces, stream=stream)
        self.stderr.write(f"{n} traces exported")
