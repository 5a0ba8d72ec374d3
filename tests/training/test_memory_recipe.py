"""The figures of docs/memory-recipe.md (bench/memory_recipe.py): the models it builds from
the public configs, the adapter a job puts on them, the FSDP2 layout, and its activation
formula against what autograd keeps and against a measured peak."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("memory_recipe", ROOT / "bench" / "memory_recipe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_recipe"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("memory_recipe", None)


@pytest.fixture(scope="module")
def counts(recipe):
    return {name: recipe.count(recipe.MODELS[name]) for name in ("Qwen2.5-0.5B", "Qwen2.5-7B")}


@pytest.mark.parametrize("name", ["Qwen2.5-0.5B", "Qwen2.5-7B"])
def test_the_models_are_the_published_sizes_with_the_jobs_adapter(recipe, counts, name):
    shape, c = recipe.MODELS[name], counts[name]
    assert abs(c.params / shape["published"] - 1) < 0.01  # model cards: 0.49B, 7.61B
    # The job defaults' adapter: rank r on q, k, v, o, gate, up and down of every layer
    # (r x (inputs + outputs) each), none on the output layer; fp32 over bf16 weights.
    h, i, kv = shape["hidden"], shape["intermediate"], shape["kv_heads"] * recipe.head_dim(shape)
    per_layer = c.lora_rank * (2 * h + 2 * (h + kv) + 2 * h + 2 * (h + i) + (i + h))
    assert (c.lora_rank, c.lora_target) == (16, "all-linear")
    assert c.lora == shape["layers"] * per_layer
    assert c.lora_bytes_each == 4
    assert c.base_bytes == 2 * c.params


def test_fsdp_needs_less_memory_per_gpu_the_more_gpus(recipe, counts):
    c = counts["Qwen2.5-7B"]
    static = [sum(recipe.static_per_gpu(c, n).values()) for n in (1, 2, 4, 8)]
    assert static == sorted(static, reverse=True)
    assert static[3] < static[0] / 2
    args = argparse.Namespace(seq=1024, response=256, mfu=0.35, headroom=0.1)
    rows = recipe.recipe("Qwen2.5-7B", recipe.MODELS["Qwen2.5-7B"], c, args)["per_gpu"]
    for key in rows[0]:
        if key.startswith("fit "):
            fits = [row[key] for row in rows]
            assert fits == sorted(fits), key  # more GPUs never fit a smaller micro-batch
    # The 7B trains on one 80 GB card without sharding, a few sequences at a time.
    assert rows[0]["fit grpo 80 GB"] >= 1


def test_the_activation_formula_is_what_autograd_keeps(recipe):
    """Every tensor saved for the backward pass of a tiny bf16 LoRA model, counted, equals
    the formula the recipe scales to the large models (a library change that keeps
    more or less fails here, and the documented figures with it)."""
    shape = {"hidden": 64, "intermediate": 176, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 512, "tied": True}
    # In a fresh interpreter: in a long test session the count once came out 2.6 % low
    # (a state the suite leaves behind, not reproduced alone).
    code = (
        "import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/bench']; import memory_recipe as r; "
        "print(json.dumps(r.measure_saved(json.loads(sys.argv[2]), batch=2, seq=32, scored=16)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), json.dumps(shape)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads(done.stdout.strip().splitlines()[-1])
    assert m["layer_per_token"] == pytest.approx(recipe.layer_saved_per_token(shape, 16, 32), rel=0.01)
    rest = recipe.shared_saved(shape, 32) + recipe.head_saved(shape, 32, 16)
    assert m["shared_per_sequence"] + m["head_per_sequence"] == pytest.approx(rest, rel=0.01)
    assert m["kv_per_token"] == recipe.kv_cache_per_token(shape)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak RSS from /proc")
def test_the_formula_predicts_a_measured_peak(recipe):
    """A whole forward/backward of the small model (logits dominate), peak RSS in a process
    of its own: the formula within 10 % without checkpointing, and an upper bound (within
    1.5x) with it. Measured 1.00 and 1.00 when written."""
    runs = recipe.measure_peak(recipe.SMALL, batch=8, seq=256, scored=255)
    for mode, m in runs.items():
        if not m["valid"]:
            pytest.skip("the peak RSS could not be started over (/proc/self/clear_refs)")
        ratio = 8 * recipe.peak_per_sequence(recipe.SMALL, 16, 256, 255, checkpointing=mode == "checkpointing")
        ratio /= m["measured"]
        assert (0.9 < ratio < 1.1) if mode == "no checkpointing" else (0.95 < ratio < 1.5), (mode, ratio)
