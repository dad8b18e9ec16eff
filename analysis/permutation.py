"""Exact two-sample tests at the repeat counts people run, and Holm's correction over many pairs.

With a few runs per side no distribution can be checked, so the test is the one that needs none: under
"no difference" every relabelling of the pooled runs into two groups of the same sizes is equally likely,
and the p-value is the share of relabellings whose statistic is at least as extreme as the observed one
(scipy.stats.permutation_test over all of them). Its smallest value is set by the counts alone,
2 / C(n1 + n2, n1) two-sided: 0.33 at 2 runs each, 0.10 at 3, 0.029 at 4. A test that reports less at
those counts (the large-sample log-rank's 0.025 at 3 each) is wrong about its own error rate.

Where the relabellings are too many to enumerate, the p-value comes from R relabellings drawn at random from
a fixed seed (`monte_carlo_p`): p = (b + 1) / (R + 1), b the drawn relabellings at least as extreme as the
observed split, counted once per tail and the smaller tail doubled as above. Counting the observed split among
the relabellings keeps the chance of p <= alpha at most alpha for every number of runs, where a large-sample
test (Welch's t distribution, the log-rank's chi-square) is only close to it: the log-rank's chi-square calls
identical strategies different 6.7% of the time at 8 runs each (docs/statistics.md). With one fixed seed the
guarantee holds averaged over seeds, not for every seed (Hemerik & Goeman 2018).

- R. A. Fisher, *The Design of Experiments*, 1935, section 21 (the randomisation test).
- S. Holm, "A simple sequentially rejective multiple test procedure", *Scandinavian Journal of Statistics*
  6, 1979.
- J. Hemerik and J. Goeman, "Exact testing with random permutations", *TEST* 27, 2018.
- E. Chung and J. P. Romano, "Exact and asymptotically robust permutation tests", *Annals of Statistics* 41,
  2013 (the studentized statistic keeps the permutation test valid under unequal variances).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from scipy import stats

SIGNIFICANCE = 0.05
# Relabellings enumerated at most (7 against 7 is 3,432, 8 against 8 is 12,870): beyond, R relabellings are
# drawn (`monte_carlo_p`).
EXACT_LIMIT = 5_000
# Drawn relabellings: the smallest p is 2 / (R + 1) = 0.0002, below 0.05 after Holm over 15 pairs (R >= 299
# would do); R + 1 = 10,000, so that alpha (R + 1) is a whole count.
MONTE_CARLO_RESAMPLES = 9_999
MONTE_CARLO_SEED = 2018  # fixed: the same runs give the same p
MONTE_CARLO = f"Monte Carlo permutation, R={MONTE_CARLO_RESAMPLES} relabellings drawn with seed {MONTE_CARLO_SEED}"
MAX_REPEATS = 1000


def relabellings(n1: int, n2: int) -> int:
    """How many ways the pooled n1 + n2 runs split into groups of n1 and n2."""
    return math.comb(n1 + n2, n1)


def is_exact(n1: int, n2: int) -> bool:
    """Whether `exact_p` enumerates every relabelling of these counts."""
    return n1 >= 1 and n2 >= 1 and relabellings(n1, n2) <= EXACT_LIMIT


def smallest_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value any exact permutation test can give at these counts: the observed
    split is the most extreme of all, and so is its mirror image."""
    return min(1.0, 2 / relabellings(n1, n2))


def repeats_for_a_verdict(pairs: int = 1, alpha: float = SIGNIFICANCE) -> int:
    """The smallest number of runs per side at which an exact test can reach `alpha` after Holm's correction
    over `pairs` comparisons (whose smallest adjusted p is `pairs` x the smallest p)."""
    n = 1
    while pairs * smallest_p(n, n) >= alpha and n < MAX_REPEATS:
        n += 1
    return n


def exact_p(
    x: np.ndarray, y: np.ndarray, statistic: Callable[[np.ndarray, np.ndarray], float], vectorized: bool
) -> float:
    """Two-sided p of `statistic(x, y)` over every relabelling of the pooled samples (scipy's exact
    permutation test: n_resamples at least the number of relabellings enumerates them all)."""
    if min(len(x), len(y)) < 2:
        return _one_against_many(x, y, statistic)
    result = stats.permutation_test(
        (x, y),
        statistic,
        permutation_type="independent",
        vectorized=vectorized,
        n_resamples=np.inf,
        alternative="two-sided",
    )
    return float(result.pvalue)


def monte_carlo_p(
    x: np.ndarray,
    y: np.ndarray,
    statistic: Callable[..., np.ndarray],
    resamples: int = MONTE_CARLO_RESAMPLES,
    seed: int = MONTE_CARLO_SEED,
) -> float:
    """Two-sided p of `statistic(x, y, axis=-1)` (vectorized) over `resamples` relabellings drawn from `seed`,
    the observed split counted among them: (b + 1) / (R + 1) per tail, the smaller doubled, as
    scipy.stats.permutation_test counts with finite n_resamples; so p <= alpha happens at most alpha of the
    time when the runs are exchangeable."""
    return float(monte_carlo_p_of_many(x[None], y[None], statistic, resamples, seed)[0])


