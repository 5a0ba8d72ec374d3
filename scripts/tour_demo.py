"""The tour's training step, measured: does a job trained on the demo agent's own traces
make it better at held-out support-desk tasks?

    DATABASE_URL=… nice -n 10 .venv/bin/python scripts/tour_demo.py     # or: make tour-demo

With everything real, in this order:
1. vLLM (CPU) serves SmolLM2-135M-Instruct; the site (gateway + API) runs under uvicorn;
   `support-bot` serves the base model.
2. The demo agent works the held-out tasks through the gateway → the base success rate.
3. It works training tasks → logged episodes, each graded (customer feedback).
4. A training set of every graded turn of those episodes (`training_set_from_episodes`:
   the context, the actions the hidden policy accepts for the `tool_action` grader, and
   the first of them written out as the harness writes a turn — the corrected response).
5. An SFT job on those corrected turns (`training_job_create`, run in this process as a
   worker would): LoRA on the top blocks, about four passes over the turns → a candidate
   version. (`--method grpo` runs turn-level GRPO against the grader instead, rollouts
   sampled by the vLLM server under the agent's structured-output constraint;
   `sft+grpo` runs GRPO from the SFT adapter.)
6. The candidate is loaded into the server and made live (the browser tour does this
   through an evaluation, a promotion request and another person's approval).
7. The agent works the same held-out tasks again, with the same seeds → the new rate.

Prints both rates and the wall time of each step, and writes var/tour-demo/result.json.
Both runs' traces stay in the database: the overview page shows them per model version.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.5)


def stored_run(deployment, version: str, split: str):
    """A finished run's outcome, read back from the graded feedback in the database."""
    from feedback.demo.agent import GRADER_REF, DemoEpisode, DemoRunResult
    from feedback.models import CustomerFeedback

    result = DemoRunResult(split=split)
    rows = CustomerFeedback.objects.filter(
        deployment=deployment,
        customer_ref=GRADER_REF,
        trace__metadata__split=split,
        trace__model_version__name=version,
    ).values_list("trace__external_id", "trace__metadata__task_id", "rating", "comment")
    for external_id, task_id, rating, reason in rows:
        result.episodes.append(
            DemoEpisode(
                trace_id=external_id,
                task_id=task_id,
                split=split,
                graded=True,
                reward=(rating - 1) / 4,
                reason=reason,
                model=version,
                end="answered",
            )
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout-episodes", type=int, default=72, help="per measurement (12 tasks, each 6 times)")
    parser.add_argument("--train-episodes", type=int, default=96)
    parser.add_argument(
        "--method",
        choices=["sft", "grpo", "sft+grpo"],
        default="sft",
        help="sft: fine-tune on the accepted actions of the logged turns (the corrected responses); "
        "grpo: turn-level GRPO against the tool_action grader; sft+grpo: GRPO from the SFT adapter",
    )
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument(
        "--skip-first-turns",
        action="store_true",
        help="leave each episode's first turn out of an SFT set too (always left out for GRPO)",
    )
    parser.add_argument("--sft-prompts", type=int, default=4, help="SFT turns per step")
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per step")
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    parser.add_argument("--layers", type=int, default=6, help="LoRA on the top N blocks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inference-url", default="", help="use this running vLLM server instead of starting one")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "tour-demo")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the base run, the training traffic and the training set already in this database "
        "(from an earlier run that stopped) and start at the training job",
    )
    parser.add_argument(
        "--candidate",
        default="",
        help="measure this trained version again (implies --reuse; more held-out episodes or other "
        "seeds with --heldout-episodes and --seed) instead of training a new one",
    )
    args = parser.parse_args()

    import django

    django.setup()
    import torch
    from django.conf import settings
    from django.core.management import call_command

    from feedback.demo.agent import ACT_OR_REPLY_REGEX, demo_agent_run
    from feedback.services.api_keys import api_key_create
    from feedback.services.deployments import deployment_get_or_create
    from training.inference import client
    from training.inference.server import InferenceServer, ServerSpec
    from training.models import ModelVersion
    from training.services.episode_sets import training_set_from_episodes
    from training.services.job_runner import training_job_run
    from training.services.jobs import training_job_create
    from training.services.models import base_model_register, live_version_set

    torch.set_num_threads(1)
    # Ctrl-C or a TERM stops the server and the site on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    timings: dict[str, float] = {}

    def mark(name: str, since: float) -> float:
        timings[name] = round(time.time() - since, 1)
        print(f"[{time.time() - started:7.0f} s] {name}: {timings[name]:.0f} s", flush=True)
        return time.time()

    t = time.time()
    call_command("migrate", verbosity=0)
    call_command("demo_setup")
    model_dir = Path(settings.MODELS_DIR) / "smollm2-135m-instruct"
    if not (model_dir / "config.json").exists():
        call_command("prepare_model", "smollm2")
    server = None
    url = args.inference_url
    if not url:
        port = free_port()
        spec = ServerSpec(model_path=str(model_dir), served_name="smollm2-135m-instruct", port=port, max_lora_rank=16)
        server = InferenceServer(spec, log_path=args.out / "vllm.log")
        server.start()
    site_port = free_port()
    site = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/uvicorn"),
            "webapp.asgi:application",
            "--port",
            str(site_port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, "PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS": "0"},
    )
    try:
        if server is not None:
            server.wait_ready(timeout=900)
            url = server.url
        _base, base_version = base_model_register(name="smollm2-135m-instruct", path=model_dir, inference_url=url)
        deployment = deployment_get_or_create(name="support-bot")
        live_version_set(deployment=deployment, version=base_version, reason="tour-demo: start from the base model")
        key = api_key_create(deployment=deployment, scopes=["ingest", "feedback"]).plaintext
        site_url = f"http://127.0.0.1:{site_port}"
        wait_http(f"{site_url}/login/")
        t = mark("start (migrate, vLLM, site)", t)

        def agent(split: str, episodes: int, seed: int):
            return demo_agent_run(base_url=site_url, api_key=key, split=split, episodes=episodes, seed=seed)

        if args.reuse or args.candidate:
            before = stored_run(deployment, base_version.name, "heldout")
            train_run = stored_run(deployment, base_version.name, "train")
            print(f"reusing: base held-out {before.success_rate:.3f} ({before.graded} graded)")
        else:
            before = agent("heldout", args.heldout_episodes, 1000 + args.seed)
            print(before.summary(), flush=True)
            t = mark("held-out run, base model", t)

            train_run = agent("train", args.train_episodes, 2000 + args.seed)
            print(train_run.summary(), flush=True)
            t = mark("training traffic", t)

            time.sleep(2)  # the gateway writes traces off the response path
        if args.candidate:
            candidate = ModelVersion.objects.get(name=args.candidate)
            training_set, jobs, job, status = None, [], None, "measured again"
        else:
            training_set = training_set_from_episodes(
                deployment=deployment,
                environment="support-desk",
                name="support-desk-episodes",
                heldout_fraction=0.0,
                # The harness forces the first turn to act (lookup or refund) with another regex
                # than later turns, so GRPO samples only the later turns. SFT needs the first
                # turns too: trained on "refund after the lookup" alone, the model starts
                # refunding before it has looked anything up.
                first_turns=args.method != "grpo" and not args.skip_first_turns,
                # Each turn's accepted action written out as the harness writes a turn: the
                # corrected responses an SFT job trains on.
                targets=True,
            )
            print(f"{training_set}: {training_set.train_count} train turns, {training_set.heldout_count} held out")
            lora = {"adapter": "lora", "lora_rank": 16, "trainable_layers": args.layers, "seed": args.seed}
            quiet = {"eval_every": 10, "eval_samples": 2, "checkpoint_every": 0, "samples_every": 0}
            jobs = []
            start_version = base_version
            t = mark("training set", t)
            if args.method in ("sft", "sft+grpo"):
                config = {
                    **lora,
                    **quiet,
                    "learning_rate": args.sft_lr,
                    "steps": args.sft_steps,
                    "prompts_per_step": args.sft_prompts,
                }
                jobs.append(("sft", config))
            if args.method in ("grpo", "sft+grpo"):
                config = {
                    **lora,
                    **quiet,
                    "learning_rate": args.lr,
                    "steps": args.steps,
                    "prompts_per_step": args.prompts,
                    "group_size": args.group_size,
                    "max_new_tokens": 48,
                    # Rollouts on the vLLM server, under the constraint the agent's harness serves with.
                    "rollout": "vllm",
                    "vllm_url": url.rstrip("/") + "/v1",
                    "structured_outputs": {"regex": ACT_OR_REPLY_REGEX},
                    "temperature": args.temperature,
                    "log_kl": False,
                }
                jobs.append(("grpo", config))
            for kind, config in jobs:
                job = training_job_create(
                    kind=kind, config=config, base_version=start_version, training_set=training_set, enqueue=False
                )
                status = training_job_run(job_id=job.pk, worker="tour-demo")
                job.refresh_from_db()
                print(f"{kind} job {job.pk}: {status}; held-out turn evaluations: {job.eval_metrics}", flush=True)
                start_version = ModelVersion.objects.filter(metadata__training_job=job.pk).first()
                if start_version is None:
                    raise RuntimeError(f"the {kind} job ended {status!r} without a candidate version")
            t = mark("training job", t)
            candidate = start_version
        client.adapter_load(candidate.name, candidate.path, base_url=url)
        live_version_set(deployment=deployment, version=candidate, reason="tour-demo: the trained candidate")
        t = mark(f"release of {candidate.name}", t)

        after = agent("heldout", args.heldout_episodes, 1000 + args.seed)
        print(after.summary(), flush=True)
        t = mark("held-out run, candidate", t)
    finally:
        site.terminate()
        site.wait(30)
        if server is not None:
            server.stop()

    result = {
        "base": {"version": base_version.name, "success_rate": before.success_rate, "graded": before.graded},
        "candidate": {"version": candidate.name, "success_rate": after.success_rate, "graded": after.graded},
        "gain": after.success_rate - before.success_rate,
        "training_set": training_set
        and {"id": training_set.pk, "train": training_set.train_count, "heldout": training_set.heldout_count},
        "method": args.method,
        "jobs": [{"kind": kind, "config": config} for kind, config in jobs],
        "job": {"id": job.pk if job else None, "status": status},
        "train_traffic_success_rate": train_run.success_rate,
        "timings_s": timings,
        "wall_s": round(time.time() - started, 1),
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    print(
        f"\nheld-out success: {before.success_rate:.3f} ({before.graded} episodes, {base_version.name}) → "
        f"{after.success_rate:.3f} ({after.graded} episodes, {candidate.name}), gain {result['gain']:+.3f}; "
        f"wall {result['wall_s'] / 60:.1f} min (training job {timings.get('training job', 0) / 60:.1f} min)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
