"""A few steps of every training path on the tiny model: parameters change, the loss
stays finite, checkpoints resume where they stopped, a stop request is honoured."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.fixtures.configs import small
from training.trainer.common import Hooks
from training.trainer.config import ConfigError, DistillConfig, GRPOConfig, SFTConfig, config_from_dict
from training.trainer.distill import distill_train, sft_train
from training.trainer.grpo import grpo_train
from training.trainer.items import TurnItem
from training.trainer.policy import latest_checkpoint

ITEMS = [
    TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"refund order A{i} please"}], feedback="Say sorry.")
    for i in range(6)
]


def parity_score(item, candidates):
    # Any reward that varies within a group works for the mechanics.
    return [float(len(c) % 2) for c in candidates]


def trainable_snapshot(policy):
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("adapter", ["lora", "full"])
def test_grpo_changes_parameters_and_keeps_the_loss_finite(tiny_model_dir, tmp_path, adapter):
    from training.trainer.policy import load_policy

    config = small(GRPOConfig, tiny_model_dir, adapter=adapter, group_size=4, beta=0.01)
    policy = load_policy(config, reference=True)
    before = trainable_snapshot(policy)
    steps: list[dict] = []
    result = grpo_train(
        config=config,
        items=ITEMS,
        score=parity_score,
        run_dir=tmp_path,
        policy=policy,
        hooks=Hooks(on_step=lambda s, m: steps.append(m)),
    )
    assert result.status == "finished" and result.step == 3
    assert all(math.isfinite(m["loss"]) and m["kl"] is not None and m["kl"] >= 0 for m in steps)
    assert any(m["trained_sequences"] > 0 for m in steps)
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed
    assert (result.export_path / ("adapter_config.json" if adapter == "lora" else "config.json")).exists()


def test_grpo_resumes_from_its_checkpoint_exactly(tiny_model_dir, tmp_path):
    full = small(GRPOConfig, tiny_model_dir, steps=4, group_size=4, checkpoint_every=2)
    straight = grpo_train(config=full, items=ITEMS, score=parity_score, run_dir=tmp_path / "a", export=False)

    # The same job stopped after step 2 (as a cancel does), then started again.
    calls = {"n": 0}

    def stop_after_two():
        calls["n"] += 1
        return calls["n"] > 2

    first = grpo_train(
        config=full,
        items=ITEMS,
        score=parity_score,
        run_dir=tmp_path / "b",
        hooks=Hooks(should_stop=stop_after_two),
    )
    assert first.status == "cancelled" and first.step == 2 and first.export_path is None
    assert latest_checkpoint(tmp_path / "b").name == "step-000002"
    saved = json.loads((latest_checkpoint(tmp_path / "b") / "trainer_state.json").read_text())
    assert saved["config"]["kind"] == "grpo" and saved["config"]["group_size"] == 4
    resumed = grpo_train(config=full, items=ITEMS, score=parity_score, run_dir=tmp_path / "b", export=False)
    assert resumed.step == 4 and len(resumed.history) == 4
    # Same batches, same samples, same rewards as the uninterrupted run.
    assert [m["reward_mean"] for m in resumed.history] == [m["reward_mean"] for m in straight.history]
    assert resumed.history[-1]["loss"] == pytest.approx(straight.history[-1]["loss"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("normaliser", ["constant", "sequence"])
def test_the_kl_penalty_enters_the_turn_level_loss_per_token(tiny_model_dir, tmp_path, monkeypatch, normaliser):
    """β·k3 goes inside the per-token loss, before the policy term's normaliser (as in
    TRL and the episode loop), not as a token-mean KL added to a differently normalised
    loss: the loss the loop steps on is exactly `policy_loss` with the reference."""
    from training.trainer import loss as L

    real = L.policy_loss
    calls: list[tuple[dict, float]] = []

    def spy(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls.append((kwargs, float(loss.detach())))
        return loss, stats

    monkeypatch.setattr(L, "policy_loss", spy)
    config = small(
        GRPOConfig, tiny_model_dir, steps=2, group_size=4, beta=0.05, normaliser=normaliser, drop_zero_variance=False
    )
    steps: list[dict] = []
    grpo_train(
        config=config,
        items=ITEMS,
        score=parity_score,
        run_dir=tmp_path,
        hooks=Hooks(on_step=lambda s, m: steps.append(m)),
        export=False,
    )
    assert len(calls) == len(steps) == 2
    for (kwargs, value), metrics in zip(calls, steps, strict=True):
        assert kwargs.get("beta") == 0.05 and kwargs.get("ref_logprobs") is not None
        assert metrics["loss"] == pytest.approx(value, rel=1e-6, abs=1e-9)
    assert steps[1]["kl"] > 0  # the second step's policy has moved: the penalty is not 0


def test_equal_rewards_mean_no_update(tiny_model_dir, tmp_path):
    from training.trainer.policy import load_policy

    config = small(GRPOConfig, tiny_model_dir, steps=2, group_size=4, log_kl=False)
    policy = load_policy(config)
    before = trainable_snapshot(policy)
    result = grpo_train(
        config=config, items=ITEMS, score=lambda i, c: [1.0] * len(c), run_dir=tmp_path, policy=policy, export=False
    )
    assert [m["zero_variance_share"] for m in result.history] == [1.0, 1.0]
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def nan_score(item, candidates):
    return [float("nan")] * len(candidates)


def nan_scaled(fn):
    """`fn` with its loss times NaN: a non-finite loss that still has a gradient."""

    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, tuple):
            return out[0] * float("nan"), *out[1:]
        return out * float("nan")

    return wrapped


@pytest.mark.parametrize("loop", ["grpo", "grpo-micro-batched", "grpo-nan-reward", "distill", "sft"])
def test_a_non_finite_loss_stops_the_job_before_the_weights_move(tiny_model_dir, tmp_path, monkeypatch, loop):
    from training.trainer import loss as L
    from training.trainer.policy import load_policy

    score = parity_score
    if loop == "grpo-nan-reward":  # a scorer's NaN, kept by drop_zero_variance=False
        config = small(GRPOConfig, tiny_model_dir, group_size=4, drop_zero_variance=False)
        score = nan_score
    elif loop.startswith("grpo"):
        micro_batch = 3 if loop == "grpo-micro-batched" else 0  # accumulated, then checked before the step
        config = small(
            GRPOConfig, tiny_model_dir, group_size=4, beta=0.01, drop_zero_variance=False, micro_batch=micro_batch
        )
        monkeypatch.setattr(L, "policy_loss", nan_scaled(L.policy_loss))
    elif loop == "distill":
        config = small(DistillConfig, tiny_model_dir, samples_per_prompt=2)
        monkeypatch.setattr(L, "distill_kl", nan_scaled(L.distill_kl))
    else:
        config = small(SFTConfig, tiny_model_dir)
        monkeypatch.setattr(L, "sft_loss", nan_scaled(L.sft_loss))
    policy = load_policy(config, reference=True)
    before = trainable_snapshot(policy)
    items = [TurnItem(id=it.id, messages=it.messages, feedback=it.feedback, target="Sorry.") for it in ITEMS]
    with pytest.raises(FloatingPointError, match="loss became nan at step 1"):
        if loop.startswith("grpo"):
            grpo_train(config=config, items=items, score=score, run_dir=tmp_path, policy=policy, export=False)
        elif loop == "distill":
            distill_train(config=config, items=items, run_dir=tmp_path, policy=policy, export=False)
        else:
            sft_train(config=config, items=items, run_dir=tmp_path, policy=policy, export=False)
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def nan_gradient(policy) -> None:
    """Turn the gradient of one trained weight into NaN while the loss stays finite (what an
    overflow inside the backward pass does)."""
    weight = next(p for p in policy.model.parameters() if p.requires_grad)
    weight.register_hook(lambda grad: grad * float("nan"))


@pytest.mark.parametrize("loop", ["grpo", "distill", "sft"])
def test_a_non_finite_gradient_stops_the_job_before_the_weights_move(tiny_model_dir, tmp_path, loop):
    from training.trainer.policy import load_policy

    if loop == "grpo":
        config = small(GRPOConfig, tiny_model_dir, group_size=4, drop_zero_variance=False)
    elif loop == "distill":
        config = small(DistillConfig, tiny_model_dir, samples_per_prompt=2)
    else:
        config = small(SFTConfig, tiny_model_dir)
    policy = load_policy(config, reference=True)
    nan_gradient(policy)
    before = trainable_snapshot(policy)
    items = [TurnItem(id=it.id, messages=it.messages, feedback=it.feedback, target="Sorry.") for it in ITEMS]
    steps: list[int] = []
    with pytest.raises(FloatingPointError, match="gradient norm became nan at step 1, before the weights"):
        if loop == "grpo":
            grpo_train(
                config=config,
                items=items,
                score=parity_score,
                run_dir=tmp_path,
                policy=policy,
                export=False,
                hooks=Hooks(on_step=lambda step, m: steps.append(step)),
            )
        elif loop == "distill":
            distill_train(
                config=config,
                items=items,
                run_dir=tmp_path,
                policy=policy,
                export=False,
                hooks=Hooks(on_step=lambda step, m: steps.append(step)),
            )
        else:
            sft_train(
                config=config,
                items=items,
                run_dir=tmp_path,
                policy=policy,
                export=False,
                hooks=Hooks(on_step=lambda step, m: steps.append(step)),
            )
    assert steps == []  # no step was reported as done
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def test_a_monitor_breach_flags_and_can_stop_the_job(tiny_model_dir, tmp_path):
    config = small(GRPOConfig, tiny_model_dir, steps=3, group_size=2, max_new_tokens=2)
    config.monitors.max_truncated_share = 0.0  # 2 new tokens: most answers are cut
    config.monitors.stop_on_breach = True
    flagged: list = []
    result = grpo_train(
        config=config,
        items=ITEMS,
        score=parity_score,
        run_dir=tmp_path,
        hooks=Hooks(on_breach=lambda s, b: flagged.extend(b)),
        export=False,
    )
    assert result.status == "stopped" and result.step == 1
    assert flagged[0]["monitor"] == "truncated"


def test_self_distillation_and_sft_change_parameters(tiny_model_dir, tmp_path):
    from training.trainer.policy import load_policy

    config = small(DistillConfig, tiny_model_dir, samples_per_prompt=2)
    policy = load_policy(config)
    before = trainable_snapshot(policy)
    result = distill_train(config=config, items=ITEMS, run_dir=tmp_path / "d", policy=policy)
    assert all(math.isfinite(m["loss"]) and m["loss"] >= 0 for m in result.history)
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)

    sft_items = [TurnItem(id=it.id, messages=it.messages, target="Sorry, refunded.") for it in ITEMS]
    config = small(SFTConfig, tiny_model_dir, steps=6, learning_rate=1e-2)
    result = sft_train(config=config, items=sft_items, run_dir=tmp_path / "s")
    losses = [m["loss"] for m in result.history]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_config_round_trips_through_json_and_rejects_bad_fields(tiny_model_dir):
    config = small(GRPOConfig, tiny_model_dir, beta=0.02)
    again = config_from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "group_sise": 8})
    assert err.value.errors == [("group_sise", "unknown field")]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "group_size": 1, "model_path": "x"})
    assert err.value.errors[0][0] == "group_size"
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "steps": "ten"})
    assert err.value.errors == [("steps", "must be int")]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "sampling_correction_cap": 0.5})
    assert err.value.errors == [
        ("sampling_correction_cap", "must be between 1 and 100 (a cap below 1 shrinks every token)")
    ]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "sampling_correction": "yes"})
    assert err.value.errors == [("sampling_correction", "must be bool")]
    # The distillation teacher's hint follows the same rule as hinted GRPO's: a template that
    # would fail mid-job, or never show the comment, is refused when the job is made.
    for template in ("{feedback} and {other}", "Note: {{feedback}}", "{feedback:>999999999}"):
        with pytest.raises(ConfigError) as err:
            config_from_dict({"kind": "distill", "hint_template": template})
        assert [field for field, _ in err.value.errors] == ["hint_template"]


def test_a_monitor_that_keeps_firing_is_reported_once(tiny_model_dir, tmp_path):
    config = small(GRPOConfig, tiny_model_dir, steps=3, group_size=2, max_new_tokens=2, log_kl=False)
    config.monitors.max_truncated_share = 0.0
    flagged: list = []
    result = grpo_train(
        config=config,
        items=ITEMS,
        score=parity_score,
        run_dir=tmp_path,
        hooks=Hooks(on_breach=lambda s, b: flagged.extend(b)),
        export=False,
    )
    assert result.status == "finished" and result.step == 3
    assert [b["monitor"] for b in flagged] == ["truncated"] and flagged[0]["step"] == 1


def test_lora_with_trainable_layers_puts_adapters_on_the_top_blocks_only(tiny_model_dir):
    from training.trainer.config import GRPOConfig
    from training.trainer.policy import load_policy

    config = GRPOConfig(model_path=str(tiny_model_dir), adapter="lora", trainable_layers=1, lora_rank=4)
    policy = load_policy(config)
    blocks = len(policy.model.base_model.model.model.layers)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {int(n.split(".layers.")[1].split(".")[0]) for n in trainable} == {blocks - 1}


def grads_of(policy) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("normaliser", ["constant", "token", "sequence"])
@pytest.mark.parametrize("weights_from", ["old-logprobs", "this-pass"])
def test_a_micro_batched_update_accumulates_the_single_pass_gradient(tiny_model_dir, normaliser, weights_from):
    """Micro-batches of 3, 3 and 2 rows, with β > 0, old log-probs (PPO-clip), sampling
    weights and the reference's log-probs sliced with the rows: the accumulated gradient,
    loss, KL and clip fraction are those of one pass over the 8 rows."""
    from training.trainer.common import micro_batches
    from training.trainer.grpo import chunked_logprobs, turn_loss_backward
    from training.trainer.policy import load_policy
    from training.trainer.sampling import sample

    config = small(
        GRPOConfig, tiny_model_dir, adapter="full", group_size=4, beta=0.1, normaliser=normaliser, temperature=1.0
    )
    policy = load_policy(config, reference=True)
    with torch.no_grad():  # move the policy away from its reference, so k3 > 0
        for param in policy.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    prompts = [policy.tokenizer(f"refund order A{i}")["input_ids"] for i in range(2)]
    rollout = sample(policy.model, policy.tokenizer, prompts, num_samples=4, max_new_tokens=6)
    ids, attn, mask = rollout.input_ids, rollout.attention_mask, rollout.response_mask.float()
    # Rows trained on different numbers of tokens, which tell the normalisers apart (the
    # random model rarely ends an answer early on its own).
    lengths = torch.tensor([6, 2, 4, 1, 5, 3, 6, 2]).unsqueeze(1)
    mask = mask * (torch.arange(mask.shape[1]) < lengths)
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75, 0.5, -1.0, 1.5, -1.0])
    width = mask.shape[1]
    with torch.no_grad(), policy.as_reference() as reference:
        ref = chunked_logprobs(reference, ids, attn, [slice(0, 8)], keep=width, config=config)
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(mask.shape, generator=generator)
    options: dict = {"ref_logprobs": ref, "config": config, "constant": 8 * config.max_new_tokens}
    if weights_from == "old-logprobs":
        with torch.no_grad():
            current = chunked_logprobs(policy.model, ids, attn, [slice(0, 8)], keep=width, config=config)
        options["old_logprobs"] = current + 0.3 * noise  # ratios beyond 1 ± 0.28: clipping acts
        options["sampling_weights"] = (0.5 + torch.rand(mask.shape, generator=generator)) * mask
    else:
        options["sampler_logprobs"] = ref + 0.2 * noise

    runs = []
    for chunks in ([slice(0, 8)], micro_batches(8, 3)):
        policy.model.zero_grad(set_to_none=True)
        out = turn_loss_backward(policy.model, ids, attn, mask, adv, chunks=chunks, **options)
        runs.append((out, grads_of(policy)))
    (single, single_grads), (micro, micro_grads) = runs
    assert micro_batches(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    assert single_grads.keys() == micro_grads.keys() and single_grads
    for name, grad in single_grads.items():
        # A micro-batch whose rows share a prompt takes it through once (`shared_prompt_logprobs`)
        # where the whole batch may not: the same sums in another order, float32 rounding at
        # a millionth of the gradient's scale.
        assert torch.allclose(micro_grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max())), name
    assert micro["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert micro["kl"] == pytest.approx(single["kl"], rel=1e-5) and single["kl"] > 0
    if weights_from == "old-logprobs":
        assert micro["clip_fraction"] == pytest.approx(single["clip_fraction"]) and single["clip_fraction"] > 0
    else:
        assert (
            single["correction"].keys()
            == micro["correction"].keys()
            == {
                "sampling_weight_mean",
                "sampling_truncated_share",
                "sampler_logprob_gap",
            }
        )
        for name, value in single["correction"].items():
            assert micro["correction"][name] == pytest.approx(value, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("normaliser", ["token", "sequence"])
def test_a_micro_batched_job_reaches_the_weights_of_a_single_pass_job(tiny_model_dir, tmp_path, normaliser):
    from training.trainer.policy import load_policy

    finals, histories = [], []
    for micro_batch in (0, 3):
        config = small(
            GRPOConfig,
            tiny_model_dir,
            adapter="full",
            steps=1,
            group_size=4,
            beta=0.1,
            normaliser=normaliser,
            micro_batch=micro_batch,
            drop_zero_variance=False,
        )
        policy = load_policy(config, reference=True)
        before = trainable_snapshot(policy)
        result = grpo_train(
            config=config,
            items=ITEMS,
            score=parity_score,
            run_dir=tmp_path / str(micro_batch),
            policy=policy,
            export=False,
        )
        finals.append(trainable_snapshot(policy))
        histories.append(result.history[0])
    assert any(not torch.equal(finals[0][n], before[n]) for n in before)
    # Adam's first step is about lr·sign(g): where a gradient is near 0, float noise
    # between the two summation orders moves a weight by a little; a wrong scale of one
    # micro-batch would flip signs and move weights by up to 2·lr.
    for name, weight in finals[0].items():
        assert torch.allclose(finals[1][name], weight, atol=config.learning_rate / 100, rtol=0), name
    for key in ("loss", "kl", "grad_norm"):
        assert histories[1][key] == pytest.approx(histories[0][key], rel=1e-4, abs=1e-7)
    assert histories[0]["trained_sequences"] == histories[1]["trained_sequences"] == 8


def test_micro_batch_is_validated(tiny_model_dir):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", "micro_batch": -1})
    assert err.value.errors == [("micro_batch", "must be ≥ 0 (0 = the whole batch in one pass)")]
    assert config_from_dict({"kind": "grpo", "micro_batch": 4}).micro_batch == 4