def monte_carlo_p_of_many(
    x: np.ndarray,
    y: np.ndarray,
    statistic: Callable[..., np.ndarray],
    resamples: int = MONTE_CARLO_RESAMPLES,
    seed: int = MONTE_CARLO_SEED,
    chunk: int = 32,
) -> np.ndarray:
    """`monte_carlo_p` of row i of `x` (pairs, n1) against row i of `y` (pairs, n2), every row relabelled by the
    same drawn permutations (`drawn_relabellings`), so a row's p is the one `monte_carlo_p` gives it alone.

    Not scipy.stats.permutation_test itself: it draws each relabelling with a call of its own (50 ms at R =
    9,999), which a calibration over tens of thousands of pairs cannot afford; the count and the ties
    (`tie_margin`) are its."""
    n1 = x.shape[-1]
    order = drawn_relabellings(n1 + y.shape[-1], resamples, seed)
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], chunk):
        stop = start + chunk
        observed = np.asarray(statistic(x[start:stop], y[start:stop], axis=-1), dtype=float)[:, None]
        shuffled = np.concatenate([x[start:stop], y[start:stop]], axis=-1)[:, order]  # (rows, R, n)
        null = statistic(shuffled[..., :n1], shuffled[..., n1:], axis=-1)
        margin = tie_margin(observed)
        less = (np.count_nonzero(null <= observed + margin, axis=-1) + 1) / (resamples + 1)
        greater = (np.count_nonzero(null >= observed - margin, axis=-1) + 1) / (resamples + 1)
        out[start:stop] = np.minimum(1.0, 2 * np.minimum(less, greater))
    return out


@lru_cache(maxsize=16)
def drawn_relabellings(runs: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, runs) random orders of the pooled runs, drawn at once from `seed`: the first n1 of each
    order are the relabelled a side. Read-only: shared by every call with these arguments."""
    order = np.random.default_rng(seed).permuted(np.tile(np.arange(runs), (resamples, 1)), axis=1)
    order.flags.writeable = False
    return order


def exact_p_of_many(
    x: np.ndarray, y: np.ndarray, statistic: Callable[..., np.ndarray], chunk: int = 2_000
) -> np.ndarray:
    """`exact_p` of many pairs of samples of the same sizes at once: row i of `x` (pairs, n1) against row i of
    `y` (pairs, n2), two runs or more a side, `statistic` vectorized with an `axis` argument. The same scipy
    test as exact_p, batched along the first axis (`chunk` pairs per call, which bounds the relabellings held
    at once): an A/A calibration tests thousands of splits of one pool, and one call per split is most of
    its time."""
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0] or min(x.shape[1], y.shape[1]) < 2:
        raise ValueError("exact_p_of_many takes (pairs, n1) and (pairs, n2) arrays with n1, n2 >= 2")
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], chunk):
        stop = start + chunk
        result = stats.permutation_test(
            (x[start:stop], y[start:stop]),
            statistic,
            permutation_type="independent",
            vectorized=True,
            n_resamples=np.inf,
            alternative="two-sided",
            axis=-1,
        )
        out[start:stop] = result.pvalue
    return out


def tie_margin(observed: np.ndarray | float) -> np.ndarray:
    """How far a relabelling's statistic may lie past the observed one and still count as extreme: scipy.stats.
    permutation_test's 100 machine epsilons of the observed value (2.2e-14 of it, nothing at 0), so a p counted
    here is the one scipy would count. 0 where the observed value is infinite (Welch's t of sides with no
    spread), where only an equal infinity ties and scipy's product would be infinite."""
    observed = np.asarray(observed, dtype=float)
    return np.where(np.isfinite(observed), np.abs(np.finfo(float).eps * 100 * observed), 0.0)


def _one_against_many(x: np.ndarray, y: np.ndarray, statistic: Callable[[np.ndarray, np.ndarray], float]) -> float:
    """A side of one run, which scipy's permutation_test refuses: its n1 + n2 relabellings (which run is the
    lone one) enumerated here, the p-value counted as scipy counts it (twice the smaller tail, ties within
    `tie_margin` counted as extreme)."""
    pooled = np.concatenate([x, y])
    lone = len(x) == 1
    observed = statistic(x, y)
    null = []
    for i in range(pooled.size):
        one, rest = pooled[i : i + 1], np.delete(pooled, i)
        null.append(statistic(one, rest) if lone else statistic(rest, one))
    values = np.asarray(null, dtype=float)
    margin = float(tie_margin(observed))
    less = np.mean(values <= observed + margin)
    greater = np.mean(values >= observed - margin)
    return float(min(1.0, 2 * min(less, greater)))


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """The difference of the means: on logarithms, the log of the ratio of geometric means.

    Each side is summed in sorted order: two relabellings that hold the same values (a value both sides
    share, moved across) must give the same statistic to the last bit, and a sum in another order differs
    there by more than the `tie_margin` scipy allows for ties; a p-value would then depend on which side
    is called a."""
    return np.sort(x, axis=axis).mean(axis=axis) - np.sort(y, axis=axis).mean(axis=axis)


def welch_t(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Welch's t statistic, the difference of the means over its unpooled standard error: studentized, so a
    permutation test of it stays valid when the sides' variances and sizes differ (Chung & Romano 2013). Each
    side sorted first, as in `mean_difference`; a relabelling with no spread on either side is +-inf (0 where
    the means are equal too)."""
    x, y = np.sort(x, axis=axis), np.sort(y, axis=axis)
    difference = x.mean(axis=axis) - y.mean(axis=axis)
    spread = x.var(axis=axis, ddof=1) / x.shape[axis] + y.var(axis=axis, ddof=1) / y.shape[axis]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = difference / np.sqrt(spread)
    return np.where(spread > 0, t, np.where(difference == 0, 0.0, np.copysign(np.inf, difference)))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values of one family of comparisons (None: no test, left out
    of the family). The i-th smallest of m is multiplied by m - i + 1, made non-decreasing, capped at 1;
    rejecting where the adjusted p is below alpha keeps the chance of any false verdict in the family at
    alpha, whatever the dependence between the comparisons. scipy.stats has no Holm (its
    false_discovery_control controls the false discovery rate, a weaker promise)."""
    tested = [(p, i) for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(tested)):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted
