"""Processes started together on an empty cache (a study's parallel runs) build each cached index once and
all read it: none swaps its own copy over an index another one has open."""

from __future__ import annotations

import json
import os
import subprocess
import sys

WORKER = r"""
import json, sys
from asearch.retrieval.index import IndexConfig, open_index
from asearch.tools.build import ensure_index
created, pages = set(), 0
for _ in range(40):  # open it again and again, as a run's tool layers do, while the others finish theirs
    path = ensure_index(sys.argv[1], IndexConfig(), progress=False)
    with open_index(path) as index:
        hits = index.retriever("bm25").search(["capital"], topk=3)[0]
        pages += sum(index.pages.get(h.passage.url) is not None for h in hits)
    created.add(json.load(open(path / "manifest.json"))["created"])
print(json.dumps({"path": str(path), "created": sorted(created), "pages": pages}))
"""


def test_parallel_processes_share_one_build_of_a_cached_index(tmp_path):
    env = {**os.environ, "ASEARCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    corpus = "world:seed=77,entities=600,names=255,pages=facts"
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, corpus], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert all(r["pages"] == 120 for r in results)
    assert len({c for r in results for c in r["created"]}) == 1  # built once, never replaced
    leftovers = [p.name for p in (tmp_path / "cache" / "indexes").iterdir() if ".building-" in p.name or ".replaced-" in p.name]
    assert leftovers == []
