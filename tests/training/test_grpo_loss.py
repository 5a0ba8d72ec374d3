"""Each loss function against a computation done by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from training.trainer import loss as L


def test_masked_mean_ignores_masked_entries_and_an_empty_row_is_zero():
    values = torch.tensor([[1.0, 2.0, 100.0], [5.0, 7.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert L.masked_mean(values, mask).item() == pytest.approx(1.5)  # (1 + 2) / 2
    assert L.masked_mean(values, mask, dim=1).tolist() == pytest.approx([1.5, 0.0])
    assert L.masked_sum(values, mask).item() == pytest.approx(3.0)


def test_rloo_advantage_is_reward_minus_the_mean_of_the_others():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv, keep = L.group_advantages(rewards)
    # A_0 = 1 - (0 + 0 + 1)/3 = 2/3 ; A_1 = 0 - (1 + 0 + 1)/3 = -2/3
    assert adv[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert keep.tolist() == [True]


def test_mean_baseline_and_unbiased_std_scaling():
    rewards = torch.tensor([[3.0, 1.0, 2.0]])
    adv, _ = L.group_advantages(rewards, baseline="mean")
    assert adv[0].tolist() == pytest.approx([1.0, -1.0, 0.0])  # mean is 2
    scaled, _ = L.group_advantages(rewards, baseline="mean", scale_std=True, eps=0.0)
    std = math.sqrt(((1) ** 2 + (-1) ** 2 + 0) / (3 - 1))  # unbiased: divisor G - 1 → 1.0
    assert scaled[0].tolist() == pytest.approx([1.0 / std, -1.0 / std, 0.0])
    clipped, _ = L.group_advantages(torch.tensor([[10.0, 0.0]]), baseline="mean", clip=2.0)
    assert clipped[0].tolist() == pytest.approx([2.0, -2.0])


def test_equal_rewards_give_zero_advantage_and_the_group_is_dropped():
    rewards = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    for scale in (False, True):
        adv, keep = L.group_advantages(rewards, scale_std=scale)
        assert keep.tolist() == [False, True, False]
        assert adv[0].abs().sum().item() == 0.0 and adv[2].abs().sum().item() == 0.0
        assert torch.isfinite(adv).all()


def test_policy_loss_without_reuse_has_value_minus_a_and_gradient_minus_a_grad_logp():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).float()
    loss, stats = L.policy_loss(logp, adv, mask, normaliser="constant", constant=10.0)
    # sum over masked tokens of -A: -(2 + 2) - (-1 -1 -1) = -4 + 3 = -1 ; / 10
    assert loss.item() == pytest.approx(-0.1)
    loss.backward()
    expected = torch.tensor([[-0.2, -0.2, 0.0], [0.1, 0.1, 0.1]])
    assert torch.allclose(logp.grad, expected)
    assert "clip_fraction" not in stats


def test_token_and_sequence_normalisers():
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, 3.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]]).float()
    token, _ = L.policy_loss(logp, adv, mask, normaliser="token")
    # -(1 + 3 + 3 + 3) / 4 tokens
    assert token.item() == pytest.approx(-10 / 4)
    seq, _ = L.policy_loss(logp, adv, mask, normaliser="sequence")
    # mean of per-sequence means: (-1 + -3) / 2
    assert seq.item() == pytest.approx(-2.0)
    const, _ = L.policy_loss(logp, adv, mask, normaliser="constant")
    assert const.item() == pytest.approx(-10 / 6)  # B x T = 6


def test_ppo_clip_surrogate_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.8, 0.2]])).requires_grad_(True)
    mask = torch.ones(1, 2)
    # ratios 1.6 and 0.4
    loss, stats = L.policy_loss(
        new, torch.tensor([1.0]), mask, old_logprobs=old, clip_low=0.2, clip_high=0.28, normaliser="token"
    )
    # A > 0: min(1.6, 1.28) = 1.28 ; min(0.4, 0.8) = 0.4 → -(1.28 + 0.4) / 2
    assert loss.item() == pytest.approx(-(1.28 + 0.4) / 2)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    # The clipped token carries no gradient; the other: -ratio * A / 2 = -0.2.
    assert new.grad[0, 0].item() == pytest.approx(0.0)
    assert new.grad[0, 1].item() == pytest.approx(-0.2)
    neg, _ = L.policy_loss(new.detach(), torch.tensor([-1.0]), mask, old_logprobs=old, normaliser="token")
    # A < 0: min(-1.6, -1.28) = -1.6 ; min(-0.4, -0.8) = -0.8 → (1.6 + 0.8) / 2
    assert neg.item() == pytest.approx((1.6 + 0.8) / 2)


def test_k3_kl_by_hand_and_zero_when_equal():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    kl = L.kl_k3(logp, ref)
    r = math.log(0.25 / 0.5)
    assert kl[0, 0].item() == pytest.approx(math.exp(r) - r - 1)  # 0.5 + ln 2 - 1
    assert kl[0, 1].item() == pytest.approx(0.0)
    assert (L.kl_k3(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()


def test_distill_kl_matches_the_reverse_kl_formula():
    student = torch.log(torch.tensor([[[0.7, 0.2, 0.1], [0.3, 0.3, 0.4]]])).requires_grad_(True)
    teacher = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.3, 0.3, 0.4]]]))
    mask = torch.tensor([[1.0, 1.0]])
    value = L.distill_kl(student, teacher, mask)
    by_hand = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.25) + 0.1 * math.log(0.1 / 0.25)
    assert value.item() == pytest.approx(by_hand / 2)  # second position: identical → 0
    value.backward()
    assert student.grad.abs().sum() > 0
    masked = L.distill_kl(student.detach(), teacher, torch.tensor([[0.0, 1.0]]))
    assert masked.item() == pytest.approx(0.0, abs=1e-7)


def test_sft_loss_is_the_token_mean_nll():
    logp = torch.tensor([[-1.0, -3.0, -50.0]])
    assert L.sft_loss(logp, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(2.0)


def test_sft_loss_weights_each_rows_first_target_token():
    # Left-padded rows as the batcher lays them out: row 0's target starts at column 1.
    logp = torch.tensor([[-50.0, -1.0, -3.0], [-2.0, -4.0, -6.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    # w = 4 on (0, 1) and (1, 0): (4·1 + 3 + 4·2 + 4 + 6) / (4 + 1 + 4 + 1 + 1) = 25 / 11.
    assert L.sft_loss(logp, mask, first_token_weight=4.0).item() == pytest.approx(25 / 11)
    assert L.sft_loss(logp, mask, first_token_weight=1.0).item() == pytest.approx(16 / 5)


def test_the_kl_penalty_is_added_per_token_under_the_policy_terms_normaliser():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.5, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.5, 0.25, 0.5]]))
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    k = math.log(2) - 0.5  # k3 where π_ref = π/2: e^{-ln 2} + ln 2 - 1; 0 where they agree
    c = 0.1 * k  # β = 0.1
    # Per token l = -A + β·k3: row 0 (-1 + c, -1), row 1 (2, 2 + c, 2).
    expected = {
        "token": (4 + 2 * c) / 5,
        "sequence": ((-2 + c) / 2 + (6 + c) / 3) / 2,
        "constant": (4 + 2 * c) / 10,
    }
    for normaliser, value in expected.items():
        loss, stats = L.policy_loss(logp, adv, mask, ref_logprobs=ref, beta=0.1, normaliser=normaliser, constant=10.0)
        assert loss.item() == pytest.approx(value), normaliser
        assert stats["kl"] == pytest.approx(2 * k / 5)  # the logged KL is a token mean
    # β = 0 measures the KL without adding it; β > 0 without a reference is refused.
    measured, stats = L.policy_loss(logp, adv, mask, ref_logprobs=ref, normaliser="token")
    assert measured.item() == pytest.approx(4 / 5) and stats["kl"] == pytest.approx(2 * k / 5)
    with pytest.raises(ValueError, match="reference"):
        L.policy_loss(logp, adv, mask, beta=0.1)


# --- against TRL ------------------------------------------------------------------------
# TRL's GRPOTrainer (trl/trainer/grpo_trainer.py, `_compute_loss`), restated here because TRL
# is not a dependency of the project (only of requirements-bench.txt):
#   coef_1 = exp(logp - old_logp)   (old_logp = stopgrad(logp) with one iteration per batch)
#   coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
#   per_token_loss = -min(coef_1·A, coef_2·A) + beta · (exp(ref - logp) - (ref - logp) - 1)
#   "grpo":    mean_b( Σ_t l·m / max(Σ_t m, 1) )
#   "bnpo":    Σ l·m / max(Σ m, 1)
#   "dr_grpo": Σ l·m / (B · max_completion_length)
#   "dapo":    Σ l·m / (num_items_in_batch / num_processes), num_items_in_batch the trained
#              tokens of the whole generation batch (all processes and accumulation steps)


def trl_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    loss_type: str,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    max_completion_length: int = 0,
    num_items_in_batch: float = 0.0,
    num_processes: int = 1,
) -> torch.Tensor:
    old = logp.detach() if old_logp is None else old_logp
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    a = advantages.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    per_token = per_token + beta * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "dapo":
        return (per_token * mask).sum() / (num_items_in_batch / num_processes)
    raise ValueError(loss_type)


def trl_case(seed: int, *, reuse: bool):
    """Hand-made tensors: 4 sequences of up to 5 tokens, ragged masks, one all-masked row
    (a dropped or empty sequence), a reference away from the policy and, when reused, old
    log-probs far enough for both clip bounds to act."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 5, generator=g) * 3 - 0.05  # (B, T)
    ref = logp + torch.randn(4, 5, generator=g) * 0.5
    old = logp + torch.randn(4, 5, generator=g) * 0.4 if reuse else None
    adv = torch.tensor([1.5, -0.5, 0.75, -2.0])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    return logp, old, ref, adv, mask


