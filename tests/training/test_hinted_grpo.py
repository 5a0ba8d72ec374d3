"""Hinted GRPO on the tiny model: a group where every sample fails gives plain GRPO no
gradient; with the operator's comment as a hint, the hinted samples give one, and it
raises the student's own probability of the hinted sample that succeeded."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.configs import small
from training.trainer import grpo
from training.trainer.config import ConfigError, EpisodesConfig, GRPOConfig, config_from_dict
from training.trainer.grpo import grpo_train
from training.trainer.hints import hint_messages
from training.trainer.items import TurnItem
from training.trainer.logprobs import token_logprobs
from training.trainer.run import Trainer
from training.trainer.sampling import encode_prompt

GROUP, HINTS = 4, 2
COMMENT = "Apologise first, then give the tracking number."


def items(feedback: str = COMMENT) -> list[TurnItem]:
    return [
        TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"where is order A{i}?"}], feedback=feedback)
        for i in range(4)
    ]


def all_fail_but_the_first_hinted(item, candidates):
    # The plain group (G samples) all fail; of the hinted ones (K), the first succeeds.
    if len(candidates) == GROUP:
        return [0.0] * GROUP
    return [1.0] + [0.0] * (len(candidates) - 1)


def trainable(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def config(tiny_model_dir, **kw) -> GRPOConfig:
    return small(GRPOConfig, tiny_model_dir, steps=1, prompts_per_step=1, group_size=GROUP, log_kl=False, **kw)


@pytest.mark.parametrize("feedback", [COMMENT, ""])
def test_an_all_fail_group_gives_plain_grpo_no_gradient(tiny_model_dir, tmp_path, feedback):
    from training.trainer.policy import load_policy

    # Plain GRPO on a set with comments, and hinted GRPO on a set without any.
    cfg = config(tiny_model_dir, hint_samples=0 if feedback else HINTS)
    policy = load_policy(cfg)
    before = trainable(policy)
    result = grpo_train(
        config=cfg, items=items(feedback), score=all_fail_but_the_first_hinted, run_dir=tmp_path, policy=policy
    )
    step = result.history[0]
    assert step["trained_sequences"] == 0 and step["zero_variance_share"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    if not feedback:
        assert (step["zero_variance_groups"], step["hinted_groups"]) == (1, 0)


@pytest.mark.parametrize("hint_at", ["system", "last"])
def test_the_comment_gives_a_gradient_that_raises_the_students_own_probability_of_the_hinted_success(
    tiny_model_dir, tmp_path, monkeypatch, hint_at
):
    from training.trainer.policy import load_policy

    cfg = config(tiny_model_dir, hint_samples=HINTS, hint_at=hint_at, hint_cap=3.0)
    policy = load_policy(cfg)
    tokenizer = policy.tokenizer
    seen: dict = {}
    real_update, real_step = grpo.turn_update, Trainer.clip_and_step

    def update_spy(trainer, rollout, advantages, rows, **kw):
        # The rewarded hinted sample is the first row after the G plain ones.
        row = GROUP
        seen.update(rollout=rollout, advantages=advantages, rows=rows.tolist(), **kw)
        ids, attn = rollout.input_ids[row : row + 1], rollout.attention_mask[row : row + 1]
        mask = rollout.response_mask[row : row + 1].float()
        width = mask.shape[1]
        own = (token_logprobs(policy.model, ids, attn, keep=width, temperature=cfg.temperature) * mask).sum()
        params = [p for p in policy.model.parameters() if p.requires_grad]
        seen["raise"] = torch.autograd.grad(own, params)  # ∇ log π_θ(y* | x), no hint in x
        return real_update(trainer, rollout, advantages, rows, **kw)

    def step_spy(self, *, step):
        seen["grad"] = [p.grad.detach().clone() for p in self.policy.model.parameters() if p.requires_grad]
        return real_step(self, step=step)

    monkeypatch.setattr(grpo, "turn_update", update_spy)
    monkeypatch.setattr(Trainer, "clip_and_step", step_spy)
    result = grpo_train(
        config=cfg, items=items(), score=all_fail_but_the_first_hinted, run_dir=tmp_path, policy=policy, export=False
    )
    step = result.history[0]
    assert (step["zero_variance_groups"], step["hinted_groups"], step["hinted_groups_with_variance"]) == (1, 1, 1)
    assert step["hint_reward_mean"] == pytest.approx(1 / HINTS)
    assert step["trained_sequences"] == GROUP + HINTS
    assert 0 < step["hint_weight_mean"] <= 3.0 and 0 <= step["hint_truncated_share"] <= 1

    rollout = seen["rollout"]
    # Every row is trained in the student's context: the comment is in none of them.
    for row in range(GROUP + HINTS):
        assert COMMENT not in tokenizer.decode(rollout.input_ids[row][rollout.attention_mask[row].bool()])
    # RLOO over the enlarged group of G + K rewards [0, 0, 0, 0, 1, 0].
    assert seen["advantages"].tolist() == pytest.approx([-0.2] * GROUP + [1.0, -0.2])

    # The gradient is not zero, and descending it raises log π_θ(y* | x) to first order.
    grad = seen["grad"]
    assert sum(float(g.abs().sum()) for g in grad) > 0
    assert sum(float(-(g * r).sum()) for g, r in zip(grad, seen["raise"], strict=True)) > 0


def test_the_behaviour_log_probs_are_the_hinted_contexts_and_the_weights_their_ratio(tiny_model_dir):
    """`hinted_batch` moves the hinted tokens from the hinted context to the student's: the
    behaviour log-probs are those of the hinted context, token for token, and the student's
    log-probs of the same tokens in the combined layout are those of its own context."""
    from training.trainer import hints
    from training.trainer.common import PromptCache, group_advantages_kept
    from training.trainer.policy import load_policy
    from training.trainer.sampling import sample

    cfg = config(tiny_model_dir, hint_samples=HINTS)
    policy = load_policy(cfg)
    batch = items()[:2]
    prompts = PromptCache(policy.tokenizer)
    prompt_ids = [prompts.get(it) for it in batch]
    rollout = sample(policy.model, policy.tokenizer, prompt_ids, num_samples=GROUP, max_new_tokens=6)
    rewards = [0.0] * GROUP + [1.0, 0.0, 0.0, 0.0]  # the first group all fail, the second has signal
    advantages, keep, rows = group_advantages_kept(rewards, groups=2, config=cfg)
    hinted, metrics = hints.hint_round(
        policy,
        config=cfg,
        batch=batch,
        prompts=prompts,
        prompt_ids=prompt_ids,
        rollout=rollout,
        rewards=rewards,
        advantages=advantages,
        keep=keep,
        rows=rows,
        score=lambda item, c: [1.0] + [0.0] * (len(c) - 1),
    )
    assert (metrics["zero_variance_groups"], metrics["hinted_groups"], metrics["hinted_groups_with_variance"]) == (
        1,
        1,
        1,
    )
    assert hinted.rows.tolist() == list(range(2 * GROUP + HINTS))
    # The group with signal keeps its advantages; the hinted one's are over its 6 rewards.
    assert hinted.advantages[GROUP : 2 * GROUP].tolist() == pytest.approx(advantages[1].tolist())
    for k in range(HINTS):
        row = 2 * GROUP + k
        response = hinted.rollout.response_ids[row][hinted.rollout.response_mask[row].bool()].tolist()
        n = len(response)
        with torch.no_grad():
            hint_ctx = torch.tensor([encode_prompt(policy.tokenizer, hint_messages(batch[0], cfg)) + response])
            own_ctx = torch.tensor([prompt_ids[0] + response])
            behaviour = token_logprobs(policy.model, hint_ctx, torch.ones_like(hint_ctx), keep=n)[0]
            student = token_logprobs(policy.model, own_ctx, torch.ones_like(own_ctx), keep=n)[0]
            layout = token_logprobs(
                policy.model,
                hinted.rollout.input_ids[row : row + 1],
                hinted.rollout.attention_mask[row : row + 1],
                keep=hinted.rollout.response_mask.shape[1],
            )[0, :n]
        assert torch.allclose(hinted.behaviour_logprobs[row, :n], behaviour, atol=1e-4)
        assert torch.allclose(layout, student, atol=1e-4)
        assert not torch.allclose(behaviour, student, atol=1e-3)  # the hint changed the distribution
    assert not hinted.hinted[: 2 * GROUP].any() and hinted.hinted[2 * GROUP :].all()


def score_by_length(item, candidates):
    # Some groups vary (by length), some do not: q0's and q1's candidates all score 0.
    if item.id in ("q0", "q1"):
        return [0.0] * len(candidates)
    return [float(len(c) > 12) for c in candidates]


def test_no_hint_samples_is_exactly_plain_grpo(tiny_model_dir, tmp_path):
    """K = 0 on a set with comments, and K = 3 on the same set without them (so no group
    can be hinted), step the same parameters as each other over two steps: the hint
    machinery draws nothing, consumes no random number and changes no update."""
    from training.trainer.policy import load_policy

    runs = []
    for k, feedback in ((0, COMMENT), (3, "")):
        cfg = small(GRPOConfig, tiny_model_dir, steps=2, group_size=GROUP, hint_samples=k)
        torch.manual_seed(cfg.seed)  # the adapter's initial weights
        policy = load_policy(cfg)
        result = grpo_train(
            config=cfg, items=items(feedback), score=score_by_length, run_dir=tmp_path / str(k), policy=policy
        )
        runs.append((trainable(policy), result.history))
    (plain, plain_history), (hinted, hinted_history) = runs
    assert any(m["zero_variance_share"] > 0 for m in plain_history)  # there were groups to hint
    assert any(m["trained_sequences"] > 0 for m in plain_history)
    assert plain.keys() == hinted.keys() and all(torch.equal(plain[n], hinted[n]) for n in plain)
    assert [m["loss"] for m in plain_history] == [m["loss"] for m in hinted_history]
    assert "hinted_groups" not in plain_history[0] and hinted_history[0]["hinted_groups"] == 0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hint_samples": -1}, "hint_samples"),
        ({"hint_samples": 65}, "hint_samples"),
        ({"hint_samples": 2, "rollout": "vllm", "vllm_url": "http://127.0.0.1:8001/v1"}, "hint_samples"),
        ({"hint_template": "no placeholder"}, "hint_template"),
        ({"hint_template": "{feedback} and {other}"}, "hint_template"),
        ({"hint_template": "Note: {{feedback}}"}, "hint_template"),  # the literal text, never the comment
        ({"hint_template": "{feedback}{feedback:>999999999}"}, "hint_template"),
        ({"hint_template": "{feedback!r}"}, "hint_template"),
        ({"hint_samples": 2, "processes": 2, "prompts_per_step": 4}, "hint_samples"),
        ({"hint_at": "middle"}, "hint_at"),
        ({"hint_cap": 0.5}, "hint_cap"),
        ({"hint_cap": "3"}, "hint_cap"),
    ],
)
def test_hint_settings_are_refused_with_the_field_and_the_reason(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": "grpo", **changes})
    assert [f for f, _ in err.value.errors] == [field]
    with pytest.raises(ConfigError) as err:
        EpisodesConfig.from_dict({"hint_samples": 2})
    assert err.value.errors[0][0] == "hint_samples"


def test_a_script_cannot_mix_hinted_samples_with_a_servers_rollouts(tmp_path):
    cfg = GRPOConfig(rollout="vllm", vllm_url="http://127.0.0.1:8001/v1", hint_samples=2)
    with pytest.raises(ValueError, match="rollout 'local'"):
        grpo_train(config=cfg, items=items(), score=all_fail_but_the_first_hinted, run_dir=tmp_path)


@pytest.mark.parametrize("changes", [{"micro_batch": 2}, {"normaliser": "token", "micro_batch": 4}])
def test_hinted_rows_accumulate_over_micro_batches_as_in_one_pass(tiny_model_dir, tmp_path, changes):
    """The hint weights are sliced with each micro-batch's rows: the step's loss, weights and
    parameters are those of one pass over the whole enlarged batch."""
    from training.trainer.policy import load_policy

    runs = []
    for name, extra in (("one-pass", {k: v for k, v in changes.items() if k != "micro_batch"}), ("micro", changes)):
        cfg = config(tiny_model_dir, hint_samples=HINTS, **extra)
        torch.manual_seed(cfg.seed)
        policy = load_policy(cfg)
        result = grpo_train(
            config=cfg, items=items(), score=all_fail_but_the_first_hinted, run_dir=tmp_path / name, policy=policy
        )
        runs.append((result.history[0], trainable(policy)))
    (whole, whole_params), (micro, micro_params) = runs
    assert whole["trained_sequences"] == micro["trained_sequences"] == GROUP + HINTS
    assert micro["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-7)
    assert micro["hint_weight_mean"] == pytest.approx(whole["hint_weight_mean"], rel=1e-4)
    assert all(torch.allclose(micro_params[n], whole_params[n], atol=1e-6) for n in whole_params)


def test_a_reused_batch_weighs_hinted_rows_against_the_policy_before_its_first_update(tiny_model_dir, tmp_path):
    from training.trainer.policy import load_policy

    cfg = config(tiny_model_dir, hint_samples=HINTS, updates_per_batch=2)
    policy = load_policy(cfg)
    before = trainable(policy)
    step = grpo_train(
        config=cfg, items=items(), score=all_fail_but_the_first_hinted, run_dir=tmp_path, policy=policy
    ).history[0]
    assert step["trained_sequences"] == GROUP + HINTS and 0 < step["hint_weight_mean"] <= 3.0
    assert step["clip_fraction"] is not None
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def one_commented_all_fail(item, candidates):
    # q0 (commented): every sample fails, hinted or not; q1 (no comment): has variance.
    if item.id == "q0":
        return [0.0] * len(candidates)
    return [1.0] + [0.0] * (len(candidates) - 1)


@pytest.mark.parametrize("updates", [1, 2])
def test_a_step_that_trains_no_hinted_token_logs_no_hint_weight(tiny_model_dir, tmp_path, updates):
    """The hinted group stays without variance and is dropped, while another group trains:
    the hint weight's figures are None (nothing was weighed), not a mean weight of 0."""
    batch = [
        TurnItem(id="q0", messages=[{"role": "user", "content": "where is order A0?"}], feedback=COMMENT),
        TurnItem(id="q1", messages=[{"role": "user", "content": "where is order A1?"}]),
    ]
    cfg = small(
        GRPOConfig,
        tiny_model_dir,
        steps=1,
        group_size=GROUP,
        log_kl=False,
        hint_samples=HINTS,
        updates_per_batch=updates,
    )
    step = grpo_train(config=cfg, items=batch, score=one_commented_all_fail, run_dir=tmp_path).history[0]
    assert (step["hinted_groups"], step["hinted_groups_with_variance"], step["trained_sequences"]) == (1, 0, GROUP)
    assert step["hint_weight_mean"] is None and step["hint_truncated_share"] is None


