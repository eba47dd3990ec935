"""bench/wiki_scale.py: the Wikipedia-like generator is deterministic with wiki-18's shape, and the whole
benchmark (build, serve under load, import and search a flat file) runs at a tiny size with zero errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "wiki_scale.py"


def _bench():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("wiki_scale_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_passages_have_wiki18_shape_and_a_zipf_vocabulary():
    bench = _bench()
    rows = list(bench.wiki_passages(3000, seed=0, vocab_size=30_000))
    assert rows[:50] == list(bench.wiki_passages(50, seed=0, vocab_size=30_000))  # deterministic
    lengths = [len(text.split()) for _, _, text in rows]
    articles = [a for a, _, _ in rows]
    assert articles == sorted(articles) and 2.5 < len(rows) / (articles[-1] + 1) < 4.5  # ~3.3 passages each
    assert sum(n == 100 for n in lengths) / len(lengths) > 0.6 and min(lengths) >= 10 and max(lengths) == 100
    counts = Counter(w for _, _, text in rows for w in text.split()).most_common()
    assert counts[0][0] == "the"
    # Zipf: the 10th word is about 10^1.07 = 12x rarer than the first
    assert 6 < counts[0][1] / counts[9][1] < 25


@pytest.mark.server  # the benchmark starts `asearch serve` in a subprocess
def test_the_benchmark_runs_at_a_tiny_size_with_zero_errors(tmp_path):
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(SCRIPT), "--passages", "1500", "--vocab", "20000", "--requests", "80",
           "--clients", "4,16", "--dense-memory-gb", "0.002", "--dense-queries", "50",
           "--workdir", str(tmp_path / "w"), "--json-out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["build"]["passages"] == 1500 and res["build"]["pages"] < 1500  # pages are articles
    assert [row["errors"] for row in res["serve"]["rows"]] == [0, 0]
    assert [row["ok"] for row in res["serve"]["rows"]] == [80, 80]
    assert res["import"]["kind"].startswith("ivfsq8") and res["import"]["recall"] > 0.8
    assert "| 1,500 | " in r.stdout and not (tmp_path / "w" / "1500").exists()  # cleaned up


def test_generated_vectors_read_alike_by_block_by_row_and_from_the_flat_file(tmp_path):
    """The 21M dense row compresses GeneratedVectors without a file: they must be the flat file's vectors."""
    from asearch.retrieval.importer import read_flat_header

    bench = _bench()
    bench.GeneratedVectors.BLOCK = 700  # several blocks at a tiny size
    try:
        vectors = bench.GeneratedVectors(2000)
        whole = np.concatenate([block for _, block in vectors.blocks(300)])
        starts = [start for start, _ in vectors.blocks(300)]
        rows = np.array([1999, 0, 701, 699, 1400, 5])
        taken, ranged = vectors.take(rows), vectors.rows(650, 760)
        bench.phase_flat(tmp_path / "e5_Flat.index", 2000)
        flat = read_flat_header(tmp_path / "e5_Flat.index")
    finally:
        bench.GeneratedVectors.BLOCK = 50_000
    assert whole.shape == (2000, bench.DIM) and np.allclose(np.linalg.norm(whole, axis=1), 1, atol=1e-5)
    assert starts[:4] == [0, 300, 600, 700]  # batches never cross a generated block
    assert np.array_equal(taken, whole[rows]) and np.array_equal(ranged, whole[650:760])
    assert (flat.ntotal, flat.dim) == (2000, bench.DIM) and np.array_equal(flat.rows(0, 2000), whole)
