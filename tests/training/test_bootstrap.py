"""The task bootstrap of a gain in success: resampling tasks within their kind and seeds,
checked against distributions worked out by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain, task_bootstrap_replicates


def pairs(diffs: list[int], *, seed=0, kinds: list[str] | None = None, prefix: str = "t") -> list[PairedEpisode]:
    """One pair per difference: +1 the candidate succeeded where the base failed, -1 the
    reverse, 0 both the same (here both failed)."""
    out = []
    for i, d in enumerate(diffs):
        base, cand = {1: (0.0, 1.0), -1: (1.0, 0.0), 0: (0.0, 0.0)}[d]
        kind = kinds[i] if kinds else ""
        out.append(PairedEpisode(seed=seed, task=f"{prefix}{i}", kind=kind, base=base, candidate=cand))
    return out


def shares(replicates: list[float]) -> dict[float, float]:
    counts = Counter(round(r, 6) for r in replicates)
    return {k: v / len(replicates) for k, v in counts.items()}


def test_equal_differences_give_a_point_interval():
    gain = task_bootstrap_gain(pairs([1, 1, 1, 1]))
    assert (gain.mean, gain.ci_low, gain.ci_high) == (1.0, 1.0, 1.0)
    assert (gain.tasks, gain.seeds, gain.pairs, gain.method) == (4, 1, 4, "task-bootstrap")
    assert task_bootstrap_gain([]) is None


def test_one_seed_resamples_tasks_as_the_hand_computed_binomial():
    # Three tasks, differences 1, 0, 0: a resample's mean is k/3 with k ~ Binomial(3, 1/3):
    # P(0) = 8/27, P(1/3) = 12/27, P(2/3) = 6/27, P(1) = 1/27.
    replicates = task_bootstrap_replicates(pairs([1, 0, 0]), resamples=20_000, rng_seed=1)
    got = shares(replicates)
    for value, p in ((0.0, 8 / 27), (1 / 3, 12 / 27), (2 / 3, 6 / 27), (1.0, 1 / 27)):
        assert got.get(round(value, 6), 0.0) == pytest.approx(p, abs=0.012), value
    # The 97.5 % point: P(k ≤ 2) = 26/27 = 0.963 < 0.975, so the upper end is 1; the lower is 0.
    gain = task_bootstrap_gain(pairs([1, 0, 0]), resamples=20_000)
    assert gain.mean == pytest.approx(1 / 3) and (gain.ci_low, gain.ci_high) == (0.0, 1.0)


def test_strata_keep_the_mix_of_kinds():
    # Two kinds, one always gained, one never: every stratified resample holds two of each,
    # so the gain is 0.5 exactly; pooled in one stratum the same pairs spread from 0 to 1
    # (four tasks all of the never-gained kind: 1/16 > 2.5 %).
    stratified = task_bootstrap_gain(pairs([1, 1, 0, 0], kinds=["late", "late", "recent", "recent"]))
    assert (stratified.mean, stratified.ci_low, stratified.ci_high) == (0.5, 0.5, 0.5)
    pooled = task_bootstrap_gain(pairs([1, 1, 0, 0]))
    assert (pooled.mean, pooled.ci_low, pooled.ci_high) == (0.5, 0.0, 1.0)


def test_kinds_of_one_task_are_pooled_instead_of_frozen():
    # Three kinds of one task each, differences 1, 0, 0: resampled within their own kind each
    # task would come back once in every replicate (a zero-width interval); pooled they are
    # the one-seed binomial of three tasks: P(mean = 0) = 8/27, P(1) = 1/27.
    replicates = task_bootstrap_replicates(pairs([1, 0, 0], kinds=["a", "b", "c"]), resamples=20_000, rng_seed=1)
    got = shares(replicates)
    assert got[0.0] == pytest.approx(8 / 27, abs=0.015)
    assert got[1.0] == pytest.approx(1 / 27, abs=0.01)
    # A lone one-task kind beside larger ones joins the largest: kind "a" (differences 1, 0)
    # and kind "b" (one task, 0) resample as one stratum of three tasks.
    replicates = task_bootstrap_replicates(pairs([1, 0, 0], kinds=["a", "a", "b"]), resamples=20_000, rng_seed=1)
    assert shares(replicates)[0.0] == pytest.approx(8 / 27, abs=0.015)


def test_seeds_are_resampled_too():
    # One task, played in two seeds, gained in one: the resampled seeds give 0, 1/2 and 1
    # with probabilities 1/4, 1/2, 1/4.
    two_seeds = pairs([1], seed=0) + pairs([0], seed=1)
    got = shares(task_bootstrap_replicates(two_seeds, resamples=20_000))
    assert got[0.0] == pytest.approx(0.25, abs=0.012) and got[0.5] == pytest.approx(0.5, abs=0.012)
    gain = task_bootstrap_gain(two_seeds)
    assert (gain.mean, gain.ci_low, gain.ci_high, gain.tasks, gain.seeds) == (0.5, 0.0, 1.0, 1, 2)


def test_a_task_missing_from_a_seed_counts_only_where_it_was_played():
    # Seed 0 played a (gain) and b (no change); seed 1 only b (loss). The mean is over the
    # three pairs; a replicate drawing task a and only seed 1 has no pair and is drawn again.
    played = [
        PairedEpisode(seed=0, task="a", kind="", base=0.0, candidate=1.0),
        PairedEpisode(seed=0, task="b", kind="", base=0.0, candidate=0.0),
        PairedEpisode(seed=1, task="b", kind="", base=1.0, candidate=0.0),
    ]
    gain = task_bootstrap_gain(played)
    assert gain.mean == 0.0 and gain.pairs == 3 and gain.ci_low == -1.0 and gain.ci_high == 1.0
    assert all(-1.0 <= r <= 1.0 for r in task_bootstrap_replicates(played, resamples=500))


def test_the_interval_is_reproducible_and_wider_than_pairs_counted_as_independent():
    from training.promotion.evaluation.seeds import mean_interval

    # 3 seeds x 20 tasks; the candidate gains on the same 8 tasks in every seed: the
    # seed-to-seed agreement makes pairs look like 60 independent draws, but there are
    # 20 tasks.
    played = [p for s in range(3) for p in pairs([1] * 8 + [0] * 12, seed=s)]
    gain = task_bootstrap_gain(played)
    assert gain == task_bootstrap_gain(played)
    _, low, high = mean_interval([p.candidate - p.base for p in played])
    assert gain.ci_high - gain.ci_low > (high - low) * 1.3
    assert gain.ci_low < 0.4 < gain.ci_high
