"""The gain in task success (candidate - base) with an interval that counts what varies:
the tasks, stratified by kind, and the seeds (training runs). Pure: no database, no torch.

An evaluation or a tour run pairs a base and a candidate episode by episode: the same task,
the same sampling seed. The pairs are not independent draws: every seed of a tour plays
tasks of one 64-task split, and every pair of one seed shares one trained candidate. An
interval over the (seed, task) pairs as if they were independent is too narrow on both
counts; this one resamples the units that would change if the measurement were repeated.

Procedure (`task_bootstrap_replicates`):

1. Each pair's difference d = candidate - base (success 1 or 0, so d ∈ {-1, 0, 1}), summed
   per cell (seed s, task t): D[s, t] and the number of pairs N[s, t] (a task played twice
   in one seed has N = 2; one a seed did not play has N = 0).
2. The point estimate is the mean difference over all pairs, Σ D / Σ N: the candidate's
   success rate minus the base's when both played the same episodes.
3. A replicate draws, with replacement, as many seeds as were measured (weight w_s = how
   often seed s was drawn) and, within each kind k, as many tasks of kind k as were measured
   (weight v_t): the mix of kinds is the one measured, so a resample cannot, say, hold no
   late delivery at all. A kind with a single task cannot be resampled within itself (every
   replicate would hold that task once, as if it could not have been another), so the kinds
   with one task are pooled into one stratum, and a pool of one task joins the largest kind.
   Its statistic is Σ_s Σ_t w_s v_t D[s, t] / Σ_s Σ_t w_s v_t N[s, t]
   (a replicate whose drawn cells hold no pair is drawn again).
4. The 95 % interval is the percentile interval of the replicates: the values at ranks
   ⌊0.025 B⌋ and ⌈0.975 B⌉ - 1 of the B sorted replicates (0-based), so its ends are
   values a replicate took.

With one seed only the tasks are resampled; with one task only the seeds. The
random generator is seeded (`rng_seed`), so a figure is the same on every run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

METHOD = "task-bootstrap"
RESAMPLES = 4000
MAX_DRAWS = 20  # redraws of a replicate whose cells hold no pair before it is skipped


@dataclass(frozen=True)
class PairedEpisode:
    """One task played by the base and by the candidate with the same sampling seed."""

    seed: Hashable  # the paired run (a tour seed; one evaluation is one seed)
    task: str
    kind: str  # the task's kind ("" when unknown: one stratum)
    base: float  # 1.0 success, 0.0 failure
    candidate: float


@dataclass(frozen=True)
class Gain:
    mean: float
    ci_low: float
    ci_high: float
    tasks: int  # distinct tasks
    seeds: int  # distinct seeds
    pairs: int
    strata: int = 1  # kinds the tasks were stratified by (1: no kinds known)
    method: str = METHOD

    def as_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "method": self.method,
            "tasks": self.tasks,
            "seeds": self.seeds,
            "pairs": self.pairs,
            "strata": self.strata,
        }

    def text(self) -> str:
        """'+0.132 [-0.039, +0.294] (task bootstrap: 64 tasks in 6 kinds x 3 seeds)'."""
        kinds = f" in {self.strata} kinds" if self.strata > 1 else ""
        return (
            f"{self.mean:+.3f} [{self.ci_low:+.3f}, {self.ci_high:+.3f}] "
            f"(task bootstrap: {self.tasks} tasks{kinds} x {self.seeds} seed{'s' if self.seeds != 1 else ''})"
        )


def _cells(pairs: Sequence[PairedEpisode]):
    seeds = list(dict.fromkeys(p.seed for p in pairs))
    tasks = list(dict.fromkeys(p.task for p in pairs))
    kind_of: dict[str, str] = {}
    for p in pairs:
        kind_of.setdefault(p.task, p.kind or "")
    s_index = {s: i for i, s in enumerate(seeds)}
    total = {t: [0.0] * len(seeds) for t in tasks}
    count = {t: [0] * len(seeds) for t in tasks}
    for p in pairs:
        total[p.task][s_index[p.seed]] += float(p.candidate) - float(p.base)
        count[p.task][s_index[p.seed]] += 1
    strata: dict[str, list[str]] = {}
    for t in tasks:
        strata.setdefault(kind_of[t], []).append(t)
    return seeds, tasks, _pooled(strata), total, count


def _pooled(strata: dict[str, list[str]]) -> dict[Hashable, list[str]]:
    """The strata with every kind of one task pooled into one stratum (step 3); a pool of
    one task joins the largest kind."""
    single = [members[0] for members in strata.values() if len(members) == 1]
    kept = {kind: members for kind, members in strata.items() if len(members) > 1}
    if not single:
        return kept
    pool = (object(),)  # a key no kind has
    if len(single) == 1 and kept:
        pool = max(kept, key=lambda kind: len(kept[kind]))
    return {**kept, pool: [*kept.get(pool, []), *single]}


def task_bootstrap_replicates(
    pairs: Sequence[PairedEpisode], *, resamples: int = RESAMPLES, rng_seed: int = 0
) -> list[float]:
    """The bootstrap replicates of the mean gain (steps 1 and 3 of the module's procedure)."""
    if not pairs:
        return []
    seeds, _tasks, strata, total, count = _cells(pairs)
    rng = random.Random(rng_seed)
    n_seeds = len(seeds)
    out: list[float] = []
    for _ in range(resamples):
        for _attempt in range(MAX_DRAWS):
            weights = [0] * n_seeds
            for _s in range(n_seeds):
                weights[rng.randrange(n_seeds)] += 1
            num = den = 0.0
            for members in strata.values():
                for _t in range(len(members)):
                    task = members[rng.randrange(len(members))]
                    row_total, row_count = total[task], count[task]
                    for i, w in enumerate(weights):
                        if w:
                            num += w * row_total[i]
                            den += w * row_count[i]
            if den:
                out.append(num / den)
                break
    return out


def task_bootstrap_gain(
    pairs: Iterable[PairedEpisode], *, resamples: int = RESAMPLES, level: float = 0.95, rng_seed: int = 0
) -> Gain | None:
    """The mean gain in success over the pairs and its percentile interval from a bootstrap
    over tasks (stratified by kind) and seeds (see the module's procedure); None without
    pairs."""
    pairs = list(pairs)
    if not pairs:
        return None
    mean = sum(float(p.candidate) - float(p.base) for p in pairs) / len(pairs)
    replicates = sorted(task_bootstrap_replicates(pairs, resamples=resamples, rng_seed=rng_seed))
    if not replicates:
        return None
    b = len(replicates)
    tail = (1.0 - level) / 2.0
    low = replicates[min(b - 1, math.floor(tail * b))]
    high = replicates[max(0, math.ceil((1.0 - tail) * b) - 1)]
    return Gain(
        mean=mean,
        ci_low=low,
        ci_high=high,
        tasks=len({p.task for p in pairs}),
        seeds=len({p.seed for p in pairs}),
        pairs=len(pairs),
        strata=len({p.kind or "" for p in pairs}),
    )
