"""Answer metrics (EM, F1, CEM), answer extraction, Avg@k / Pass@k with bootstrap CIs, LLM judge, RL reward."""

from asearch.metrics.aggregate import Estimate, avg_at_k, bootstrap_mean, pass_at_k, pass_at_k_unbiased
from asearch.metrics.judge import JudgeVerdict, LLMJudge, parse_judgement
from asearch.metrics.normalize import contains_cjk, extract_answer, normalize_answer, tokenize_answer
from asearch.metrics.qa import QAScores, cover_exact_match, exact_match, f1, qa_scores

__all__ = [
    "Estimate",
    "JudgeVerdict",
    "LLMJudge",
    "QAScores",
    "RewardConfig",
    "RewardResult",
    "avg_at_k",
    "bootstrap_mean",
    "check_format",
    "compute_reward",
    "contains_cjk",
    "cover_exact_match",
    "exact_match",
    "extract_answer",
    "f1",
    "normalize_answer",
    "parse_judgement",
    "pass_at_k",
    "pass_at_k_unbiased",
    "qa_scores",
    "tokenize_answer",
]

# The reward's config is a pydantic model; importing it lazily keeps `import asearch.metrics` free of
# pydantic for reward workers that only need the metric functions.
_LAZY = {
    name: "asearch.metrics.reward"
    for name in ("RewardConfig", "RewardResult", "check_format", "compute_reward")
}


def __getattr__(name: str):  # PEP 562
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asearch.metrics' has no attribute {name!r}")