# The project's normaliser and constant ↔ TRL's loss_type and its arguments, on one batch
# (one process, no accumulation: then "dapo"'s global token count is this batch's).
MAX_COMPLETION_LENGTH = 8  # the configured maximum, wider than this batch's padded T = 5
PAIRS = [
    ("sequence", None, {"loss_type": "grpo"}),
    ("token", None, {"loss_type": "bnpo"}),
    ("token", None, {"loss_type": "dapo"}),
    ("constant", 4 * MAX_COMPLETION_LENGTH, {"loss_type": "dr_grpo", "max_completion_length": MAX_COMPLETION_LENGTH}),
]


@pytest.mark.parametrize("reuse", [False, True], ids=["one-update", "ppo-clip"])
@pytest.mark.parametrize(("normaliser", "constant", "trl"), PAIRS, ids=[p[2]["loss_type"] for p in PAIRS])
def test_policy_loss_equals_trls_grpo_loss_with_a_kl_penalty(normaliser, constant, trl, reuse):
    beta = 0.04  # TRL's own former default; any β > 0
    ratios = []
    for seed in range(3):
        logp, old, ref, adv, mask = trl_case(seed, reuse=reuse)
        ours_logp = logp.clone().requires_grad_(True)
        theirs_logp = logp.clone().requires_grad_(True)
        ours, _ = L.policy_loss(
            ours_logp,
            adv,
            mask,
            old_logprobs=old,
            ref_logprobs=ref,
            beta=beta,
            clip_low=0.2,
            clip_high=0.28,
            normaliser=normaliser,
            constant=constant,
        )
        theirs = trl_loss(theirs_logp, old, ref, adv, mask, beta=beta, num_items_in_batch=float(mask.sum()), **trl)
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
        ours.backward()
        theirs.backward()
        assert torch.allclose(ours_logp.grad, theirs_logp.grad, rtol=1e-5, atol=1e-7)
        if reuse:
            ratios.append(torch.exp(logp - old)[mask.bool()])
    if reuse:  # the cases exercise both clip bounds, not only the ratio-1 path
        ratio = torch.cat(ratios)
        assert (ratio > 1.28).any() and (ratio < 0.8).any()


