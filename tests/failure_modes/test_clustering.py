"""Clustering failure notes: ARI by hand, and seeded groups recovered from embeddings."""

from __future__ import annotations

import pytest

from feedback.failure_modes.clustering import adjusted_rand_index, cluster_texts, keyword_name
from tests.failure_modes.seeded import GROUPS, seeded_notes


def test_adjusted_rand_index_by_hand():
    # Contingency counts 2, 1, 1, 2: sum C(n_ij, 2) = 2. Truth sizes (3, 3): sum C = 6;
    # predicted sizes (2, 2, 2): sum C = 3; C(6, 2) = 15; expected = 6 * 3 / 15 = 1.2;
    # max = (6 + 3) / 2 = 4.5 -> ARI = (2 - 1.2) / (4.5 - 1.2) = 8/33.
    assert adjusted_rand_index([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]) == pytest.approx(8 / 33)
    assert adjusted_rand_index("aabb", [5, 5, 7, 7]) == 1.0
    assert adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)


def test_seeded_notes_are_clustered_into_their_groups():
    texts, truth = seeded_notes(12, seed=7)
    clustering = cluster_texts(texts)
    ari = adjusted_rand_index(truth, clustering.labels.tolist())
    print(f"\nseeded notes: {len(texts)} in {len(GROUPS)} groups -> {clustering.count} clusters, ARI {ari:.3f}")
    assert ari >= 0.8
    assert clustering.count == len(GROUPS)


def test_keyword_name_picks_words_that_set_the_cluster_apart():
    inside = ["replied in English to a German speaker", "answer in German please, not English"]
    outside = ["order was not looked up", "rude reply to the customer", "German order"]
    # "english" is in both inside notes and no outside one; "german" in both inside and one outside.
    assert keyword_name(inside, outside, words=2) == "english / german"
