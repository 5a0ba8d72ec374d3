"""Agreement statistics against examples worked by hand."""

from __future__ import annotations

import pytest

from feedback.judge.agreement import (
    average_ranks,
    cohen_kappa,
    kappa_estimate,
    percent_agreement,
    reward_to_ordinal,
    spearman,
    spearman_estimate,
)


def test_kappa_two_by_two():
    # 50 items: both yes 20, both no 15, a-yes/b-no 5, a-no/b-yes 10.
    # p_o = 35/50 = 0.7; a says yes 25/50, b says yes 30/50;
    # p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4.
    a = ["yes"] * 20 + ["no"] * 15 + ["yes"] * 5 + ["no"] * 10
    b = ["yes"] * 20 + ["no"] * 15 + ["no"] * 5 + ["yes"] * 10
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert percent_agreement(a, b) == pytest.approx(0.7)


# Three ordered labels, 10 items. Joint counts (rows a, columns b):
#   [[2, 1, 0],
#    [0, 2, 1],
#    [1, 0, 3]]          margins: a = b = (0.3, 0.3, 0.4)
A3 = [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
B3 = [1, 1, 2, 2, 2, 3, 3, 3, 3, 1]


def test_kappa_unweighted_three_labels():
    # p_o = 0.7, p_e = 0.09 + 0.09 + 0.16 = 0.34 -> (0.7 - 0.34) / 0.66 = 6/11.
    assert cohen_kappa(A3, B3) == pytest.approx(6 / 11)


def test_kappa_linear_weights():
    # w = |i-j|/2. Observed disagreement: 0.1*0.5 + 0.1*0.5 + 0.1*1 = 0.2.
    # Chance: 2*(0.09*0.5) + 2*(0.12*1) + 2*(0.12*0.5) = 0.45 -> 1 - 0.2/0.45 = 5/9.
    assert cohen_kappa(A3, B3, weights="linear", categories=[1, 2, 3]) == pytest.approx(5 / 9)


def test_kappa_quadratic_weights():
    # w = ((i-j)/2)^2. Observed: 0.1*0.25 + 0.1*0.25 + 0.1*1 = 0.15.
    # Chance: 2*(0.09*0.25) + 2*(0.12*1) + 2*(0.12*0.25) = 0.345 -> 1 - 0.15/0.345 = 13/23.
    assert cohen_kappa(A3, B3, weights="quadratic", categories=[1, 2, 3]) == pytest.approx(13 / 23)


def test_weighted_kappa_counts_unused_categories():
    # With the full 1..5 scale, labels 1 and 3 are two steps apart, not adjacent.
    near = cohen_kappa([1, 3, 1, 3], [1, 3, 3, 1], weights="linear", categories=[1, 2, 3, 4, 5])
    adjacent = cohen_kappa([1, 3, 1, 3], [1, 3, 3, 1], weights="linear", categories=[1, 3])
    assert near == pytest.approx(adjacent)  # the distance is relative to the scale


def test_kappa_undefined_and_bad_input():
    assert cohen_kappa(["pass"] * 5, ["pass"] * 5) is None
    with pytest.raises(ValueError, match="different numbers"):
        cohen_kappa([1, 2], [1])
    with pytest.raises(ValueError, match="not among the categories"):
        cohen_kappa([1, 7], [1, 2], categories=[1, 2])


def test_kappa_interval_is_seeded_and_narrows_with_more_data():
    a = ["yes"] * 20 + ["no"] * 15 + ["yes"] * 5 + ["no"] * 10
    b = ["yes"] * 20 + ["no"] * 15 + ["no"] * 5 + ["yes"] * 10
    small = kappa_estimate(a, b)
    assert small == kappa_estimate(a, b)
    assert small.low < 0.4 < small.high
    big = kappa_estimate(a * 4, b * 4)
    assert big.value == pytest.approx(0.4)
    assert big.high - big.low < small.high - small.low


def test_spearman_without_ties():
    # Ten people's IQ and hours of TV a week: sum of d^2 = 194,
    # rho = 1 - 6*194 / (10*(100-1)) = -29/165.
    iq = [106, 100, 86, 101, 99, 103, 97, 113, 112, 110]
    tv = [7, 27, 2, 50, 28, 29, 20, 12, 6, 17]
    assert spearman(iq, tv) == pytest.approx(-29 / 165)


def test_spearman_with_ties_uses_average_ranks():
    # y ranks (1.5, 1.5, 3.5, 3.5); x ranks (1, 2, 3, 4). Centred: dx = (-1.5, -.5, .5, 1.5),
    # dy = (-1, -1, 1, 1): sum dx*dy = 4, sum dx^2 = 5, sum dy^2 = 4 -> 4 / sqrt(20).
    assert list(average_ranks([1, 1, 2, 2])) == [1.5, 1.5, 3.5, 3.5]
    assert spearman([1, 2, 3, 4], [1, 1, 2, 2]) == pytest.approx(4 / 20**0.5)
    assert spearman([1, 2, 3], [5, 5, 5]) is None


def test_spearman_interval_fisher_z():
    # rho = -29/165, n = 10: atanh(rho) = -0.177602, se = sqrt((1 + rho^2/2) / 7) = 0.380872,
    # 1.959964 * se = 0.746494 -> tanh(-0.924096) = -0.727830, tanh(0.568892) = 0.514547.
    iq = [106, 100, 86, 101, 99, 103, 97, 113, 112, 110]
    tv = [7, 27, 2, 50, 28, 29, 20, 12, 6, 17]
    est = spearman_estimate(iq, tv)
    assert est.n == 10
    assert est.low == pytest.approx(-0.727830, abs=1e-5)
    assert est.high == pytest.approx(0.514547, abs=1e-5)
    assert spearman_estimate([1, 2, 3], [1, 2, 3]).low is None  # n <= 3: no interval


def test_reward_to_ordinal():
    assert [reward_to_ordinal(r) for r in (0.0, 0.1, 0.25, 0.5, 0.74, 0.9, 1.0)] == [1, 1, 2, 3, 4, 5, 5]
