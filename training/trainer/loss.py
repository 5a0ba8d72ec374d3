"""Pure loss functions for policy-gradient training and distillation.

Shapes: B = sequences in a batch (prompts x samples per prompt), T = response tokens
(padded), N = groups (prompts), G = samples per group, V = vocabulary.

Every function takes tensors and returns tensors; none holds state. The conventions
(baseline, normaliser, std, eps) are spelled out in each docstring because papers and
libraries differ on exactly these points.
"""

from __future__ import annotations

from typing import Literal

import torch

Normaliser = Literal["constant", "token", "sequence"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over `dim` (all dims when None). `mask` is 0/1 (bool or float)."""
    masked = values * mask.to(values.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / max(sum(mask), 1) over `dim` (all dims when None).

    The max(·, 1) keeps an all-masked row at 0 instead of NaN."""
    m = mask.to(values.dtype)
    return masked_sum(values, m, dim) / m.sum(dim=dim).clamp(min=1.0)


def group_advantages(
    rewards: torch.Tensor,
    *,
    baseline: Literal["rloo", "mean"] = "rloo",
    scale_std: bool = False,
    eps: float = 1e-6,
    clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages of G samples per group, and which groups carry signal.

    rewards: (N, G). Returns (advantages (N, G), keep (N,) bool).

    - baseline="rloo" (default, Ahmadian et al. 2024): A_i = r_i - (1/(G-1)) Σ_{j≠i} r_j,
      the leave-one-out mean of the *other* samples, so the baseline does not depend on
      r_i. Equivalently A_i = G/(G-1) · (r_i - mean(r)).
    - baseline="mean" (Dr. GRPO, Liu et al. 2025): A_i = r_i - mean(r).
    - scale_std=True (original GRPO, Shao et al. 2024): divide by (std(r) + eps), where
      std is the *unbiased* sample std (divisor G-1, torch's default, as in TRL). Off by
      default: it amplifies judge noise in near-ties and over-weights very easy or very
      hard prompts.
    - clip: optional bound on |A| after scaling.

    A group whose rewards are all equal (max - min ≤ eps) gives no learning signal: its
    advantages are set to exactly 0 and keep[n] is False, so a caller can leave it out of
    the batch (and report the share of such groups).
    """
    group_size = rewards.shape[1]  # rewards: (N, G)
    if group_size < 2:
        raise ValueError("group advantages need at least 2 samples per group")
    rewards = rewards.to(torch.float32)
    mean = rewards.mean(dim=1, keepdim=True)  # (N, 1)
    if baseline == "rloo":
        advantages = (rewards - mean) * (group_size / (group_size - 1))  # (N, G)
    elif baseline == "mean":
        advantages = rewards - mean
    else:
        raise ValueError(f"unknown baseline {baseline!r}")
    if scale_std:
        advantages = advantages / (rewards.std(dim=1, keepdim=True, unbiased=True) + eps)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    keep = (rewards.max(dim=1).values - rewards.min(dim=1).values) > eps  # (N,)
    advantages = advantages * keep.unsqueeze(1).to(advantages.dtype)
    return advantages, keep


def policy_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    normaliser: Normaliser = "constant",
    constant: float | None = None,
    sampling_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy-gradient surrogate with its KL penalty, to minimise.

    logprobs: (B, T) log π_θ(y_t | …) with gradient; advantages: (B,) one per sequence;
    mask: (B, T) 1 on tokens being trained (a mask may cover several assistant spans);
    ref_logprobs: (B, T) log π_ref(y_t | …) of the reference (no gradient), or None.

    Per-token term, as in TRL's GRPOTrainer:
        l_{b,t} = s_{b,t} + β · k3_{b,t},  k3 = `kl_k3(logprobs, ref_logprobs)`
    so β weighs the KL exactly as it weighs the policy term, under the same normaliser.

    - old_logprobs None (one optimiser step per batch, the default): s = -A · exp(logp -
      stopgrad(logp)). Its value is -A and its gradient is -A·∇logp: the PPO ratio is
      exactly 1 and clipping would never act, so it is not computed. The log-probs come
      from the same forward pass as the gradient, no second pass.
    - old_logprobs given (a batch reused for several updates): the PPO-clip surrogate
      s = -min(ratio·A, clip(ratio, 1-clip_low, 1+clip_high)·A), ratio = exp(logp - old_logp),
      with the asymmetric "clip-higher" bounds of DAPO (0.2 / 0.28).
    - β > 0 needs ref_logprobs. With ref_logprobs and β = 0 the KL is only measured.
    - sampling_weights (B, T), no gradient (`sampling_correction`): when the tokens were
      sampled by another engine (vLLM, under a structured-output constraint), the policy
      term becomes w_{b,t} · s_{b,t}, so l = w·s + β·k3: the weight corrects the policy
      gradient for the sampler, not the KL penalty (TRL multiplies its per-token loss by
      the ratio before adding β·k3).

    Normaliser of the per-token terms l_{b,t} (TRL's loss_type in brackets):
    - "constant" (default, Dr. GRPO ["dr_grpo"]): Σ_{b,t} mask·l / constant, with
      constant = B x T unless given (pass G·max_new_tokens·prompts for a fixed value across
      batches); no length bias toward short or long answers.
    - "token" (DAPO ["bnpo"; "dapo" when the batch is the whole generation batch]):
      Σ mask·l / max(Σ mask, 1) — the mean over all trained tokens in the batch.
    - "sequence" (original GRPO ["grpo"]): mean over sequences of each sequence's token
      mean Σ_t mask·l / max(Σ_t mask, 1).

    stats: "clip_fraction" with old_logprobs; "kl", the token mean of k3 over the mask
    (masked_mean, whatever the normaliser: the figure the monitors and charts read), with
    ref_logprobs.
    """
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # (B, 1)
    stats: dict[str, float] = {}
    if old_logprobs is None:
        ratio = torch.exp(logprobs - logprobs.detach())  # (B, T), == 1 in value
        per_token = -ratio * adv
    else:
        ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
        unclipped = ratio * adv
        clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
        per_token = -torch.minimum(unclipped, clipped)
        with torch.no_grad():
            # Share of tokens where the clipped term wins the min (their gradient is zero).
            stats["clip_fraction"] = float(masked_mean((clipped < unclipped).float(), mask))
    if sampling_weights is not None:
        per_token = per_token * sampling_weights.detach().to(per_token.dtype)
    if beta > 0 and ref_logprobs is None:
        raise ValueError("a KL penalty (beta > 0) needs the reference's log-probs")
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs)  # (B, T)
        stats["kl"] = float(masked_mean(kl.detach(), mask))
        if beta > 0:  # skipped at β = 0: 0 · k3 is NaN where k3 overflows
            per_token = per_token + beta * kl
    return normalised(per_token, mask, normaliser=normaliser, constant=constant), stats


def sampling_correction(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float = 3.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights of tokens sampled by another engine (Ionides 2008;
    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; TRL's `vllm_importance_sampling_correction` in "token_truncate" mode):

        w_{b,t} = min(exp(log π_θ(y_t) - log q(y_t)), cap)

    q is the distribution the sampler drew y_t from (vLLM's processed log-probs: after the
    structured-output mask, the temperature and top-p), π_θ the trainer's policy at the
    same temperature. E_q[w · ∇log π_θ] = E_π[∇log π_θ] on the tokens q can produce;
    truncating at `cap` bounds the variance for a small bias. Where a constraint forced a
    token (q = 1) that the policy gives p < 1, w = p < 1: the update leans less on choices
    the policy did not make itself. Without a constraint and on the same weights, w ≈ 1.
    No lower bound (TRL's default `vllm_importance_sampling_clip_min=None`). A NaN in
    sampler_logprobs marks a token whose q the sampler did not report: its weight is 1
    (ratio and gap 0), as if on-policy, rather than a NaN in the loss.

    logprobs, sampler_logprobs, mask: (B, T); logprobs are detached here (the weight is a
    constant of the gradient). Returns (weights (B, T), 0 outside the mask; stats):
    "sampling_weight_mean" (token mean over the mask), "sampling_truncated_share" (share
    of tokens at the cap) and "sampler_logprob_gap" (token mean of |log π_θ - log q|, the
    figure TRL logs as sampling_logp_difference)."""
    m = mask.to(logprobs.dtype)  # (B, T)
    sampler = sampler_logprobs.to(logprobs.dtype)
    sampler = torch.where(torch.isnan(sampler), logprobs.detach(), sampler)  # (B, T)
    # Selected, not multiplied, by the mask: a padded position may hold ±inf, and inf · 0 is NaN.
    log_ratio = torch.where(m > 0, logprobs.detach() - sampler, torch.zeros_like(sampler))  # (B, T)
    raw = torch.exp(log_ratio)  # (B, T)
    weights = torch.where(m > 0, raw.clamp(max=cap), torch.zeros_like(raw))  # (B, T)
    stats = {
        "sampling_weight_mean": float(masked_mean(weights, m)),
        "sampling_truncated_share": float(masked_mean((raw >= cap).to(m.dtype), m)),
        "sampler_logprob_gap": float(masked_mean(log_ratio.abs(), m)),
    }
    return weights, stats


def hint_weights(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    hinted: torch.Tensor,
    *,
    cap: float = 3.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token truncated importance weights of hinted GRPO: samples drawn from the policy
    with an operator's comment h in its context, trained on by the policy without it.

    For an item x whose G samples all scored the same, K more y ~ π_b(· | x, h) are drawn,
    π_b being the policy at sampling time with the hint (detached). Every sample is scored
    under the student's own context x, and the policy term of `policy_loss` is weighed by

        w_{b,t} = 1                                                       y_b ~ π_θ(· | x)
        w_{b,t} = min(π_θ(y_{b,t} | x, y_{b,<t}) / π_b(y_{b,t} | x, h, y_{b,<t}), C)   y_b ~ π_b

    so the step ascends  (1/Z) Σ_b Σ_t m_{b,t} · w_{b,t} · A_b · ∇log π_θ(y_{b,t} | x, y_{b,<t}),
    A_b the group advantage over all G + K rewards of the item. With E_{π_b}[π_θ/π_b · f] =
    E_{π_θ}[f], this is an off-policy estimate of the student's own objective, not of the
    hinted policy's. The ratio is per token, as PPO's and TRL's "token_truncate" are: the
    exact sequence weight Π_t π_θ/π_b has a variance that grows with the length, and the
    per-token one ignores that the prefix was drawn with the hint (a bias, the price of a
    bounded variance). Truncating at C (Ionides 2008; the cap of `sampling_correction`)
    bounds what one hinted token can weigh; there is no lower bound, so a hinted token the
    student would not say (π_θ ≪ π_b) carries almost no gradient: the comment only teaches
    what the student already gives some mass to.

    logprobs, behaviour_logprobs, mask: (B, T) (logprobs detached here: the weight is a
    constant of the gradient); hinted: (B,) bool, the rows drawn with the hint. Returns
    (weights (B, T), 0 outside the mask; stats over the hinted rows' masked tokens:
    "hint_weight_mean" and "hint_truncated_share", the share at the cap; both 0 when no
    hinted token is in the mask)."""
    m = mask.to(logprobs.dtype)  # (B, T)
    rows = hinted.to(torch.bool).unsqueeze(1) & (m > 0)  # (B, T) hinted tokens being trained
    # Selected, not multiplied: a padded position may hold ±inf, and inf · 0 is NaN.
    log_ratio = torch.where(rows, logprobs.detach() - behaviour_logprobs.to(logprobs.dtype), torch.zeros_like(m))
    raw = torch.exp(log_ratio)  # (B, T)
    weights = torch.where(rows, raw.clamp(max=cap), m)  # (B, T): 1 on plain tokens, 0 on padding
    hinted_mask = rows.to(m.dtype)
    stats = {
        "hint_weight_mean": float(masked_mean(weights, hinted_mask)),
        "hint_truncated_share": float(masked_mean((raw >= cap).to(m.dtype), hinted_mask)),
    }
    return weights, stats


def normalised(
    per_token: torch.Tensor, mask: torch.Tensor, *, normaliser: Normaliser, constant: float | None = None
) -> torch.Tensor:
    """Reduce per-token losses (B, T) over `mask` (B, T) to a scalar:
    "constant": Σ mask·l / constant (B x T when None); "token": Σ mask·l / max(Σ mask, 1);
    "sequence": mean over b of Σ_t mask·l / max(Σ_t mask, 1)."""
    if normaliser == "constant":
        denom = float(constant) if constant is not None else float(mask.numel())
        return masked_sum(per_token, mask) / denom
    if normaliser == "token":
        return masked_mean(per_token, mask)
    if normaliser == "sequence":
        return masked_mean(per_token, mask, dim=1).mean()
    raise ValueError(f"unknown normaliser {normaliser!r}")


def micro_batch_scale(mask: torch.Tensor, *, normaliser: Normaliser, batch_tokens: float, batch_rows: int) -> float:
    """The factor s_k that makes the micro-batches' losses add up to the batch's loss,
    Σ_k s_k · L_k = L, when each micro-batch k's loss L_k is `normalised` over its own rows.

    mask: (b_k, T) micro-batch k's trained tokens; batch_tokens = Σ mask over the whole
    batch (N); batch_rows = rows in the whole batch (B). With n_k = Σ mask_k, b_k its rows:
    - "constant": s_k = 1, provided every L_k is divided by the same constant (pass it:
      the default B x T would be each micro-batch's own b_k x T);
    - "token": L = Σ m·l / N and L_k = Σ_k m·l / n_k, so s_k = n_k / N (0 when N = 0,
      where the batch's loss is 0 too: `masked_mean` clamps the count at 1);
    - "sequence": L = (1/B) Σ_b mean_b and L_k = (1/b_k) Σ_{b∈k} mean_b, so s_k = b_k / B.
    The gradients add up the same way, so accumulating s_k · ∇L_k over the micro-batches
    gives the batch's gradient."""
    if normaliser == "constant":
        return 1.0
    if normaliser == "token":
        return float(mask.sum()) / batch_tokens if batch_tokens > 0 else 0.0
    if normaliser == "sequence":
        return mask.shape[0] / batch_rows
    raise ValueError(f"unknown normaliser {normaliser!r}")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) on tokens sampled from π_θ (Schulman 2020).

    k3 = exp(r) - r - 1 with r = log π_ref(y_t) - log π_θ(y_t). Unbiased, always ≥ 0,
    low variance. Element-wise, any shape: (B, T) → (B, T); average it with `masked_mean`.
    `training.promotion.evaluation.metrics.kl_k3` uses it to compare two versions on evaluation items."""
    log_ratio = ref_logprobs - logprobs  # (B, T)
    return torch.exp(log_ratio) - log_ratio - 1.0


def distill_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    normaliser: Normaliser = "token",
) -> torch.Tensor:
    """Reverse KL of on-policy distillation: KL(p_student ‖ p_teacher) at every sampled
    position, computed exactly over the vocabulary, to minimise.

    student_logits, teacher_logits: (B, T, V) predicting the same tokens (the student's
    own samples); mask: (B, T). Per token: Σ_v p_s(v) · (log p_s(v) - log p_t(v)). The
    teacher is treated as a constant (its logits are detached). Normaliser as in
    `policy_loss` ("token": mean over trained tokens; "sequence": mean of per-sequence
    means; "constant": sum / (B x T))."""
    log_s = torch.log_softmax(student_logits.float(), dim=-1)  # (B, T, V)
    log_t = torch.log_softmax(teacher_logits.detach().float(), dim=-1)  # (B, T, V)
    per_token = (log_s.exp() * (log_s - log_t)).sum(dim=-1)  # (B, T)
    return normalised(per_token, mask, normaliser=normaliser)


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, first_token_weight: float = 1.0) -> torch.Tensor:
    """Weighted negative log-likelihood of target tokens: -Σ w·mask·logp / Σ w·mask, where
    w = `first_token_weight` on each row's first target token and 1 elsewhere (w ≡ 1 is
    the token mean).

    The first token of an agent's turn decides its action — a tool call or a reply — and
    is one of ~30 target tokens, so under the plain token mean a model learns the
    templates around a decision long before the decision itself.

    logprobs: (B, T) log π_θ of the target tokens; mask: (B, T), each row's target a
    contiguous run of ones."""
    weights = sft_token_weights(mask, first_token_weight)
    return -(logprobs * weights).sum() / weights.sum().clamp(min=1e-8)


def sft_token_weights(mask: torch.Tensor, first_token_weight: float = 1.0) -> torch.Tensor:
    """(B, T) the weights w·mask of `sft_loss`: `first_token_weight` on each row's first
    target token, 1 on the others, 0 off the targets. Their sum is the loss's normaliser
    (a data-parallel step divides by the sum over every process's rows)."""
    weights = mask.clone()
    if first_token_weight != 1.0:
        first = (mask.cumsum(dim=1) == 1) & (mask > 0)
        weights = torch.where(first, mask * first_token_weight, weights)
    return weights
