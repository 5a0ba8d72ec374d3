"""The reference of a job (its KL anchor, and the frozen self-distillation teacher) is the
version the job started from: the base model for a fresh adapter, base + adapter for a job
continued from a LoRA version."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.adapters import random_adapter_make
from tests.fixtures.configs import small
from training.trainer.common import Hooks
from training.trainer.config import GRPOConfig
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


@pytest.mark.parametrize(("log_kl", "reference_passes"), [(False, 0), (True, 2)])
def test_beta_zero_runs_the_reference_only_to_log_the_kl(tiny_model_dir, tmp_path, log_kl, reference_passes):
    """With β = 0 the reference is needed only for the logged KL: with `log_kl` off the
    turn-level loop runs no reference forward pass at all and logs no KL; with it on (the
    default, so drift is always visible) one pass per step."""
    assert GRPOConfig().log_kl is True
    config = config_for(tiny_model_dir, adapter="full", steps=2, beta=0.0, log_kl=log_kl, drop_zero_variance=False)
    policy = load_policy(config, reference=True)
    passes: list[int] = []
    policy.reference.register_forward_hook(lambda *_: passes.append(1))
    steps: list[dict] = []
    grpo_train(
        config=config,
        items=ITEMS,
        score=lambda item, candidates: [float(len(c) % 2) for c in candidates],
        run_dir=tmp_path,
        policy=policy,
        hooks=Hooks(on_step=lambda s, m: steps.append(m)),
        export=False,
    )
    assert len(steps) == 2 and all(m["trained_sequences"] > 0 for m in steps)
    assert len(passes) == reference_passes
    assert all((m["kl"] is None) == (not log_kl) for m in steps)
