"""Evaluation: datasets (files and built-in sets), public-set fetchers, and the resumable eval runner."""

from asearch.eval.datasets import QARecord, load_dataset
from asearch.eval.runner import EvalSummary, agent_solver, aggregate_only, evaluate, evaluate_async

__all__ = [
    "EvalSummary",
    "QARecord",
    "agent_solver",
    "aggregate_only",
    "evaluate",
    "evaluate_async",
    "load_dataset",
]
