from __future__ import annotations

import json

import openai
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from feedback.demo.agent import DemoAgentError, demo_agent_run
from feedback.demo.seed import demo_operator_comments_add


class Command(BaseCommand):
    help = (
        "Run the demo support agent on support-desk tasks through the gateway (the real openai client), "
        "report graded outcomes as customer feedback, and seed operator comments on tracking answers."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the site (gateway at <url>/v1)")
        parser.add_argument("--api-key", required=True, help="a deployment key with the ingest and feedback scopes")
        parser.add_argument("--split", choices=["train", "validation", "test"], default="train")
        parser.add_argument("--episodes", type=int, default=24)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--concurrency", type=int, default=1, help="conversations at once (the inference server batches them)"
        )
        parser.add_argument("--feedback-base-url", default=None, help="where /api/v1/feedback is (default: base URL)")
        parser.add_argument("--no-report", action="store_true", help="post no grades or feedback")
        parser.add_argument("--deployment", default="support-bot", help="for the seeded operator comments")
        parser.add_argument("--comment-as", default="operator", help="the operator who writes the seeded comments")
        parser.add_argument("--comments", type=int, default=5, help="at most this many seeded operator comments")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args, **opts) -> None:
        if opts["episodes"] < 1:
            raise CommandError("--episodes must be at least 1")
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")

        done = 0

        def progress(ep) -> None:
            # "[n/N]" first: how far the run is, as the tour shows it (n/N episodes).
            nonlocal done
            done += 1
            if not opts["json"]:
                outcome = "—" if ep.reward is None else ("success" if ep.success else "failure")
                self.stdout.write(
                    f"[{done}/{opts['episodes']}] {ep.trace_id} {ep.task_id:<16} {ep.model:<24} {outcome:<8} "
                    f"{ep.reason[:70]}"
                )

        try:
            result = demo_agent_run(
                base_url=opts["base_url"],
                api_key=opts["api_key"],
                split=opts["split"],
                episodes=opts["episodes"],
                seed=opts["seed"],
                feedback_base_url=opts["feedback_base_url"],
                report=not opts["no_report"],
                progress=progress,
                concurrency=opts["concurrency"],
            )
        except openai.AuthenticationError as exc:
            raise CommandError(f"the gateway refused the key: {exc}") from None
        except DemoAgentError as exc:
            raise CommandError(
                f"{exc} (the key needs the ingest scope for grades and the feedback scope for feedback)"
            ) from None
        added = 0
        wanted = [(ep.trace_id, ep.operator_comment) for ep in result.episodes if ep.operator_comment]
        if opts["comments"] > 0 and wanted and get_user_model().objects.filter(username=opts["comment_as"]).exists():
            added = demo_operator_comments_add(
                deployment=opts["deployment"], comments=wanted[: opts["comments"]], author=opts["comment_as"]
            )
        if opts["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "split": result.split,
                        "episodes": len(result.episodes),
                        "graded": result.graded,
                        "success_rate": result.success_rate,
                        "seconds": round(result.seconds, 1),
                        "operator_comments": added,
                        "by_model": {
                            m: {"episodes": v.episodes, "graded": v.graded, "success_rate": v.success_rate}
                            for m, v in result.by_model.items()
                        },
                    }
                )
            )
        else:
            self.stdout.write(result.summary())
            self.stdout.write(f"  operator comments added: {added}")
