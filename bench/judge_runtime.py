"""The local judge served two ways, side by side on the same judgements: vLLM on the fp32
folder that `make local-judge` converts, and llama.cpp's `llama-server` on the Q4_K_M GGUF
that folder was converted from (`make local-judge-server`) — the same weights.

Each judgement is one comment of the comment bank on a support-desk decision context, read
through the product's path in actions mode (`reader_bank.read_one`: `judge_turn_action`, the
action-space schema as `response_format`). Both servers run at once, idle but for the
request in flight; the judgements alternate between them, one request at a time, and which
server goes first alternates too, so machine noise hits both alike. Prints, for each, the
median seconds a judgement (the re-asks included), its actions right, the calls that
failed, and the ratio of the medians; then how often the two chose the same action. The
contexts are the validation split's; `--split test` is a look at the test split, logged
(`reader_bank.bank_contexts`).

    .venv/bin/python bench/judge_runtime.py [--cases N]     # default: all 30 of the bank

Needs `make local-judge` and `make local-judge-server`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from support import free_port  # noqa: E402  (bench/, the script's own folder)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=0, help="bank comments judged by each server (0: all)")
    p.add_argument("--folder", type=Path, default=ROOT / "var" / "judges" / "qwen2.5-coder-1.5b-instruct")
    p.add_argument("--gguf", type=Path, default=ROOT / "var" / "judges" / "qwen2.5-coder-1.5b-instruct.gguf")
    from reader_bank import bank_contexts, read_one, split_arguments  # scripts/

    split_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import contextlib

    from served_judge import served_judge

    from training.environments.comment_bank import bank_cases
    from training.promotion.evaluation.split_looks import SecondLook

    look = {
        "split": args.split,
        "seed": args.seed,
        "family": f"judge-runtime ({args.folder.name} on vLLM, {args.gguf.name} on llama-server)",
        "script": "bench/judge_runtime.py",
        "argv": sys.argv[1:],
        "second_look": args.second_look,
        "looks_log": args.looks_log,
    }
    try:
        bank_contexts(**look, take=False)  # refused before either server starts
    except SecondLook as exc:
        print(f"not run: {exc}", file=sys.stderr)
        return 2
    limits = {"timeout_s": 900, "deadline_s": 2700, "max_tokens": 400, "correction_mode": "actions"}
    served = {"vLLM fp32": (args.folder, "vllm"), "llama-server Q4_K_M": (args.gguf, "llama")}
    rows: dict[str, list[dict]] = {name: [] for name in served}
    with contextlib.ExitStack() as stack:
        endpoints = {}
        for name, (model, log) in served.items():
            started = time.monotonic()
            endpoints[name] = stack.enter_context(
                served_judge(
                    model,
                    served_name="judge",
                    port=free_port(),
                    max_model_len=4096,
                    log_path=ROOT / "var" / f"bench-judge-{log}.log",
                    start_timeout=900,
                    **limits,
                )
            )
            print(f"{name} ready in {time.monotonic() - started:.0f} s", flush=True)
        try:
            contexts = bank_contexts(**look)  # the look is logged once both are up
        except SecondLook as exc:
            print(f"not run: {exc}", file=sys.stderr)
            return 2
        cases = bank_cases(contexts=contexts, seed=args.seed)
        # The bank lists its comments by kind: a sample of them is drawn across the kinds.
        random.Random(args.seed).shuffle(cases)
        cases = cases[: args.cases or None]
        names = list(endpoints)
        for i, case in enumerate(cases):
            for name in names if i % 2 == 0 else names[::-1]:
                row = read_one(case, endpoint=endpoints[name])
                rows[name].append(row)
                print(
                    f"{i + 1}/{len(cases)} {name:20} {row['seconds']:7.1f} s  chose={row['chose'] or '-':12} "
                    f"right={row['right']!s:5} {row['error'][:80]}",
                    flush=True,
                )
    print(f"\n{len(cases)} bank comments ({args.split} contexts), judged one at a time by each:")
    medians = {}
    for name, found in rows.items():
        medians[name] = statistics.median(r["seconds"] for r in found)
        print(
            f"  {name:20} median {medians[name]:6.1f} s a judgement, "
            f"{sum(r['right'] for r in found)}/{len(found)} actions right, "
            f"{sum(bool(r['error']) for r in found)} calls failed"
        )
    vllm, llama = names
    print(f"  ratio llama-server / vLLM, median seconds: {medians[llama] / medians[vllm]:.2f}")
    same = sum(a["chose"] == b["chose"] for a, b in zip(rows[vllm], rows[llama], strict=True))
    print(f"  the same action chosen: {same}/{len(cases)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
