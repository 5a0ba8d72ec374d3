"""What the trainer learns from when a vLLM server samples for it: the exact ids the server
drew, each token's policy term weighed by how far the server's distribution was from the
trainer's (the regex, the numerics), and in-job evaluations sampled the way the policy is
served. Against the real vLLM CPU server of the test session."""

from __future__ import annotations

import re

import pytest
import torch

from training.trainer import loss as L
from training.trainer.common import PromptCache, evaluate
from training.trainer.config import GRPOConfig
from training.trainer.grpo import grpo_train
from training.trainer.items import TurnItem
from training.trainer.logprobs import token_logprobs
from training.trainer.policy import load_policy
from training.trainer.vllm_rollout import VllmRollouts

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# The random tiny model never writes this on its own: an answer that obeys it was constrained.
ANSWER = r"(yes|no) [0-9]{2}"


def config_for(vllm_server, **overrides) -> GRPOConfig:
    values = {
        "model_path": str(vllm_server.model_path),
        "steps": 1,
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 8,
        "eval_every": 0,
        "checkpoint_every": 0,
        "samples_every": 0,
        "log_kl": False,
        "rollout": "vllm",
        "vllm_url": f"{vllm_server.url}/v1",
    }
    return GRPOConfig(**(values | overrides))


def items(n: int, prefix: str = "q") -> list[TurnItem]:
    return [
        TurnItem(id=f"{prefix}{i}", messages=[{"role": "user", "content": f"Is order A{i} late?"}]) for i in range(n)
    ]


def weights_of(policy, rollout, config):
    mask = rollout.response_mask.float()
    with torch.no_grad():
        trainer = token_logprobs(
            policy.model, rollout.input_ids, rollout.attention_mask, keep=mask.shape[1], temperature=config.temperature
        )
    weights, stats = L.sampling_correction(trainer, rollout.sampler_logprobs, mask, cap=config.sampling_correction_cap)
    return trainer, weights, mask, stats


def test_the_weights_are_the_truncated_ratio_near_one_unconstrained_and_lower_where_the_regex_forced(
    vllm_server, tmp_path
):
    # Temperature 0.7 and top-p 1: only the server's processed log-probs (after temperature)
    # agree with the trainer's; raw ones would put every weight far from 1.
    free = config_for(vllm_server, temperature=0.7)
    constrained = config_for(vllm_server, temperature=0.7, structured_outputs={"regex": ANSWER})
    policy = load_policy(free)
    server = VllmRollouts(
        base_url=free.vllm_url, run_dir=tmp_path, api_key=vllm_server.api_key, name_prefix=f"{tmp_path.name}-"
    )
    prompts = PromptCache(policy.tokenizer)
    prompt_ids = [prompts.get(it) for it in items(2)]

    rollout = server.sample(policy, prompt_ids, step=1, config=free, num_samples=4)
    trainer, weights, mask, stats = weights_of(policy, rollout, free)
    on = mask.bool()
    expected = torch.exp(trainer - rollout.sampler_logprobs).clamp(max=free.sampling_correction_cap)
    assert torch.allclose(weights[on], expected[on])
    assert (weights[on] - 1).abs().max() < 1e-3, "same weights, no constraint: the server sampled from the policy"
    assert stats["sampling_truncated_share"] == 0.0

    rollout = server.sample(policy, prompt_ids, step=2, config=constrained, num_samples=4)
    assert all(re.fullmatch(ANSWER, t) for t in rollout.texts), rollout.texts
    trainer, weights, mask, stats = weights_of(policy, rollout, constrained)
    on = mask.bool()
    expected = torch.exp(trainer - rollout.sampler_logprobs).clamp(max=constrained.sampling_correction_cap)
    assert torch.allclose(weights[on], expected[on])
    # The regex only removes choices, so the server's q ≥ the policy's p on every token;
    # where it left one token (q = 1) the weight is the policy's own probability of it.
    assert (weights[on] <= 1 + 1e-3).all()
    forced = on & (rollout.sampler_logprobs > -1e-6)
    assert forced.any()
    assert torch.allclose(weights[forced], trainer[forced].exp(), atol=1e-4)
    assert (weights[forced] < 0.5).all()  # a random model rarely picks what the regex demanded
    assert stats["sampling_weight_mean"] < 0.9


def test_grpo_logs_the_correction_and_its_in_job_evaluation_is_served_under_the_regex(vllm_server, tmp_path):
    config = config_for(
        vllm_server, eval_every=1, eval_samples=2, learning_rate=1e-3, structured_outputs={"regex": ANSWER}
    )
    seen: dict[str, list[str]] = {"train": [], "eval": []}

    def score(item, candidates):
        seen["eval" if item.id.startswith("e") else "train"].extend(candidates)
        return [1.0] + [0.0] * (len(candidates) - 1)  # every group has a signal

    result = grpo_train(
        config=config,
        items=items(2),
        eval_items=items(3, prefix="e"),
        score=score,
        run_dir=tmp_path,
        export=False,
        vllm_api_key=vllm_server.api_key,
    )
    assert result.step == 1 and [e["step"] for e in result.evals] == [0, 1]
    assert len(seen["eval"]) == 2 * 3 * 2  # two evaluations, three items, two samples each
    assert all(re.fullmatch(ANSWER, t) for t in seen["eval"]), seen["eval"]
    metrics = result.history[0]
    assert metrics["trained_sequences"] == 8
    assert 0 < metrics["sampling_weight_mean"] < 0.9  # the regex forced what the policy would not say
    assert metrics["sampling_truncated_share"] == 0.0


def test_two_evaluations_of_one_model_through_the_server_agree(vllm_server, tmp_path):
    config = config_for(vllm_server, eval_samples=3, structured_outputs={"regex": ANSWER})
    policy = load_policy(config)
    server = VllmRollouts(
        base_url=config.vllm_url, run_dir=tmp_path, api_key=vllm_server.api_key, name_prefix=f"{tmp_path.name}-"
    )
    server.load(policy, step="eval-0")
    prompts = PromptCache(policy.tokenizer)
    runs = []
    for _ in range(2):
        texts: list[str] = []

        def score(item, candidates, texts=texts):
            texts.extend(candidates)
            return [float(c.startswith("yes")) for c in candidates]

        metrics = evaluate(policy, items(4, prefix="e"), score, config=config, prompts=prompts, batch=6, server=server)
        runs.append((metrics, texts))
    assert runs[0] == runs[1]
    assert len(set(runs[0][1])) > 1  # seeded per sample, not one seed for all
