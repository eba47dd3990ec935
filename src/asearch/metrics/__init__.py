"""Answer metrics (EM, F1, CEM), answer extraction, and Avg@k / Pass@k aggregation with bootstrap CIs."""

from asearch.metrics.aggregate import Estimate, avg_at_k, bootstrap_mean, pass_at_k, pass_at_k_unbiased
from asearch.metrics.normalize import contains_cjk, extract_answer, normalize_answer, tokenize_answer
from asearch.metrics.qa import QAScores, cover_exact_match, exact_match, f1, qa_scores

__all__ = [
    "Estimate",
    "QAScores",
    "avg_at_k",
    "bootstrap_mean",
    "contains_cjk",
    "cover_exact_match",
    "exact_match",
    "extract_answer",
    "f1",
    "normalize_answer",
    "pass_at_k",
    "pass_at_k_unbiased",
    "qa_scores",
    "tokenize_answer",
]
