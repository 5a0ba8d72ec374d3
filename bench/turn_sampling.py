"""Turn-level sampling: G full prefills of each prompt vs one prefill copied to its G samples.

A random-weight model of SmolLM2-135M's shape (built here from its config, no download),
fp32, one torch thread, G = 8 samples of a ~380-token chat context (a long system prompt,
as logged support turns have). The old path left-pads G copies of every prompt and
prefills them all (`prefix_decode(share_prefix=False)`, then the same masks and texts as
`sample`); the new one is `sample()` itself. They run alternately in one process, with the
same seed, so machine noise hits both alike and their tokens can be compared.

    .venv/bin/python bench/turn_sampling.py [--prompts 1] [--group 8] [--new-tokens 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONTEXT_TOKENS = 380
SENTENCE = "Orders ship within two days; refunds need the order id and go back to the original card. "


def contexts(tokenizer, count: int) -> list[list[int]]:
    """`count` chat prompts of about CONTEXT_TOKENS tokens sharing one system prompt."""
    from training.trainer.sampling import encode_prompt

    questions = [f"Where is my order A{1000 + 37 * i}, and can I still change the address?" for i in range(count)]
    system = SENTENCE
    while len(encode_prompt(tokenizer, [{"role": "system", "content": system + SENTENCE}])) < CONTEXT_TOKENS - 20:
        system += SENTENCE
    return [
        encode_prompt(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": q}])
        for q in questions
    ]


def old_sample(model, tokenizer, prompts, *, num_samples: int, max_new_tokens: int) -> list[list[int]]:
    """The sampler as it was: every row's prompt prefilled in full; masked responses."""
    import torch

    from training.trainer.sampling import eos_ids, prefix_decode, response_mask_from_ids

    stop = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id
    response = prefix_decode(
        model,
        prompts,
        copies=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        eos_ids=stop,
        pad_id=pad,
        share_prefix=False,
    )
    mask, _ = response_mask_from_ids(response, stop)
    response = torch.where(mask.bool(), response, torch.full_like(response, pad))
    tokenizer.batch_decode(response, skip_special_tokens=True)
    return response.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=1, help="distinct prompts per call")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each path")
    args = parser.parse_args()

    import torch

    from scripts.gpu_check import SHAPES, build_model, build_tokenizer
    from training.trainer.sampling import sample

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = build_tokenizer(Path(folder))
    model = build_model(SHAPES["smollm2-135m"], tokenizer, torch.float32).eval()
    prompts = contexts(tokenizer, args.prompts)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"model: random SmolLM2-135M shape ({params:.1f}M parameters), fp32, 1 thread; "
        f"{args.prompts} prompt(s) of {', '.join(str(len(p)) for p in prompts)} tokens, "
        f"G={args.group}, {args.new_tokens} new tokens"
    )

    # CPU seconds of this process beside wall seconds: on a shared machine the wall clock
    # also counts the time other processes held the core.
    wall: dict[str, list[float]] = {"old": [], "new": []}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    tokens: dict[str, list[list[int]]] = {}
    options = {"num_samples": args.group, "max_new_tokens": args.new_tokens}
    for repeat in range(args.repeats):
        for name in ("old", "new"):
            torch.manual_seed(repeat)
            started, started_cpu = time.perf_counter(), time.process_time()
            if name == "old":
                got = old_sample(model, tokenizer, prompts, **options)
            else:
                got = sample(model, tokenizer, prompts, temperature=1.0, **options).response_ids.tolist()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - started_cpu)
            tokens[name] = got
        print(
            f"  run {repeat}: old {wall['old'][-1]:.2f} s ({cpu['old'][-1]:.2f} s CPU), "
            f"new {wall['new'][-1]:.2f} s ({cpu['new'][-1]:.2f} s CPU)"
        )
    for label, series in (("wall", wall), ("CPU", cpu)):
        old, new = statistics.median(series["old"]), statistics.median(series["new"])
        print(
            f"median {label} seconds: old (G prefills per prompt) {old:.2f}, new (one prefill) {new:.2f}, "
            f"ratio new/old {new / old:.3f} ({old / new:.1f}x faster)"
        )
    print(f"same tokens from the same seed: {tokens['old'] == tokens['new']}")


if __name__ == "__main__":
    main()
