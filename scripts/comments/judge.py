"""The judge arm's judge: its endpoint for a run (a local vLLM server or a URL), and its
corrections of the commented turns through the product's judging path."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any

from desk import log

from comments.comment_set import item_tasks
from comments.options import EXPERIMENTER, Options


class JudgeServer:
    """The judge endpoint for a run: a vLLM server of `options.judge` started once (and
    stopped at the end), or the endpoint `options.judge_url` names."""

    def __init__(self, options: Options):
        self.options = options
        self.served = contextlib.ExitStack()
        self.failed = ""
        self.url, self.model, self.key = options.judge_url, options.judge_model, options.judge_key

    @property
    def configured(self) -> bool:
        return bool(self.options.judge_url or self.options.judge)

    def __enter__(self) -> JudgeServer:
        if self.options.judge and not self.options.judge_url:
            from served_judge import served_judge

            from training.inference.server import ServerFailed, free_port

            try:
                endpoint = self.served.enter_context(
                    served_judge(
                        self.options.judge,
                        served_name="judge",
                        port=free_port(),  # two runs at once each start their own
                        max_model_len=4096,
                        log_path=self.options.out / "judge-server.log",
                        start_timeout=900,
                        announce=lambda url: log(f"starting the judge {self.options.judge} on {url}"),
                    )
                )
            except ServerFailed as exc:  # the arm is skipped and says why; the others run
                self.failed = str(exc)[-500:]
                return self
            self.url, self.model, self.key = endpoint.base_url, endpoint.model, endpoint.api_key
        return self

    def __exit__(self, *exc) -> None:
        self.served.close()


def judge_patience():
    """The judge's settings for a run: a local judge on a CPU answers in minutes, not
    seconds; the order-swap check would double the calls and measures the judge, which the
    record does by the oracle instead."""
    from django.conf import settings
    from django.test import override_settings

    return override_settings(
        JUDGE_TIMEOUT_S=max(settings.JUDGE_TIMEOUT_S, 900.0),
        JUDGE_DEADLINE_S=max(settings.JUDGE_DEADLINE_S, 2700.0),
        JUDGE_SWAP_CHECK_RATE=0.0,
    )


def judge_corrections(
    *,
    comments: dict[str, Any],
    seed: int,
    options: Options,
    judge: JudgeServer,
    mode: str = "text",
    name: str = "",
):
    """Every commented turn of the seed's comments set judged through the product's path
    (`judge_request` + `judge_run`, the deployment's own judge endpoint), then the set
    rebuilt from feedback (named `name`, by default `lfc-{run}-seed{seed}-judge`) so that
    each item carries the judge's corrected response. `mode` is the deployment judge's
    `correction_mode`: "text" (the judge writes the turn) or "actions" (it chooses the turn
    among the agent's actions). Returns (the set, the judge's figures, the ids of this call's
    judgements: a set item whose judgement is not among them is not this call's correction)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.contrib.auth import get_user_model
    from django.db import connection

    from feedback.models import DeploymentJudge, JudgeResult, JudgeTrigger, Message
    from feedback.services.judging import judge_request, judge_run
    from training.environments.support_desk import turn_reference
    from training.services.feedback_sets import training_set_from_feedback
    from training.trainer.graders import grade

    deployment = comments["deployment"]
    variable = re.sub(r"[^A-Z0-9_]", "_", f"PRACTICUM_JUDGE_KEY_LFC_{options.run.upper()}_{seed}")
    os.environ[variable] = judge.key
    DeploymentJudge.objects.update_or_create(
        deployment=deployment,
        defaults={"base_url": judge.url, "model": judge.model, "api_key_env": variable, "correction_mode": mode},
    )
    turns = Message.objects.filter(pk__in=comments["training_set"].items.values("message_id"))
    pending = [judge_request(message=m, trigger=JudgeTrigger.COMMENT, enqueue=False) for m in turns]

    started = time.time()
    with judge_patience():
        if options.judge_concurrency <= 1:
            for result in pending:
                judge_run(result=result)
        else:

            def run_one(result) -> None:
                try:
                    judge_run(result=result)
                finally:
                    connection.close()  # this thread's own connection

            with ThreadPoolExecutor(options.judge_concurrency) as pool:
                list(pool.map(run_one, pending))
    seconds = round(time.time() - started, 1)
    experimenter, _ = get_user_model().objects.get_or_create(username=EXPERIMENTER, defaults={"is_active": False})
    training_set = training_set_from_feedback(
        name=name or f"lfc-{options.run}-seed{seed}-judge",
        filters={"comment": "yes"},
        deployment=deployment,
        heldout_fraction=0.0,
        user=experimenter,
        judge_gate_override_reason=(
            "learn-from-comments judge arm: the local judge's agreement with people is not measured; "
            "each correction's oracle grade is kept in the run's record"
        ),
        description="the simulated lead's comments, turned into corrected responses by the judge",
    )
    task_of = item_tasks(training_set)
    # A turn whose judgement failed here keeps the latest earlier one in the set (another
    # arm's, in another mode): only this call's corrections count and are trained on.
    ours = {r.pk for r in pending}
    graded = []
    # By whose words the turn's comment is in ("lead", "bank-<kind>/<id>" → "bank-<kind>").
    by_words: dict[str, list[float]] = {}
    words = comments.get("words") or {}
    for row in training_set.items.all():
        if row.corrected_response and row.provenance.get("judge_result") in ours:
            reference = turn_reference(task=task_of[row.key], messages=row.messages) or ""
            graded.append(grade("tool_action", row.corrected_response, reference))
            if row.message_id in words:
                by_words.setdefault(words[row.message_id].split("/")[0], []).append(graded[-1])
    results = JudgeResult.objects.filter(pk__in=[r.pk for r in pending])
    figures = {
        "judged": len(pending),
        "succeeded": results.filter(status="succeeded").count(),
        "failed": results.filter(status="failed").count(),
        "corrections": len(graded),
        # A measurement of the judge only (never used in training): the share of its
        # corrections the hidden policy accepts.
        "corrections_right_by_oracle": round(sum(graded) / len(graded), 3) if graded else None,
        "corrections_right_by_oracle_by_words": {k: f"{sum(v):g}/{len(v)}" for k, v in sorted(by_words.items())},
        "correction_mode": mode,
        "judge": str(options.judge or options.judge_url),
        "judge_seconds": seconds,
    }
    return training_set, figures, ours
