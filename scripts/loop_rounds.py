"""The continuous loop on SmolLM2, unattended up to a person's approval: two rounds (or
`--rounds`) of a learning policy on the support desk, fed by the simulated lead's comments.

    DATABASE_URL=… CELERY_BROKER_URL=redis://… .venv/bin/python scripts/loop_rounds.py    # or: make loop-rounds
    .venv/bin/python scripts/loop_rounds.py summary                                       # the latest run's table

What runs is the product's own loop, with real parts: a Celery worker (queues `training`
and `default`) and `celery beat` ticking the learning policies, on the database and broker
the environment names. The script only plays the agent's traffic and the reviewer:

1. A deployment whose live version is SmolLM2-135M-Instruct, and one learning policy on it
   (signal: operator comments; fire at `--min-new-turns` new commented turns; recipe: the
   comment-conditioned distillation the tour uses; evaluation: `--eval-tasks` whole
   support-desk episodes of the VALIDATION split, candidate against live; the policy's
   default requirements; an approver to notify).
2. Each round: the live version plays `--episodes` training-split tasks under the demo
   agent's harness; they are stored as traces; the simulated support lead comments on the
   failed ones through the comment service (words only, sometimes vague, now and then wrong).
   Then nothing but beat and the worker: the policy fires, builds its set from the comments
   no run used, trains, evaluates the candidate against live and either opens a promotion
   request for the approver or records why not. The script waits for the run to end.
3. The round's candidate (whatever the policy decided) and the base play the same TEST-split
   tasks once with the same sampling seeds: success with its Wilson interval, and the gain
   paired by task with its 95 % interval from a bootstrap over the tasks, stratified by kind.

Each round's measurement of its candidate on the test split is a look at held-out figures
(family `loop-rounds round N (…)`, with the run's settings): a run whose rounds were measured
there for its seed already is refused before anything starts, unless `--second-look REASON`,
and each look is checked again and logged in docs/experiments/test-split-looks.jsonl (or
`--looks-log`) just before the candidate plays.

Nobody approves anything, so nothing goes live: round 2's traffic comes from the same live
version, and its candidate learns from round 2's new comments. Every record is appended to
var/loop-rounds/runs.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import desk_experiment as desk  # noqa: E402  (the agent's harness and the measurement)

from training.promotion.evaluation.split_looks import LOG as LOOKS_LOG  # noqa: E402

OUT = ROOT / "var" / "loop-rounds"
RECIPE = {  # learn-from-comments' distillation settings (decision 0027), chosen before any run here
    "adapter": "lora",
    "lora_rank": 16,
    "lora_alpha": 32,
    "trainable_layers": 6,
    "learning_rate": 5e-4,
    "steps": 16,
    "prompts_per_step": 4,
    "samples_per_prompt": 2,
    "max_new_tokens": 48,
    "eval_every": 0,
}


def _worker_env(out: Path) -> dict[str, str]:
    return os.environ | {
        "PRACTICUM_LEARNING_POLICY_TICK_SECONDS": "5",
        "PRACTICUM_EVAL_GENERATOR": "local",
        "PRACTICUM_TRAINING_DIR": str(out / "training"),
        "OMP_NUM_THREADS": "1",
    }


def _celery(out: Path, name: str, *args: str) -> subprocess.Popen:
    log = open(out / f"{name}.log", "a")  # noqa: SIM115 - the process writes to it until stopped
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "webapp", *args],
        cwd=ROOT,
        env=_worker_env(out),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def append(out: Path, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def setup(*, model: Path, run: str, args) -> tuple[Any, Any]:
    """The deployment with SmolLM2 live, and its learning policy."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from training.learning_policies.services import learning_policy_create
    from training.promotion.services.live_set import live_set_by_command
    from training.serving.models import BaseModel, Deployment, ModelVersion, ModelVersionKind

    base, _ = BaseModel.objects.get_or_create(name=f"smollm2-loop-{run}", defaults={"path": str(model)})
    version = ModelVersion.objects.create(
        name=f"smollm2-loop-{run}-base", base_model=base, kind=ModelVersionKind.BASE, path=str(model)
    )
    deployment = Deployment.objects.create(
        name=f"desk-loop-{run}", description="the continuous loop's rounds on the support desk"
    )
    live_set_by_command(deployment=deployment, version=version, reason="the loop's starting model")
    users = get_user_model().objects
    # The policy's owner (a policy whose owner may no longer act does not fire) and the
    # approver it notifies: accounts with no usable password, so nobody signs in as them
    # and nobody approves.
    people = []
    for name, role in ((f"loop-{run}-owner", "operator"), (f"loop-{run}-approver", "approver")):
        person, created = users.get_or_create(username=name)
        if created:
            person.set_unusable_password()
            person.save(update_fields=["password"])
        person.groups.add(Group.objects.get(name=role))
        people.append(person)
    lead, approver = people
    policy = learning_policy_create(
        deployment=deployment,
        user=lead,
        name="learn-from-the-lead",
        min_new_turns=args.min_new_turns,
        job_kind="distill",
        job_config=RECIPE,
        heldout_fraction=0.0,
        eval_environment="support-desk",
        eval_environment_split="validation",
        eval_environment_tasks=args.eval_tasks,
        notify_user=approver,
    )
    return deployment, policy


def play_and_review(
    *, harness, deployment, live_name: str, run: str, round_no: int, episodes: int, seed: int
) -> dict[str, Any]:
    """The live version's traffic for one round, stored as traces, and the lead's comments."""
    from django.db import transaction

    from feedback.demo.operator import simulated_operator_review
    from feedback.models import Trace
    from training.environments.support_desk import SupportDesk, tasks_sample
    from training.services.episodes import episodes_record

    tasks = tasks_sample(split="train", count=episodes, seed=30_000 + 97 * round_no + seed, graded_share=1.0)
    played = harness.episodes(tasks, seed=seed * 1_000 + 700 + round_no)
    before = set(Trace.objects.filter(deployment=deployment).values_list("pk", flat=True))
    results = episodes_record(
        deployment=deployment,
        environment=SupportDesk.name,
        episodes=played,
        model_version=live_name,
        job_id=None,
        step=round_no,
        phase=f"loop-{run}-round{round_no}",
    )
    failed = [r for r in results if r.status == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes were not recorded: {failed[0].errors}")
    new = Trace.objects.filter(deployment=deployment).exclude(pk__in=before)
    # The lead's review lands at once: a tick between two of its comments would fire the
    # policy on part of the round, and the rest would fire a run of its own.
    with transaction.atomic():
        counts = simulated_operator_review(traces=new, seed=seed * 10 + round_no)
    return {"episodes": len(played), "successes": sum(e.reward >= 1.0 for e in played), "review": dict(counts)}


def wait_run(policy, *, after: int, timeout: float, out: Path, processes: list) -> Any:
    from training.learning_policies.models import LearningPolicyRun

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = LearningPolicyRun.objects.filter(policy=policy, pk__gt=after).order_by("pk").first()
        if run is not None and run.finished_at is not None:
            return run
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"a Celery process exited ({process.returncode}); see {out}/*.log")
        time.sleep(5)
    raise TimeoutError(f"the policy's run did not end within {timeout:.0f} s; see {out}/worker.log")


def candidate_harness(version, base_model, tokenizer):
    from peft import PeftModel

    model = PeftModel.from_pretrained(base_model, version.path)
    model.eval()
    return desk.Harness(model, tokenizer), model


