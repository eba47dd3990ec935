"""bench/weight_load.py at a tiny shape: both copies run, build the same weights (the script asserts it) and
the table has a row per source dtype."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from asearch.engine.local import cpu_kernels

BENCH = Path(__file__).resolve().parents[2] / "bench" / "weight_load.py"


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler builds cpu_kernels.c")
def test_weight_load_bench_runs_at_a_tiny_shape(tmp_path):
    spec = importlib.util.spec_from_file_location("weight_load_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "weight_load.md"
    results = module.main(["--shape", "tiny", "--repeats", "2", "--out", str(out)])
    assert set(results) == {"bfloat16", "float32"}
    assert all(len(runs) == 2 and all(s > 0 for s in runs) for r in results.values() for runs in r.values())
    table = out.read_text()
    assert "| bfloat16 |" in table and "| float32 |" in table
