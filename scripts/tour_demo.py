"""The tour's training step, measured: does a job trained on the demo agent's own traces
make it better at support-desk tasks it never saw — the TEST split — and does it leave
other customers' orders alone?

    DATABASE_URL=… nice -n 10 .venv/bin/python scripts/tour_demo.py     # or: make tour-demo

With everything real, for each of `--seeds` seeds in turn:
1. vLLM (CPU) serves SmolLM2-135M-Instruct; the site (gateway + API) runs under uvicorn;
   `support-bot` serves the base model (once, before the first seed).
2. The demo agent works test-split tasks through the gateway → the base model's success
   rate and collateral-change rate (episodes that changed an order the task does not
   concern, from each episode's audit). With `--fresh-seed F`, also a freshly generated
   slice (`tasks_fresh(seed=F)`: orders, ids, customers and wordings no split has).
3. It works training-split tasks → logged episodes, each graded by the hidden policy.
4. A training set of every graded turn of this seed's episodes (`training_set_from_episodes`:
   the context, the actions the hidden policy accepts for the `tool_action` grader, and the
   first of them rendered over the customer's order as the harness writes a turn — the
   set's corrected responses, oracle labels computed from the task's hidden answer), and
   `--variants` counterfactual copies of each decision point (the lookup's status and age
   changed, the target what the policy does then: oracle labels too).
5. An SFT job on those turns (`training_job_create`, run in this process as a worker would):
   LoRA on the top blocks → a candidate version. (`--method grpo` runs turn-level GRPO
   against the grader instead, rollouts sampled by the vLLM server under the agent's
   structured-output constraint; `sft+grpo` runs GRPO from the SFT adapter.)
6. The candidate is loaded into the server and made live (the browser tour does this
   through an evaluation, a promotion request and another person's approval).
7. The agent works the same test tasks (and fresh slice) again, with the same seeds.
8. The base model is made live again for the next seed.

Prints, per seed and over the seeds (mean with its 95 % t interval), the base's and the
candidate's test-split success, collateral-change and policy-violation rates (refunds of
the customer's own order that the policy forbids), the gain with its interval from a
bootstrap over tasks (stratified by kind) and seeds, and successes and violations per kind
of task; and writes var/tour-demo/result.json. Measuring the test split is a look, appended
to docs/experiments/test-split-looks.jsonl; a second look at the same recipe family needs
`--second-look REASON` (recipes are chosen on the validation split, docs/explanation/evidence.md). The train / validation / test splits share no order, id,
customer or wording (training/environments/support_desk.py). Traces stay in the database:
the overview page shows them per model version.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

# The parts (scripts/tour/) after the environment above: what they import inside their
# functions (Django) then finds it set.
from tour.jobs import job_configs  # noqa: E402
from tour.summary import outcome, per_seed_from_results, summary_lines  # noqa: E402

from training.inference.server import free_port  # noqa: E402

# What the tests read from here.
__all__ = ["per_seed_from_results", "summary_lines"]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="independent repeats: traffic, job and measurements")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--test-episodes", type=int, default=48, help="test-split episodes per measurement")
    parser.add_argument(
        "--fresh-seed", type=int, action="append", default=[], help="also measure this freshly generated slice"
    )
    parser.add_argument("--train-episodes", type=int, default=144)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="conversations the agent holds at once; vLLM batches them (each keeps its own sampling seed)",
    )
    parser.add_argument(
        "--train-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads for the training job (the server and the site are idle then)",
    )
    parser.add_argument(
        "--method",
        choices=["sft", "grpo", "sft+grpo"],
        default="sft",
        help="sft: fine-tune on the accepted actions of the logged turns (the corrected responses); "
        "grpo: turn-level GRPO against the tool_action grader; sft+grpo: GRPO from the SFT adapter",
    )
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument(
        "--skip-first-turns",
        action="store_true",
        help="leave each episode's first turn out of an SFT set too (always left out for GRPO)",
    )
    parser.add_argument("--sft-prompts", type=int, default=4, help="SFT turns per step")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument(
        "--first-token-weight",
        type=float,
        default=32.0,
        help="weight of each target's first token, the one that picks the turn's action (SFT); "
        "1 = the plain token mean, which did not learn the decision in scripts/desk_experiment.py",
    )
    parser.add_argument(
        "--variants",
        type=int,
        default=6,
        help="counterfactual copies of each decision point in the SFT set (the lookup's status and "
        "age changed, the target the policy's answer to them; oracle labels); 0 = the logged turns only",
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per step")
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    parser.add_argument("--layers", type=int, default=6, help="LoRA on the top N blocks")
    parser.add_argument("--inference-url", default="", help="use this running vLLM server instead of starting one")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "tour-demo")
    parser.add_argument(
        "--candidate",
        default="",
        help="measure this trained version against the base on each seed's test tasks instead of training",
    )
    parser.add_argument(
        "--summary-from-db",
        action="store_true",
        help="print the summary of the tour runs stored in this database (from their traces) and stop",
    )
    parser.add_argument(
        "--summary-from",
        type=Path,
        nargs="+",
        default=[],
        metavar="RESULT_JSON",
        help="print the summary over the seeds of these result.json files (e.g. a seed rerun after a stop) and stop",
    )
    parser.add_argument(
        "--family",
        default="",
        help="the recipe family this run measures on the test split (default: tour-<method>); "
        "each look is appended to docs/experiments/test-split-looks.jsonl",
    )
    parser.add_argument(
        "--second-look",
        default="",
        metavar="REASON",
        help="measure a family the test split was already measured for, with the reason (logged)",
    )
    args = parser.parse_args()
    if args.summary_from:
        for line in summary_lines(*per_seed_from_results(args.summary_from)):
            print(line)
        return 0
    if args.summary_from_db:
        import django

        django.setup()
        from webapp.site.selectors_measurements import measured_runs

        per_seed, slices = measured_runs(deployment="support-bot")
        for line in summary_lines(per_seed, slices):
            print(line)
        return 0

    from training.promotion.evaluation.split_looks import SecondLook, split_look_check, split_look_record

    family = args.family or f"tour-{args.method}"
    try:
        split_look_check(
            family=family,
            seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
            reason=args.second_look,
        )
    except SecondLook as exc:
        parser.error(str(exc))

    import django

    django.setup()
    import torch
    from django.conf import settings
    from django.core.management import call_command

    from feedback.demo.agent import demo_agent_run
    from feedback.services.api_keys import api_key_create
    from training.inference.server import InferenceServer, ServerSpec
    from training.promotion.services.live_set import live_set_by_command
    from training.services.episode_sets import training_set_from_episodes
    from training.services.inference import inference_client
    from training.services.job_start import training_job_run
    from training.services.jobs import training_job_create
    from training.serving.models import ModelVersion
    from training.serving.services import base_model_register, deployment_get_or_create

    torch.set_num_threads(1)
    # Ctrl-C or a TERM stops the server and the site on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    timings: dict[str, float] = {}

    def mark(name: str, since: float) -> float:
        timings[name] = round(timings.get(name, 0) + time.time() - since, 1)
        print(f"[{time.time() - started:7.0f} s] {name}: {time.time() - since:.0f} s", flush=True)
        return time.time()

    t = time.time()
    call_command("migrate", verbosity=0)
    call_command("demo_setup")
    model_dir = Path(settings.MODELS_DIR) / "smollm2-135m-instruct"
    if not (model_dir / "config.json").exists():
        call_command("prepare_model", "smollm2")
    from urllib.parse import urlsplit

    from training.serving.models import BaseModel

    server = None
    # A base model's server is part of its registration and is never repointed: start ours
    # where it was registered (an earlier tour), else anywhere, and tell the site where.
    registered = BaseModel.objects.filter(name="smollm2-135m-instruct").values_list("inference_url", flat=True).first()
    url = args.inference_url or registered or ""
    if registered and args.inference_url and args.inference_url.rstrip("/") != registered.rstrip("/"):
        parser.error(f"smollm2-135m-instruct is registered on {registered}; pass that --inference-url or none")
    if not args.inference_url:
        where = urlsplit(registered) if registered else None
        if where is not None and (where.hostname not in ("127.0.0.1", "localhost") or where.port is None):
            parser.error(f"smollm2-135m-instruct is registered on {registered}: pass --inference-url {registered}")
        spec = ServerSpec(
            model_path=str(model_dir),
            served_name="smollm2-135m-instruct",
            host=where.hostname if where else "127.0.0.1",
            port=where.port if where else free_port(),
            max_lora_rank=16,
            api_key=settings.INFERENCE_API_KEY,
        )
        server = InferenceServer(spec, log_path=args.out / "vllm.log")
        server.start()
        url = spec.url
    # This process creates the jobs (a GRPO job's rollout URL must be a known server) and the
    # site routes the live version: both find the tour's server through the setting.
    os.environ["PRACTICUM_INFERENCE_URL"] = url
    settings.INFERENCE_URL = url
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
        env={
            **os.environ,
            "PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS": "0",
        },
    )
    slices = ["test", *(f"fresh-{f}" for f in args.fresh_seed)]
    per_seed: list[dict] = []
    jobs: list[tuple[str, dict]] = []
    try:
        if server is not None:
            server.wait_ready(timeout=900)
        _base, base_version = base_model_register(
            name="smollm2-135m-instruct", path=model_dir, inference_url=registered or ""
        )
        deployment = deployment_get_or_create(name="support-bot")
        key = api_key_create(deployment=deployment, scopes=["ingest", "feedback"]).plaintext
        site_url = f"http://127.0.0.1:{site_port}"
        wait_http(f"{site_url}/login/")
        t = mark("start (migrate, vLLM, site)", t)

        def agent(split: str, episodes: int, seed: int, fresh_seed: int | None = None):
            return demo_agent_run(
                base_url=site_url,
                api_key=key,
                split=split,
                episodes=episodes,
                seed=seed,
                fresh_seed=fresh_seed,
                concurrency=args.concurrency,
            )

        def measure(seed: int, version_name: str) -> dict:
            """The live version on this seed's test tasks and fresh slices."""
            figures = {}
            for key_name in slices:
                fresh = None if key_name == "test" else int(key_name.split("-", 1)[1])
                run = agent("test" if fresh is None else "fresh", args.test_episodes, 1000 + seed, fresh)
                print(run.summary(), flush=True)
                figures[key_name] = {"version": version_name, **outcome(run)}
            return figures

        look = split_look_record(
            family=family,
            script="scripts/tour_demo.py",
            argv=sys.argv[1:],
            seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
            reason=args.second_look,
        )
        print(f"test split look {look['look']} for {family!r}, logged", flush=True)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            print(f"\n=== seed {seed} ===", flush=True)
            live_set_by_command(
                deployment=deployment, version=base_version, reason=f"tour-demo seed {seed}: base model"
            )
            before = measure(seed, base_version.name)
            t = mark("test run, base model", t)
            if args.candidate:
                candidate = ModelVersion.objects.get(name=args.candidate)
                training_set, job_ids, train_rate = None, [], None
            else:
                train_run = agent("train", args.train_episodes, 2000 + seed)
                print(train_run.summary(), flush=True)
                train_rate = train_run.success_rate
                t = mark("training traffic", t)
                time.sleep(2)  # the gateway writes traces off the response path
                training_set = training_set_from_episodes(
                    deployment=deployment,
                    environment="support-desk",
                    name=f"support-desk-episodes-seed{seed}",
                    heldout_fraction=0.0,
                    # This seed's traffic only: the latest traces of the training split.
                    limit=args.train_episodes,
                    # The harness forces the first turn to act (lookup or refund) with another
                    # regex than later turns, so GRPO samples only the later turns. SFT needs
                    # the first turns too: trained on "refund after the lookup" alone, the
                    # model starts refunding before it has looked anything up.
                    first_turns=args.method != "grpo" and not args.skip_first_turns,
                    # Each turn's accepted action rendered over the customer's order as the
                    # harness writes a turn: the corrected responses an SFT job trains on.
                    targets=True,
                    variants=args.variants if args.method != "grpo" else 0,
                )
                print(f"{training_set}: {training_set.train_count} turns", flush=True)
                jobs = job_configs(args, seed=seed, inference_url=url)
                start_version = base_version
                job_ids = []
                for kind, config in jobs:
                    job = training_job_create(
                        kind=kind, config=config, base_version=start_version, training_set=training_set, enqueue=False
                    )
                    status = training_job_run(job_id=job.pk, worker="tour-demo")
                    job.refresh_from_db()
                    job_ids.append(job.pk)
                    print(f"{kind} job {job.pk}: {status}", flush=True)
                    start_version = ModelVersion.objects.filter(metadata__training_job=job.pk).first()
                    if start_version is None:
                        raise RuntimeError(f"the {kind} job ended {status!r} without a candidate version")
                t = mark("training job", t)
                candidate = start_version
            inference_client(url).adapter_load(candidate.name, candidate.path)
            live_set_by_command(
                deployment=deployment, version=candidate, reason=f"tour-demo seed {seed}: the candidate"
            )
            t = mark("release of the candidate", t)
            after = measure(seed, candidate.name)
            t = mark("test run, candidate", t)
            per_seed.append(
                {
                    "seed": seed,
                    "base": before,
                    "candidate": after,
                    "training_set": training_set
                    and {"id": training_set.pk, "turns": training_set.train_count, "traffic_success": train_rate},
                    "jobs": job_ids,
                }
            )
            # Written after every seed, so a stopped run keeps what it measured.
            result = {
                "method": args.method,
                "jobs": [{"kind": kind, "config": config} for kind, config in jobs],
                "seeds": per_seed,
                "timings_s": timings,
                "wall_s": round(time.time() - started, 1),
            }
            (args.out / "result.json").write_text(json.dumps(result, indent=1))
            for line in summary_lines(per_seed, slices):
                print(line, flush=True)
        live_set_by_command(deployment=deployment, version=base_version, reason="tour-demo: done, base model live")
    finally:
        site.terminate()
        site.wait(30)
        if server is not None:
            server.stop()

    print("\nBase vs candidate, oracle-graded episodes (the hidden refund policy):", flush=True)
    for line in summary_lines(per_seed, slices):
        print(line, flush=True)
    print(f"wall {(time.time() - started) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
