"""Figures over repeated runs (seeds): the mean and its 95 % Student t interval.

A recipe measured with three seeds gives three rates; what it reliably does is their
mean, with an interval as wide as their spread says: half-width t(0.975, n - 1) · s / √n,
s the sample standard deviation (n - 1 in the denominator). With one run the interval is
the point itself (no spread to measure): report how many seeds an interval stands on."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from training.promotion.evaluation import metrics

# Two-sided 95 % quantiles of Student's t by degrees of freedom (1 to 30); 1.96 beyond.
T_95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its 95 % t interval (the evaluation's
    mean interval with t(0.975, n - 1) in place of z)."""
    if not values:
        raise ValueError("no values")
    mean = fmean(values)
    n = len(values)
    if n < 2:
        return mean, mean, mean
    t = T_95[n - 2] if n - 1 <= len(T_95) else 1.959963984540054
    low, high = metrics.mean_interval(values, z=t)
    return mean, low, high


def interval_text(values: Sequence[float]) -> str:
    """'0.812 [0.701, 0.923]' (or the single value with one run)."""
    return interval_format(mean_interval(values), len(values))


def interval_format(interval: tuple[float, float, float], runs: int) -> str:
    """A computed (mean, low, high) as `interval_text` writes it, for `runs` values."""
    mean, low, high = interval
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]" if runs > 1 else f"{mean:.3f}"