def test_sampling_correction_is_the_ratio_to_the_sampler_truncated_at_the_cap():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.6, 0.3, 0.1]]))
    # The sampler's probabilities: a forced token (1.0), a renormalised one (0.4 > 0.2),
    # one the sampler found much less likely (0.1 < 0.6: ratio 6, cut at 3), padding.
    sampler = torch.log(torch.tensor([[1.0, 0.4, 0.9], [0.1, 0.3, 0.5]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).float()
    weights, stats = L.sampling_correction(logp, sampler, mask, cap=3.0)
    expected = torch.tensor([[0.5, 0.5, 1.0], [3.0, 1.0, 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert stats["sampling_weight_mean"] == pytest.approx((0.5 + 0.5 + 1.0 + 3.0 + 1.0) / 5)
    assert stats["sampling_truncated_share"] == pytest.approx(1 / 5)
    gap = (math.log(2) + math.log(2) + 0 + math.log(6) + 0) / 5
    assert stats["sampler_logprob_gap"] == pytest.approx(gap, rel=1e-5)


def test_sampling_weights_scale_the_policy_term_but_not_the_kl_penalty():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0]])
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    weights = torch.tensor([[0.5, 3.0]])
    loss, _ = L.policy_loss(
        logp, adv, mask, ref_logprobs=ref, beta=0.1, sampling_weights=weights, normaliser="constant", constant=4.0
    )
    k3 = math.exp(-0.5) + 0.5 - 1.0  # first token; the second's k3 is 0
    # (-2·0.5 - 2·3 + 0.1·k3) / 4
    assert loss.item() == pytest.approx((-1.0 - 6.0 + 0.1 * k3) / 4)
    loss.backward()
    # d/dlogp: -A·w + β·(1 - exp(ref - logp)), over 4
    expected = [(-2 * 0.5 + 0.1 * (1 - math.exp(-0.5))) / 4, (-2 * 3.0) / 4]
    assert logp.grad[0].tolist() == pytest.approx(expected)


def test_micro_batch_scales_add_the_micro_batch_losses_up_to_the_batch_loss():
    # Three rows with 1, 3 and 2 trained tokens, split as [row 0] and [rows 1, 2].
    adv = torch.tensor([1.0, 3.0, -2.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0]]).float()
    logp = torch.zeros(3, 3)
    first, second = mask[:1], mask[1:]
    # By hand: token, n_k / N = 1/6 and 5/6; sequence, b_k / B = 1/3 and 2/3; constant, 1.
    assert L.micro_batch_scale(first, normaliser="token", batch_tokens=6.0, batch_rows=3) == pytest.approx(1 / 6)
    assert L.micro_batch_scale(second, normaliser="token", batch_tokens=6.0, batch_rows=3) == pytest.approx(5 / 6)
    assert L.micro_batch_scale(first, normaliser="sequence", batch_tokens=6.0, batch_rows=3) == pytest.approx(1 / 3)
    assert L.micro_batch_scale(second, normaliser="sequence", batch_tokens=6.0, batch_rows=3) == pytest.approx(2 / 3)
    assert L.micro_batch_scale(first, normaliser="constant", batch_tokens=6.0, batch_rows=3) == 1.0
    assert L.micro_batch_scale(torch.zeros(2, 3), normaliser="token", batch_tokens=0.0, batch_rows=2) == 0.0
    # The batch's losses by hand: token -(1 + 9 - 4) / 6 = -1; sequence -(1 + 3 - 2) / 3;
    # constant -(1 + 9 - 4) / 10; and the scaled micro-batch losses add up to each.
    hand = {"token": -1.0, "sequence": -2 / 3, "constant": -6 / 10}
    for normaliser, expected in hand.items():
        whole, _ = L.policy_loss(logp, adv, mask, normaliser=normaliser, constant=10.0)
        assert whole.item() == pytest.approx(expected)
        parts = 0.0
        for rows in (slice(0, 1), slice(1, 3)):
            part, _ = L.policy_loss(logp[rows], adv[rows], mask[rows], normaliser=normaliser, constant=10.0)
            scale = L.micro_batch_scale(mask[rows], normaliser=normaliser, batch_tokens=6.0, batch_rows=3)
            parts += scale * part.item()
        assert parts == pytest.approx(expected)


def test_a_token_whose_sampler_log_prob_is_unknown_weighs_one():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    sampler = torch.tensor([[math.log(1.0), math.nan]])
    weights, stats = L.sampling_correction(logp, sampler, torch.ones(1, 2), cap=3.0)
    assert weights[0].tolist() == pytest.approx([0.5, 1.0])
    assert stats["sampler_logprob_gap"] == pytest.approx(math.log(2) / 2)


def test_the_sampling_weight_ignores_whatever_a_padded_position_holds():
    from training.trainer.loss import sampling_correction

    logprobs = torch.tensor([[-0.5, float("-inf")]])
    sampler = torch.tensor([[-0.5, -1.0]])
    weights, stats = sampling_correction(logprobs, sampler, torch.tensor([[1.0, 0.0]]))
    assert weights.tolist() == [[1.0, 0.0]] and stats["sampling_weight_mean"] == 1.0


def test_hinted_grpo_weighs_a_hinted_sample_by_the_student_over_the_hinted_policy_truncated():
    """Two samples of one group, two tokens each, computed by hand: sample 0 the student's
    own (reward 0), sample 1 drawn with the comment as a hint (reward 1)."""
    # The student's probabilities of each token in its own context (no hint).
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.2, 0.6]])).requires_grad_()
    # The hinted policy's, at sampling time; row 0 was not hinted, so its values are unused.
    behaviour = torch.log(torch.tensor([[0.9, 0.9], [0.4, 0.1]]))
    mask = torch.ones(2, 2)
    hinted = torch.tensor([False, True])
    weights, stats = L.hint_weights(logp, behaviour, mask, hinted, cap=3.0)
    # Row 1: 0.2 / 0.4 = 0.5; 0.6 / 0.1 = 6, truncated at 3. Row 0 is on-policy: 1.
    assert torch.allclose(weights, torch.tensor([[1.0, 1.0], [0.5, 3.0]]))
    assert stats["hint_weight_mean"] == pytest.approx((0.5 + 3.0) / 2)  # over the hinted tokens only
    assert stats["hint_truncated_share"] == pytest.approx(1 / 2)

    adv, keep = L.group_advantages(torch.tensor([[0.0, 1.0]]))  # RLOO: r_i - r_other = [-1, 1]
    assert adv.tolist() == [[-1.0, 1.0]] and keep.tolist() == [True]
    loss, _ = L.policy_loss(logp, adv.view(-1), mask, sampling_weights=weights, normaliser="constant", constant=4.0)
    # Σ -w·A / 4 = (1 + 1 - 0.5 - 3) / 4
    assert loss.item() == pytest.approx(-0.375)
    loss.backward()
    # d/dlogp = -w·A / 4: the student's own failure pushed down, the hinted success up, its
    # second token at the cap.
    assert torch.allclose(logp.grad, torch.tensor([[0.25, 0.25], [-0.125, -0.75]]))


def test_hint_weights_ignore_padding_and_give_no_figures_without_hinted_tokens():
    logp = torch.tensor([[-0.5, float("-inf")], [-1.0, -1.0]])
    behaviour = torch.tensor([[-1.0, float("inf")], [0.0, 0.0]])
    weights, stats = L.hint_weights(
        logp, behaviour, torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([True, False])
    )
    assert torch.allclose(weights, torch.tensor([[math.exp(0.5), 0.0], [1.0, 1.0]]))
    assert stats["hint_weight_mean"] == pytest.approx(math.exp(0.5))  # the padded position is not counted
    _, none = L.hint_weights(logp, behaviour, torch.ones(2, 2), torch.tensor([False, False]))
    assert none == {"hint_weight_mean": 0.0, "hint_truncated_share": 0.0}
