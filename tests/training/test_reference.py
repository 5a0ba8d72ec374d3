"""The reference of a job (its KL anchor, and the frozen self-distillation teacher) is the
version the job started from: the base model for a fresh adapter, base + adapter for a job
continued from a LoRA version."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.fixtures.adapters import random_adapter_make
from tests.fixtures.configs import small
from training.trainer.common import Hooks
from training.trainer.config import GRPOConfig, MonitorConfig
from training.trainer.grpo import grpo_train
from training.trainer.items import TurnItem
from training.trainer.policy import load_policy, make_optimizer

ITEMS = [TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"refund order A{i} please"}]) for i in range(4)]
IDS = torch.tensor([[5, 17, 33, 41, 9, 60, 2, 71]])


@pytest.fixture(scope="module")
def start_adapter(tiny_model_dir, tmp_path_factory):
    return random_adapter_make(tiny_model_dir, tmp_path_factory.mktemp("adapters") / "start")


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def config_for(model_dir, **kw) -> GRPOConfig:
    return small(GRPOConfig, model_dir, **({"steps": 1, "group_size": 4, "device": "cpu"} | kw))


def test_the_reference_of_a_job_continued_from_a_lora_version_is_that_version_and_stays_frozen(
    tiny_model_dir, start_adapter
):
    base = load_policy(config_for(tiny_model_dir, adapter="full"))
    policy = load_policy(config_for(tiny_model_dir, init_adapter=str(start_adapter)), reference=True)
    start = logits_of(policy.model)
    assert not torch.allclose(start, logits_of(base.model), atol=1e-3)  # the adapter matters
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    with policy.as_reference() as reference:
        assert torch.equal(logits_of(reference), start)
    assert [n for n, p in policy.model.named_parameters() if p.requires_grad] == trainable
    assert policy.model.training

    # A step moves the trained adapter; the reference stays the starting version.
    optimizer = make_optimizer(policy, config_for(tiny_model_dir))
    policy.model(input_ids=IDS).logits.pow(2).mean().backward()
    optimizer.step()
    assert not torch.allclose(logits_of(policy.model), start, atol=1e-4)
    with policy.as_reference() as reference:
        assert torch.equal(logits_of(reference), start)


def test_a_fresh_adapter_keeps_the_base_model_as_its_reference(tiny_model_dir):
    base = load_policy(config_for(tiny_model_dir, adapter="full"))
    policy = load_policy(config_for(tiny_model_dir), reference=True)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    with policy.as_reference() as reference:
        assert torch.allclose(logits_of(reference), logits_of(base.model), atol=1e-6)


def test_a_grpo_job_continued_from_a_lora_version_starts_at_zero_kl(tiny_model_dir, start_adapter, tmp_path):
    config = config_for(tiny_model_dir, init_adapter=str(start_adapter), beta=0.05, steps=2, drop_zero_variance=False)
    steps: list[dict] = []
    result = grpo_train(
        config=config,
        items=ITEMS,
        score=lambda item, candidates: [float(len(c) % 2) for c in candidates],
        run_dir=tmp_path,
        hooks=Hooks(on_step=lambda s, m: steps.append(m)),
    )
    # Step 1's log-probs are those of the starting version itself: KL(π ‖ π_start) = 0.
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert steps[1]["kl"] > 0
    # The export is the trained adapter alone, servable as it is (no frozen copy inside).
    assert (result.export_path / "adapter_config.json").exists()
    assert not (result.export_path / "reference").exists()


def test_a_reference_is_refused_when_the_starting_adapter_was_not_kept(tiny_model_dir, start_adapter):
    policy = load_policy(config_for(tiny_model_dir, init_adapter=str(start_adapter)))
    with pytest.raises(RuntimeError, match="frozen copy"), policy.as_reference():
        pass


@pytest.mark.parametrize(
    ("settings", "due"),
    [
        ({"log_kl": False}, []),
        ({}, [4]),  # β = 0 and no evaluation: the last step alone
        ({"eval_every": 2}, [2, 4]),
        ({"eval_every": 3}, [3, 4]),
        ({"beta": 0.05}, [1, 2, 3, 4]),
        ({"monitors": MonitorConfig(kl_budget=10.0)}, [1, 2, 3, 4]),
    ],
)
def test_the_reference_runs_only_at_the_steps_that_need_it(tiny_model_dir, tmp_path, settings, due):
    """With β = 0 (the default) the reference's pass only measures the logged KL: it runs at
    the steps that evaluate and the last one, and the other steps log no KL. With β > 0 the
    penalty needs it, and a KL budget's monitor reads it, at every step."""
    assert GRPOConfig().log_kl is True and GRPOConfig().beta == 0.0
    config = config_for(tiny_model_dir, adapter="full", steps=4, drop_zero_variance=False, **settings)
    policy = load_policy(config, reference=True)
    steps: list[dict] = []
    # The step of each of the reference's forward calls (on_step comes after it): one pass
    # is one call, or two when a group's prompt goes through once (`shared_prompt_logprobs`).
    passes: list[int] = []
    policy.reference.register_forward_hook(lambda *_: passes.append(len(steps) + 1))
    grpo_train(
        config=config,
        items=ITEMS,
        score=lambda item, candidates: [float(len(c) % 2) for c in candidates],
        run_dir=tmp_path,
        policy=policy,
        hooks=Hooks(on_step=lambda s, m: steps.append(m)),
        export=False,
    )
    assert len(steps) == 4 and all(m["trained_sequences"] > 0 for m in steps)
    assert sorted(set(passes)) == due
    assert all(passes.count(step) in (1, 2) for step in due)
    assert [m["step"] for m in steps if m["kl"] is not None] == due
    assert all(m["kl"] >= 0 for m in steps if m["kl"] is not None)


