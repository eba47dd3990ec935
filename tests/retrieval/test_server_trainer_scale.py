"""`asearch serve` takes what a trainer sends: a whole rollout batch in one /retrieve POST, and queries longer
than the server's limit (cut and counted, not refused). A real subprocess over an index built by the real
builder, on loopback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from asearch.corpus.sources import open_corpus
from asearch.retrieval.index import build_index

pytestmark = pytest.mark.server  # `asearch serve` in a subprocess

TOPICS = "amber basalt cobalt dune ember fjord granite harbor iris jasper kelp lagoon".split()
BATCH = 8192  # one trainer step's searches in one POST (Search-R1's GRPO step sends 512 x 5 = 2,560)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base url of `asearch serve` over a 12-passage BM25 index (max_batch 256, max_query_chars 4096)."""
    root = tmp_path_factory.mktemp("trainer-scale")
    corpus = root / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps(
                {
                    "id": str(i),
                    "title": f"{w.title()} notes",
                    "text": f"{w} facts {i}",
                    "url": f"https://s.test/{i}",
                }
            )
            + "\n"
            for i, w in enumerate(TOPICS)
        )
    )
    index_dir = build_index(open_corpus(str(corpus)), root / "idx", progress=False)
    cmd = [
        sys.executable,
        "-m",
        "asearch",
        "serve",
        "--index",
        str(index_dir),
        "--port",
        "0",
        "log_level=warning",
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"server at (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "asearch serve did not print its url"
        for _ in range(400):  # the url is printed just before uvicorn binds
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.ConnectError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_one_post_of_a_trainer_batch_is_answered_in_order(served):
    queries = [f"{TOPICS[i % len(TOPICS)]} facts" for i in range(BATCH)]
    before = httpx.get(served + "/stats", timeout=10).json()["batching"]
    r = httpx.post(served + "/retrieve", json={"queries": queries, "topk": 2}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert len(body["result"]) == BATCH and body["truncated_queries"] == 0
    # every answer belongs to its own query: the parts came back in request order
    assert all(row[0]["url"] == f"https://s.test/{i % len(TOPICS)}" for i, row in enumerate(body["result"]))
    batching = httpx.get(served + "/stats", timeout=10).json()["batching"]
    assert batching["queries"] - before["queries"] == BATCH
    assert batching["batches"] - before["batches"] >= BATCH // 256  # searched in parts of max_batch...
    assert batching["max_size"] <= 256  # ... never more in one retriever call


def test_a_long_query_is_cut_and_counted_not_refused(served):
    long_query = "granite " + "x" * 4992  # 5,000 characters: ASearcher's client retried a 422 ten times
    assert len(long_query) == 5000
    before = httpx.get(served + "/stats", timeout=10).json()["truncated_queries"]
    r = httpx.post(served + "/retrieve", json={"queries": [long_query, "kelp facts"], "topk": 1}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["truncated_queries"] == 1
    assert (
        body["result"][0][0]["url"] == "https://s.test/6"
        and body["result"][1][0]["url"] == "https://s.test/10"
    )
    assert httpx.get(served + "/stats", timeout=10).json()["truncated_queries"] - before == 1
    # the same counts reach the project's own client through the shared response model
    single = httpx.post(served + "/retrieve", json={"query": long_query}, timeout=30).json()
    assert single["truncated_queries"] == 1
