"""The mean over seeds and its 95 % t interval, against a hand computation."""

from __future__ import annotations

import math

import pytest

from training.promotion.evaluation.seeds import interval_text, mean_interval


def test_three_seeds_by_hand():
    # mean 0.6; deviations -0.1, 0, 0.1 → s = sqrt(0.02 / 2) = 0.1; t(0.975, 2) = 4.303
    mean, low, high = mean_interval([0.5, 0.6, 0.7])
    half = 4.303 * 0.1 / math.sqrt(3)
    assert mean == pytest.approx(0.6)
    assert (low, high) == (pytest.approx(0.6 - half), pytest.approx(0.6 + half))
    assert interval_text([0.5, 0.6, 0.7]) == f"0.600 [{0.6 - half:.3f}, {0.6 + half:.3f}]"


def test_equal_runs_have_no_spread_and_one_run_no_interval():
    assert mean_interval([0.25, 0.25]) == (0.25, 0.25, 0.25)
    assert mean_interval([0.4]) == (0.4, 0.4, 0.4) and interval_text([0.4]) == "0.400"
    with pytest.raises(ValueError):
        mean_interval([])
