"""Avg@k / Pass@k on hand tables, bootstrap CI behaviour, and the unbiased pass@k vs brute force."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

import asearch.metrics.aggregate as aggregate
from asearch.metrics import Estimate, avg_at_k, bootstrap_mean, pass_at_k, pass_at_k_unbiased

# 3 questions x 4 passes
TABLE = [
    [1, 0, 0, 1],  # mean 0.5, max 1, c = 2
    [0, 0, 0, 0],  # mean 0.0, max 0, c = 0
    [1, 1, 1, 1],  # mean 1.0, max 1, c = 4
]


def test_avg_and_pass_at_k_on_a_tiny_table():
    avg = avg_at_k(TABLE)
    assert avg.mean == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert avg.n == 3
    pas = pass_at_k(TABLE)
    assert pas.mean == pytest.approx((1 + 0 + 1) / 3)
    assert pas.n == 3


def test_non_binary_scores_use_mean_and_max():
    table = [[0.5, 0.2], [0.0, 0.8]]
    assert avg_at_k(table).mean == pytest.approx((0.35 + 0.4) / 2)
    assert pass_at_k(table).mean == pytest.approx((0.5 + 0.8) / 2)


def test_mapping_and_numpy_inputs_equal_list_input():
    as_map = {"q1": TABLE[0], "q2": TABLE[1], "q3": TABLE[2]}
    assert avg_at_k(as_map) == avg_at_k(TABLE)
    assert pass_at_k(as_map) == pass_at_k(TABLE)
    assert avg_at_k(np.array(TABLE)) == avg_at_k(TABLE)
    assert avg_at_k([tuple(r) for r in TABLE]) == avg_at_k(TABLE)


def test_pass_at_k_with_k_below_passes_uses_unbiased_estimator():
    # q1: c = 2 of 4, k = 2 -> 1 - C(2,2)/C(4,2) = 5/6; q2: 0; q3: 1.
    assert pass_at_k(TABLE, k=2).mean == pytest.approx((5 / 6 + 0 + 1) / 3)
    # pass@1 is the fraction correct, i.e. Avg@k for binary scores
    assert pass_at_k(TABLE, k=1).mean == pytest.approx(avg_at_k(TABLE).mean)
    # k equal to the pass count is the plain max over passes
    assert pass_at_k(TABLE, k=4) == pass_at_k(TABLE)
    assert pass_at_k([[True, False], [False, False]], k=1).mean == pytest.approx(0.25)


def test_pass_at_k_argument_errors():
    with pytest.raises(ValueError, match="k must be between 1 and the number of passes \\(4\\), got 5"):
        pass_at_k(TABLE, k=5)
    with pytest.raises(ValueError, match="got 0"):
        pass_at_k(TABLE, k=0)
    with pytest.raises(ValueError, match="question 1 pass 0: score 0.5 is not 0 or 1"):
        pass_at_k([[1, 0, 1], [0.5, 0, 0]], k=2)


# --- bootstrap ---------------------------------------------------------------------------------


def _bernoulli(n: int, p: float, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[float(rng.random() < p)] for _ in range(n)]


def test_ci_contains_mean_and_is_seeded():
    table = _bernoulli(50, 0.4, seed=1)
    est = avg_at_k(table, seed=7)
    assert est.low <= est.mean <= est.high
    assert est.low < est.high
    assert avg_at_k(table, seed=7) == est  # same seed, same interval
    assert avg_at_k(table, seed=8) != est  # the seed really drives the resampling
    assert avg_at_k(table, seed=8).mean == est.mean  # ...but never the point estimate


def test_ci_shrinks_with_more_questions():
    small = avg_at_k(_bernoulli(25, 0.5, seed=2))
    large = avg_at_k(_bernoulli(2500, 0.5, seed=2))
    for est in (small, large):
        assert est.low <= est.mean <= est.high
    # width scales like 1/sqrt(n): 100x the questions -> ~10x narrower
    assert (large.high - large.low) < (small.high - small.low) / 5


def test_ci_width_matches_normal_approximation():
    """Percentile bootstrap of a mean of n = 400 Bernoulli(0.3) values ~ mean +- 1.96 * sd / sqrt(n)."""
    values = [v[0] for v in _bernoulli(400, 0.3, seed=3)]
    est = bootstrap_mean(values, n_boot=4000, seed=0)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 1.96 * sd / math.sqrt(len(values))
    assert (est.high - est.low) / 2 == pytest.approx(half, rel=0.1)
    assert (est.high + est.low) / 2 == pytest.approx(mean, abs=0.01)


def test_confidence_and_n_boot_are_configurable():
    table = _bernoulli(200, 0.5, seed=4)
    wide, narrow = avg_at_k(table, confidence=0.95), avg_at_k(table, confidence=0.5)
    assert narrow.high - narrow.low < wide.high - wide.low
    assert avg_at_k(table, n_boot=50) != avg_at_k(table, n_boot=1000)


def test_degenerate_tables_give_zero_width_intervals():
    assert avg_at_k([[1, 1], [1, 1]]) == Estimate(mean=1.0, low=1.0, high=1.0, n=2)
    assert pass_at_k([[0.25, 0.75]]) == Estimate(mean=0.75, low=0.75, high=0.75, n=1)


def test_bootstrap_result_does_not_depend_on_block_size(monkeypatch):
    values = [v[0] for v in _bernoulli(3001, 0.2, seed=5)]
    whole = bootstrap_mean(values, n_boot=40, seed=3)
    monkeypatch.setattr(aggregate, "_BOOTSTRAP_BLOCK", 3001 * 3)  # 3 resamples per block
    assert bootstrap_mean(values, n_boot=40, seed=3) == whole


def test_bootstrap_argument_errors():
    with pytest.raises(ValueError, match="n_boot must be an int >= 1, got 0"):
        bootstrap_mean([1.0], n_boot=0)
    with pytest.raises(ValueError, match="confidence must be strictly between 0 and 1, got 1.5"):
        bootstrap_mean([1.0], confidence=1.5)
    with pytest.raises(ValueError, match="zero values"):
        bootstrap_mean([])


def test_estimate_str():
    assert str(Estimate(mean=0.5, low=0.25, high=0.75, n=3)) == "0.5000 [0.2500, 0.7500] (n=3)"


# --- table validation --------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [avg_at_k, pass_at_k])
def test_table_validation_names_the_question(metric):
    with pytest.raises(ValueError, match="question 2 has 3 passes but question 0 has 4: .*ragged"):
        metric([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="question 'q2' has 1 passes but question 'q1' has 2"):
        metric({"q1": [1, 0], "q2": [1]})
    with pytest.raises(ValueError, match="question 1 pass 1: score must be a finite number, got nan"):
        metric([[1, 0], [1, float("nan")]])
    with pytest.raises(ValueError, match="question 0 pass 0: score must be a finite number, got 'x'"):
        metric([["x"]])
    with pytest.raises(ValueError, match="question 1 has no passes"):
        metric([[1], []])
    with pytest.raises(ValueError, match="scores is empty"):
        metric([])
    with pytest.raises(TypeError, match="question 0: expected a sequence of pass scores, got int"):
        metric([1, 0])
    with pytest.raises(TypeError, match="scores must be per-question lists"):
        metric("1010")


# --- unbiased pass@k ---------------------------------------------------------------------------


def _brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


def test_unbiased_pass_at_k_matches_enumeration():
    checked = 0
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k_unbiased(n, c, k) == pytest.approx(float(_brute_force_pass_at_k(n, c, k)))
                checked += 1
    assert checked == sum((n + 1) * n for n in range(1, 8))


def test_unbiased_pass_at_k_large_n_matches_stable_product_form():
    # Chen et al.'s numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k / i)
    for n, c, k in [(2000, 3, 1000), (500, 17, 10), (10_000, 1, 1), (200, 0, 50)]:
        product = math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
        assert pass_at_k_unbiased(n, c, k) == pytest.approx(1.0 - product, rel=1e-9, abs=1e-12)
    assert pass_at_k_unbiased(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 0, 1), ValueError, "n \\(samples\\) must be >= 1, got 0"),
        ((5, 6, 1), ValueError, "c \\(correct samples\\) must be between 0 and n=5, got 6"),
        ((5, -1, 1), ValueError, "got -1"),
        ((5, 2, 0), ValueError, "k must be between 1 and n=5, got 0"),
        ((5, 2, 6), ValueError, "got 6"),
        ((5.0, 2, 1), TypeError, "n must be an int, got float"),
        ((5, True, 1), TypeError, "c must be an int, got bool"),
    ],
)
def test_unbiased_pass_at_k_rejects_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        pass_at_k_unbiased(*args)