def test_reference_due_names_the_steps_of_each_setting():
    plain = GRPOConfig(steps=25)  # eval_every 10
    assert [n for n in range(1, 26) if plain.reference_due(n)] == [10, 20, 25]
    assert [n for n in range(1, 6) if GRPOConfig(steps=5, eval_every=0).reference_due(n)] == [5]
    assert not any(GRPOConfig(steps=25, log_kl=False).reference_due(n) for n in range(1, 26))
    assert all(GRPOConfig(steps=25, beta=0.01, log_kl=False).reference_due(n) for n in range(1, 26))
    budget = GRPOConfig(steps=25, monitors=MonitorConfig(kl_budget=0.1))
    assert all(budget.reference_due(n) for n in range(1, 26))
    # Without `log_kl` the reference is not even loaded: a budget has no KL to read.
    assert not any(dataclasses.replace(budget, log_kl=False).reference_due(n) for n in range(1, 26))


def test_with_beta_each_step_logs_the_loss_and_kl_of_a_hand_computation(tiny_model_dir, tmp_path, monkeypatch):
    """β > 0 (the reference every step): each update's loss and KL are those of
    l = -A + β·k3 per token, k3 = exp(r) - r - 1, r = log π_start - log π, summed over the
    response tokens / (prompts · G · max_new_tokens), and KL = the token mean of k3, with
    π the policy before the update and π_start a copy of the starting model loaded apart."""
    from training.trainer import grpo
    from training.trainer.logprobs import token_logprobs

    beta = 0.05
    config = config_for(tiny_model_dir, adapter="full", steps=2, beta=beta, drop_zero_variance=False)
    start = load_policy(config).model
    policy = load_policy(config, reference=True)
    updates: list[tuple] = []
    real = grpo.turn_update

    def spy(trainer, rollout, advantages, rows, **kw):
        before = copy.deepcopy(trainer.policy.model)  # the policy the update's forward pass sees
        out = real(trainer, rollout, advantages, rows, **kw)
        updates.append((before, rollout, advantages, rows, out))
        return out

    monkeypatch.setattr(grpo, "turn_update", spy)
    grpo_train(
        config=config,
        items=ITEMS,
        score=lambda item, candidates: [float(len(c) % 2) for c in candidates],
        run_dir=tmp_path,
        policy=policy,
        export=False,
    )
    assert len(updates) == 2
    constant = config.prompts_per_step * config.group_size * config.max_new_tokens
    for before, rollout, advantages, rows, out in updates:
        ids, attn = rollout.input_ids[rows], rollout.attention_mask[rows]
        mask = rollout.response_mask[rows].float()  # (B, T)
        with torch.no_grad():
            logp = token_logprobs(before, ids, attn, keep=mask.shape[1], temperature=config.temperature)
            ref = token_logprobs(start, ids, attn, keep=mask.shape[1], temperature=config.temperature)
        r = ref - logp
        k3 = torch.exp(r) - r - 1  # (B, T)
        adv = advantages.view(-1)[rows].unsqueeze(1)  # (B, 1)
        assert out["kl"] == pytest.approx(float((k3 * mask).sum() / mask.sum()), rel=1e-4, abs=1e-7)
        assert out["loss"] == pytest.approx(float(((-adv + beta * k3) * mask).sum()) / constant, rel=1e-4, abs=1e-7)
    assert updates[0][4]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first update starts at π_start
    assert updates[1][4]["kl"] > 0