def test_the_behaviour_log_probs_are_the_sampled_distributions_with_lora_dropout(tiny_model_dir):
    """With LoRA dropout, π_b is the policy as `sample` drew from it (eval mode, no
    dropout), not a randomly thinned one; the model is left in training mode."""
    from training.trainer import hints
    from training.trainer.common import PromptCache
    from training.trainer.policy import load_policy

    cfg = config(tiny_model_dir, hint_samples=HINTS, lora_dropout=0.5)
    policy = load_policy(cfg)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # an adapter that has been trained: dropout changes its output
    drawn, behaviour = hints.hint_sample(policy, items()[:1], config=cfg, prompts=PromptCache(policy.tokenizer))
    assert policy.model.training
    width = drawn.response_mask.shape[1]
    policy.model.eval()
    with torch.no_grad():
        sampled = token_logprobs(policy.model, drawn.input_ids, drawn.attention_mask, keep=width)
    policy.model.train()
    mask = drawn.response_mask.bool()
    assert torch.allclose(behaviour[mask], sampled[mask], atol=1e-5)


def test_a_reused_batch_weighs_its_hinted_tokens_the_same_at_every_update(tiny_model_dir, tmp_path, monkeypatch):
    """With updates_per_batch = 2 the hint weights are taken once, against the policy before
    the first update: the second update's weights are the first's, though the policy moved."""
    from training.trainer import loss as L
    from training.trainer.policy import load_policy

    seen: list[torch.Tensor] = []
    real = L.policy_loss

    def spy(*args, sampling_weights=None, **kw):
        seen.append(sampling_weights.detach().clone())
        return real(*args, sampling_weights=sampling_weights, **kw)

    monkeypatch.setattr(L, "policy_loss", spy)
    cfg = config(tiny_model_dir, hint_samples=HINTS, updates_per_batch=2)
    policy = load_policy(cfg)
    step = grpo_train(
        config=cfg, items=items(), score=all_fail_but_the_first_hinted, run_dir=tmp_path, policy=policy
    ).history[0]
    assert step["trained_sequences"] == GROUP + HINTS and len(seen) == 2
    hinted = seen[0][GROUP:]
    assert (hinted != 1).any()  # the hinted tokens are weighed (not all exactly 1)
    assert torch.equal(seen[0], seen[1])
