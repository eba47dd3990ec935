"""Aggregate per-question scores over k passes into Avg@k and Pass@k, with bootstrap CIs over questions.

A score table is `scores[q][i]`: question q, pass (seed) i, every question with the same number of
passes. numpy is imported only inside the bootstrap, so `import asearch.metrics` stays cheap.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "avg_at_k", "bootstrap_mean", "pass_at_k", "pass_at_k_unbiased"]

ScoreTable = Sequence[Sequence[float]] | Mapping[str, Sequence[float]]

# Bootstrap resamples are drawn in blocks of about this many indices, so 1000 resamples of a
# 100k-question eval need ~8 MB at a time instead of 800 MB.
_BOOTSTRAP_BLOCK = 1_000_000


@dataclass(frozen=True)
class Estimate:
    """A mean over `n` questions with a bootstrap percentile confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} [{self.low:.4f}, {self.high:.4f}] (n={self.n})"


def avg_at_k(scores: ScoreTable, *, n_boot: int = 1000, seed: int = 0, confidence: float = 0.95) -> Estimate:
    """Avg@k: mean over questions of the mean over that question's k passes, with a bootstrap CI."""
    _, table = _score_table(scores)
    per_question = [math.fsum(row) / len(row) for row in table]
    return bootstrap_mean(per_question, n_boot=n_boot, seed=seed, confidence=confidence)


def pass_at_k(
    scores: ScoreTable,
    k: int | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Estimate:
    """Pass@k: mean over questions of the best of k passes, with a bootstrap CI over questions.

    With `k` None (or equal to the number of passes n) each question contributes the max of its
    passes; for non-binary scores such as F1 that is "best-of-n F1". With `k < n` the scores must
    be 0/1 and each question contributes the unbiased estimate `pass_at_k_unbiased(n, c, k)` from
    its c correct passes, i.e. the chance that k passes drawn without replacement hold one success.
    """
    names, table = _score_table(scores)
    n_passes = len(table[0])
    if k is None or k == n_passes:
        per_question = [float(max(row)) for row in table]
    elif not 1 <= k <= n_passes:
        raise ValueError(f"k must be between 1 and the number of passes ({n_passes}), got {k}")
    else:
        per_question = []
        for name, row in zip(names, table, strict=True):
            for i, value in enumerate(row):
                if value not in (0.0, 1.0):
                    raise ValueError(
                        f"{name} pass {i}: score {value!r} is not 0 or 1; pass@k with k={k} < "
                        f"{n_passes} passes uses the unbiased estimator, which needs binary scores "
                        "(threshold them first, or use k=None for the max over passes)"
                    )
            per_question.append(pass_at_k_unbiased(n_passes, int(sum(row)), k))
    return bootstrap_mean(per_question, n_boot=n_boot, seed=seed, confidence=confidence)


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """Chen et al. (2021) unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if n < 1:
        raise ValueError(f"n (samples) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be between 0 and n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # Exact integer binomials; int / int rounds correctly even when both exceed the float range.
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_mean(
    values: Sequence[float], *, n_boot: int = 1000, seed: int = 0, confidence: float = 0.95
) -> Estimate:
    """Mean of `values` with a percentile-bootstrap CI: resample the values with replacement
    `n_boot` times (numpy PCG64 seeded by `seed`), take the (1-confidence)/2 and (1+confidence)/2
    percentiles (linear interpolation) of the resampled means."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < 1:
        raise ValueError(f"n_boot must be an int >= 1, got {n_boot!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    n = len(values)
    if n == 0:
        raise ValueError("cannot estimate a mean from zero values")
    mean = math.fsum(values) / n

    import numpy as np  # here, not at module top: keeps `import asearch.metrics` light

    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boot_means = np.empty(n_boot, dtype=np.float64)
    rows_per_block = max(1, _BOOTSTRAP_BLOCK // n)
    for start in range(0, n_boot, rows_per_block):
        rows = min(rows_per_block, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n))
        boot_means[start : start + rows] = data[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(boot_means, [tail, 100.0 - tail])
    return Estimate(mean=mean, low=float(low), high=float(high), n=n)


def _score_table(scores: ScoreTable) -> tuple[list[str], list[list[float]]]:
    """Validate a score table (rectangular, finite numbers): return question names and float rows."""
    if isinstance(scores, str | bytes):
        raise TypeError(f"scores must be per-question lists of pass scores, got a {type(scores).__name__}")
    if isinstance(scores, Mapping):
        names = [f"question {key!r}" for key in scores]
        rows = list(scores.values())
    else:
        try:
            rows = list(scores)  # lists, tuples, numpy arrays, generators
        except TypeError:
            raise TypeError(
                f"scores must be per-question lists of pass scores, got {type(scores).__name__}"
            ) from None
        names = [f"question {q}" for q in range(len(rows))]
    if not rows:
        raise ValueError("scores is empty: need at least one question")
    table: list[list[float]] = []
    for name, row in zip(names, rows, strict=True):
        if isinstance(row, str | bytes) or not hasattr(row, "__iter__"):
            raise TypeError(f"{name}: expected a sequence of pass scores, got {type(row).__name__}: {row!r}")
        values: list[float] = []
        for i, value in enumerate(row):
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} pass {i}: score must be a finite number, got {value!r}")
            values.append(float(value))
        if not values:
            raise ValueError(f"{name} has no passes")
        if table and len(values) != len(table[0]):
            raise ValueError(
                f"{name} has {len(values)} passes but {names[0]} has {len(table[0])}: "
                "every question needs the same number of passes (ragged score table)"
            )
        table.append(values)
    return names, table
