"""Full-episode GRPO on SmolLM2-135M-Instruct on the CPU: an "episodes" job on the
file-system task family ("Create a file named plan.txt that contains the word harbor.",
each task opening with one worked example), graded on the files each episode leaves.

    make episodes-demo        # = nice -n 10 .venv/bin/python scripts/episodes_demo.py

It uses the project's database (DATABASE_URL, default the SQLite file under var/),
migrates it, registers SmolLM2 (converting it once), creates the job through the same
service as the jobs page and runs it in this process with the worker's code. Every
episode is recorded as a trace of the deployment "file-agent", so after the run the
dashboard (/traces/?deployment=file-agent) shows them and /training/jobs/<id>/ the job.

The figures are measured on the TEST split: the environment's 16 held-out tasks, which
use words no training task uses and choose nothing (no checkpoint, no setting), graded by
the files each episode leaves (an oracle label: the task's hidden answer). Prints one line
per step, the test-split success before and after, writes var/episodes-demo/result.json,
and exits non-zero when the gain is below --min-gain (0.2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

CONFIG = {
    "environment": "files",
    "environment_options": {"count": 64, "heldout": 16, "kinds": ["write"]},
    "adapter": "full",
    "trainable_layers": 6,
    "learning_rate": 1e-4,
    "steps": 16,
    "group_size": 6,
    "prompts_per_step": 2,
    "temperature": 0.7,
    "max_new_tokens": 40,
    "max_steps": 3,
    "max_episode_tokens": 96,
    "eval_every": 16,
    "eval_samples": 4,
    "log_kl": False,
    "checkpoint_every": 0,
    "samples_every": 4,
    "micro_batch": 6,
    "seed": 0,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=CONFIG["steps"])
    parser.add_argument("--min-gain", type=float, default=0.2)
    parser.add_argument("--config", default="{}", help="JSON fields to override in the job config")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from training.models import JobEventKind, TrainingJob
    from training.services.job_start import training_job_run
    from training.services.jobs import training_job_create
    from training.serving.services import base_model_register, deployment_get_or_create

    started = time.time()
    call_command("migrate", verbosity=0)
    path = Path(settings.MODELS_DIR) / "smollm2-135m-instruct"
    if not (path / "config.json").exists():
        from training.modelprep import smollm2_prepare

        print(f"converting SmolLM2 into {path} (once)…", flush=True)
        smollm2_prepare(path)
    _, version = base_model_register(name="smollm2-135m-instruct", path=path, metadata={"prepared_as": "smollm2"})
    deployment = deployment_get_or_create(name="file-agent")
    config = {**CONFIG, "steps": args.steps, "eval_every": args.steps, **json.loads(args.config)}
    job = training_job_create(
        kind="episodes", config=config, base_version=version, training_set=None, deployment=deployment, enqueue=False
    )
    print(f"job {job.pk}: {json.dumps(config)}", flush=True)

    done = threading.Event()

    def report() -> None:
        seen = 0
        while not done.wait(3):
            for event in job.events.filter(kind__in=[JobEventKind.STEP, JobEventKind.EVAL], id__gt=seen).order_by("id"):
                seen = event.id
                d = event.data
                if event.kind == JobEventKind.EVAL:
                    print(
                        f"eval @ step {event.step}: test-split success {d['success']:.3f} (n={d['n']}, oracle-graded)",
                        flush=True,
                    )
                else:
                    print(
                        f"step {event.step:3d}  success {d['success']:.2f}  reward {d['reward_mean']:.2f}  "
                        f"tool errors {d['tool_error_rate']:.2f}  budget {d['budget_exhaustion']:.2f}  "
                        f"early stops {d['early_stop']:.2f}  tokens/episode {d['episode_tokens']:.0f}  "
                        f"{d['step_seconds']:.0f} s",
                        flush=True,
                    )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    status = training_job_run(job_id=job.pk, worker="episodes-demo")
    if status == "skipped":  # a running worker took the job: wait for it
        while TrainingJob.objects.get(pk=job.pk).is_active:
            time.sleep(5)
    time.sleep(3.5)
    done.set()
    reporter.join()
    job = TrainingJob.objects.get(pk=job.pk)
    evals = list(job.events.filter(kind=JobEventKind.EVAL).order_by("step").values_list("step", "data"))
    first, last = evals[0][1], evals[-1][1]
    gain = last["success"] - first["success"]
    wall = time.time() - started
    result = {
        "job": job.pk,
        "status": job.status,
        "config": config,
        "heldout_success": {str(step): data["success"] for step, data in evals},
        "heldout_n": last["n"],
        "gain": gain,
        "training_seconds": sum(e.data.get("step_seconds", 0) for e in job.events.filter(kind=JobEventKind.STEP)),
        "wall_seconds": wall,
        "flagged": job.flagged,
        "breaches": job.breaches,
        "candidate": job.result_version.name if job.result_version else None,
        "traces": job.deployment.traces.count() if job.deployment else 0,
    }
    out = ROOT / "var" / "episodes-demo"
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(
        f"job {job.pk} {job.status}: test-split success {first['success']:.3f} → {last['success']:.3f} "
        f"(gain {gain:+.3f}, n={last['n']}), wall {wall / 60:.1f} min, "
        f"flagged={job.flagged}, candidate {result['candidate']}",
        flush=True,
    )
    return 0 if gain >= args.min_gain else 1


if __name__ == "__main__":
    sys.exit(main())