def paired(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Success of both on the same tasks, and the gain paired by task with its interval from
    a bootstrap over the tasks, stratified by kind (`training.promotion.evaluation.bootstrap`)."""
    from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain
    from training.promotion.evaluation.metrics import wilson_interval

    b = [1.0 if e["success"] else 0.0 for e in base["episodes"]]
    c = [1.0 if e["success"] else 0.0 for e in other["episodes"]]
    gains = [y - x for x, y in zip(b, c, strict=True)]
    gain = task_bootstrap_gain(
        PairedEpisode(seed=0, task=str(e.get("task", i)), kind=str(e.get("kind") or ""), base=x, candidate=y)
        for i, (e, x, y) in enumerate(zip(base["episodes"], b, c, strict=True))
    )
    low, high = (gain.ci_low, gain.ci_high) if gain is not None else (None, None)
    return {
        "n": len(b),
        "base": sum(b) / len(b),
        "base_interval": wilson_interval(sum(b), len(b)),
        "candidate": sum(c) / len(c),
        "candidate_interval": wilson_interval(sum(c), len(c)),
        "gain": sum(gains) / len(gains),
        "gain_interval": (low, high),
        "changed": sum(1 for g in gains if g),
    }


def look_family(args, round_no: int) -> str:
    """The recipe family a round's candidate is: the loop's round with the settings that make it."""
    return f"loop-rounds round {round_no} ({args.episodes} episodes a round, fires at {args.min_new_turns} turns)"


def looks_check(args) -> None:
    """Refuse (`SecondLook`) a run whose rounds' candidates were measured on the test split
    already for its seed, unless `--second-look REASON`."""
    from training.promotion.evaluation.split_looks import split_look_check

    for round_no in range(1, args.rounds + 1):
        split_look_check(
            family=look_family(args, round_no), seeds=[args.seed], reason=args.second_look, path=args.looks_log
        )


def look_take(args, round_no: int, run_id: str, commit: str) -> None:
    """Check and log a round's look at the test split, just before its candidate is measured."""
    from training.promotion.evaluation.split_looks import split_look_take

    split_look_take(
        family=look_family(args, round_no),
        script="scripts/loop_rounds.py",
        argv=args.argv,
        seeds=[args.seed],
        reason=args.second_look,
        path=args.looks_log,
        run=run_id,
        commit=commit,
    )


def run(args) -> None:
    import torch

    from training.modelprep import smollm2_prepare

    torch.set_num_threads(1)
    desk.cpu_attention()
    from training.promotion.evaluation.split_looks import SecondLook, repository_commit

    run_id = args.run or time.strftime("%Y%m%d-%H%M%S")
    commit = repository_commit()  # the code that runs, not the one when a round ends
    looks_check(args)
    out = args.out / run_id
    out.mkdir(parents=True, exist_ok=True)
    model_dir = smollm2_prepare(args.model)
    deployment, policy = setup(model=model_dir, run=run_id, args=args)
    base_model, tokenizer = desk.load_base(model_dir)
    base = desk.Harness(base_model, tokenizer)
    test = desk.eval_tasks(split="test", episodes=args.test_episodes, seed=args.seed)
    base_test = desk.measure(base, test, seed=args.seed, label="base test")
    append(args.out, {"run": run_id, "kind": "base", "measure": base_test})
    worker = _celery(out, "worker", "worker", "-Q", "training,default", "-P", "solo", "--loglevel", "INFO")
    beat = _celery(out, "beat", "beat", "--schedule", str(out / "beat-schedule"), "--loglevel", "INFO")
    last = 0
    try:
        for round_no in range(1, args.rounds + 1):
            started = time.time()
            traffic = play_and_review(
                harness=base,
                deployment=deployment,
                live_name=f"smollm2-loop-{run_id}-base",
                run=run_id,
                round_no=round_no,
                episodes=args.episodes,
                seed=args.seed,
            )
            desk.log(f"round {round_no}: {traffic}; waiting for the policy")
            policy_run = wait_run(policy, after=last, timeout=args.round_timeout, out=out, processes=[worker, beat])
            last = policy_run.pk
            record: dict[str, Any] = {
                "run": run_id,
                "kind": "round",
                "round": round_no,
                "traffic": traffic,
                "policy_run": policy_run.pk,
                "fired_because": policy_run.reason,
                "provenance": policy_run.provenance,
                "outcome": policy_run.outcome,
                "checks": policy_run.checks,
                "error": policy_run.error,
                "promotion": policy_run.promotion_id,
                "evaluation": policy_run.evaluation.summary if policy_run.evaluation else None,
                "job": policy_run.job_id,
                "seconds": round(time.time() - started, 1),
            }
            job = policy_run.job
            version = job.result_version if job is not None else None
            if version is not None:
                try:
                    look_take(args, round_no, run_id, commit)
                except SecondLook as exc:
                    record["not_measured"] = str(exc)
                    version = None
            if version is not None:
                harness, model = candidate_harness(version, base_model, tokenizer)
                measured = desk.measure(harness, test, seed=args.seed, label=f"round {round_no} candidate test")
                record |= {"candidate": version.name, "measure": measured, "test": paired(base_test, measured)}
                base_model = model.unload()  # the base again, for the next round's traffic
                base = desk.Harness(base_model, tokenizer)
            append(args.out, record)
            desk.log(f"round {round_no}: {policy_run.outcome} {record.get('test')}")
    finally:
        _stop(beat)
        _stop(worker)
    from training.serving.models import LiveVersion

    live = LiveVersion.objects.get(deployment=deployment).version
    append(args.out, {"run": run_id, "kind": "end", "live": live.name})


def summary(path: Path, run_id: str = "") -> None:
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    if not records:
        print(f"no runs in {path}")
        return
    run_id = run_id or records[-1]["run"]
    records = [r for r in records if r["run"] == run_id]
    print(f"Run {run_id}: test split, the base and each round's candidate on the same tasks and seeds.\n")
    print(
        "| round | comments (kinds) | policy outcome | candidate | base → candidate (95 % Wilson) | gain paired by task (95 %, task bootstrap) |"
    )
    print("|---|---|---|---|---|---|")
    fmt = "{:.3f}".format
    for r in records:
        if r["kind"] != "round":
            continue
        t = r.get("test")
        review = {k: v for k, v in r["traffic"]["review"].items() if v}
        why = r["outcome"] + ("" if r["outcome"] == "requested" else f": {r['error'] or _failed(r['checks'])}")
        if t:
            bl, bh = t["base_interval"]
            cl, ch = t["candidate_interval"]
            gl, gh = t["gain_interval"]
            cells = (
                f"{fmt(t['base'])} [{fmt(bl)}, {fmt(bh)}] → {fmt(t['candidate'])} [{fmt(cl)}, {fmt(ch)}] (n = {t['n']})",
                f"{t['gain']:+.3f} [{gl:+.3f}, {gh:+.3f}], {t['changed']} changed",
            )
        else:
            cells = ("no candidate", "")
        print(f"| {r['round']} | {review} | {why} | {r.get('candidate', '')} | {cells[0]} | {cells[1]} |")
    end = [r for r in records if r["kind"] == "end"]
    if end:
        print(f"\nLive at the end: {end[0]['live']} (nothing was approved).")


def _failed(checks: list[dict[str, Any]]) -> str:
    return "; ".join(c.get("name", "") + ": " + c.get("detail", "") for c in checks if not c.get("ok", True))[:300]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["run", "summary"], default="run")
    p.add_argument("--model", type=Path, default=desk.MODEL)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--episodes", type=int, default=32, help="training-split episodes of traffic per round")
    p.add_argument("--min-new-turns", type=int, default=10, help="the policy fires at this many new commented turns")
    p.add_argument("--eval-tasks", type=int, default=16, help="validation-split episodes in the policy's evaluation")
    p.add_argument("--test-episodes", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round-timeout", type=float, default=5400)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--run", default="", help="the run's id (default: the start time; summary: the latest)")
    p.add_argument(
        "--looks-log",
        type=Path,
        default=LOOKS_LOG,
        help="where each round's look at the test split is checked and logged (default: %(default)s)",
    )
    p.add_argument(
        "--second-look",
        default="",
        metavar="REASON",
        help="measure rounds already measured on the test split for this seed, with the reason (logged)",
    )
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "summary":
        summary(args.out / "runs.jsonl", args.run)
        return 0
    from training.promotion.evaluation.split_looks import SecondLook

    try:
        looks_check(args)  # before anything starts: a refused look costs nothing
    except SecondLook as exc:
        raise SystemExit(str(exc)) from None
    import django

    django.setup()
    run(args)
    summary(args.out / "runs.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
