"""Agreement between the judge and people: pure functions, no database.

- Cohen's κ (unweighted for pass/fail; linear or quadratic weights for ordinal scores),
  with a percentile bootstrap confidence interval (seeded, so a page shows the same
  interval on every load).
- Spearman's rho (Pearson on average ranks, so ties are handled), with a Fisher-z
  interval using the Bonett-Wright standard error sqrt((1 + rho²/2) / (n - 3)).

Percent agreement is reported beside κ but overstates reliability when one label
dominates; κ corrects for the agreement expected by chance.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from math import atanh, sqrt, tanh
from statistics import NormalDist

import numpy as np

BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float | None  # None when undefined (e.g. both raters used one label only)
    n: int
    low: float | None = None
    high: float | None = None


def _weights(k: int, weights: str | None) -> np.ndarray:
    i, j = np.indices((k, k))
    if weights is None:
        return (i != j).astype(float)
    if k == 1:
        return np.zeros((1, 1))
    if weights == "linear":
        return np.abs(i - j) / (k - 1)
    if weights == "quadratic":
        return ((i - j) / (k - 1)) ** 2
    raise ValueError(f"weights must be None, 'linear' or 'quadratic', not {weights!r}")


def _encode(a: Sequence[Hashable], b: Sequence[Hashable], categories: Sequence[Hashable] | None):
    if len(a) != len(b):
        raise ValueError(f"the two raters labelled different numbers of items ({len(a)} vs {len(b)})")
    if categories is None:
        categories = sorted(set(a) | set(b), key=lambda c: (str(type(c)), c))
    index = {c: n for n, c in enumerate(categories)}
    try:
        ia = np.array([index[x] for x in a], dtype=np.int64)
        ib = np.array([index[x] for x in b], dtype=np.int64)
    except KeyError as exc:
        raise ValueError(f"label {exc.args[0]!r} is not among the categories") from exc
    return ia, ib, len(categories)


def _kappa_from_indices(ia: np.ndarray, ib: np.ndarray, k: int, w: np.ndarray) -> float | None:
    n = len(ia)
    if n == 0:
        return None
    observed = np.bincount(ia * k + ib, minlength=k * k).reshape(k, k) / n
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    disagreement_expected = float((w * expected).sum())
    if disagreement_expected <= 1e-12:
        return None
    return 1.0 - float((w * observed).sum()) / disagreement_expected


def cohen_kappa(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    *,
    weights: str | None = None,
    categories: Sequence[Hashable] | None = None,
) -> float | None:
    """κ = 1 - Σ w·O / Σ w·E, where O is the observed joint distribution of the two
    raters' labels, E the product of its margins (chance), and w the disagreement
    weights: 0 on the diagonal and 1 off it (unweighted), |i-j|/(k-1) (linear) or
    ((i-j)/(k-1))² (quadratic). For weighted κ `categories` gives their order.
    None when chance disagreement is zero (both raters used a single label)."""
    ia, ib, k = _encode(a, b, categories)
    return _kappa_from_indices(ia, ib, k, _weights(k, weights))


def kappa_estimate(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    *,
    weights: str | None = None,
    categories: Sequence[Hashable] | None = None,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """κ with a percentile bootstrap interval over items (resamples where κ is undefined
    are dropped; no interval when fewer than half remain)."""
    ia, ib, k = _encode(a, b, categories)
    w = _weights(k, weights)
    value = _kappa_from_indices(ia, ib, k, w)
    n = len(ia)
    if value is None or n < 2:
        return Estimate(value, n)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    stats = [s for row in draws if (s := _kappa_from_indices(ia[row], ib[row], k, w)) is not None]
    if len(stats) < resamples / 2:
        return Estimate(value, n)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return Estimate(value, n, float(low), float(high))


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks. None when either side is
    constant (no ordering to agree with) or there are fewer than two items."""
    if len(x) != len(y):
        raise ValueError(f"different numbers of items ({len(x)} vs {len(y)})")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    if denom == 0:
        return None
    return float((dx * dy).sum()) / denom


def spearman_estimate(x: Sequence[float], y: Sequence[float], *, level: float = 0.95) -> Estimate:
    """rho with a Fisher-z interval: tanh(atanh rho ± z·sqrt((1 + rho²/2)/(n - 3))) (Bonett &
    Wright 2000); no interval for n ≤ 3."""
    rho = spearman(x, y)
    n = len(x)
    if rho is None or n <= 3:
        return Estimate(rho, n)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    clipped = max(min(rho, 1 - 1e-12), -1 + 1e-12)
    se = sqrt((1 + rho * rho / 2) / (n - 3))
    centre = atanh(clipped)
    return Estimate(rho, n, tanh(centre - z * se), tanh(centre + z * se))


def percent_agreement(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    if len(a) != len(b):
        raise ValueError("different numbers of items")
    if not a:
        return None
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def reward_to_ordinal(reward: float, *, levels: int = 5) -> int:
    """A reward in [0, 1] on a 1..levels scale (0 → 1, 1 → levels), for weighted κ
    against people's 1-5 ratings."""
    return int(min(levels, max(1, round(reward * (levels - 1)) + 1)))
