"""`engine/*` step metrics: what the in-process engine did since the previous step."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from asearch.launch.train import EngineCounters  # noqa: E402


class _Engine:
    def __init__(self):
        self.counts = dict.fromkeys(EngineCounters.COUNTS, 0)

    def stats(self):
        return {**self.counts, "version": 3, "kv_cache_mb": 1.0}


def test_each_step_reports_the_counters_since_the_last_one():
    engine = _Engine()
    counters = EngineCounters(engine)
    engine.counts.update(tokens_generated=40, decode_steps=10, prefill_tokens=300, prefix_reused_tokens=900,
                         recomputed_tokens=5, requests_finished=7)  # fmt: skip
    first = counters()
    assert first == {
        "engine/tokens_generated": 40, "engine/prefill_tokens": 300, "engine/prefix_reused_tokens": 900,
        "engine/recomputed_tokens": 5, "engine/requests_finished": 7, "engine/mean_batch": 4.0,
    }  # fmt: skip
    engine.counts.update(tokens_generated=52, decode_steps=16)
    second = counters()
    assert second["engine/tokens_generated"] == 12 and second["engine/mean_batch"] == 2.0
    assert second["engine/prefill_tokens"] == 0
    assert counters()["engine/mean_batch"] == 0.0  # no decode step since: no division by zero


def test_engines_without_these_counters_report_nothing():
    class Pool:
        def stats(self):
            return [{"name": "s0", "served": 3}]

    assert EngineCounters(Pool())() == {} and EngineCounters(object())() == {}
