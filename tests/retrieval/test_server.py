"""The retrieval server under real uvicorn on loopback: wire format, bounds, errors, stats, batching."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Sequence

import httpx
import pytest

from asearch.corpus.types import Page, Passage
from asearch.retrieval.base import SearchHit
from asearch.retrieval.server import MicroBatcher, ServerConfig, batch_bucket, create_app, serve_in_thread

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


# --------------------------------------------------------------------------- scaffolding (not the product)


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class OverlapRetriever:
    """Scores a passage by how many query words it shares; ties go to the lower index. Records calls."""

    name = "overlap"

    def __init__(self, passages: list[Passage], delay_s: float = 0.0, fail: bool = False):
        self.passages, self.delay_s, self.fail = passages, delay_s, fail
        self._tok = [_tokens(p.title + " " + p.text) for p in passages]
        self.calls: list[tuple[int, int]] = []  # (queries, topk) per call

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        self.calls.append((len(queries), topk))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("index file vanished")
        out = []
        for q in queries:
            qt = _tokens(q)
            scored = sorted(((len(qt & t), i) for i, t in enumerate(self._tok)), key=lambda s: (-s[0], s[1]))
            out.append([SearchHit(self.passages[i], float(s)) for s, i in scored[:topk] if s > 0])
        return out


class DictPages:
    def __init__(self, pages: list[Page]):
        self._by_url = {p.url: p for p in pages}

    def get(self, url: str) -> Page | None:
        return self._by_url.get(url)

    def __len__(self) -> int:
        return len(self._by_url)


def make_corpus(n: int = 40) -> tuple[list[Passage], list[Page]]:
    passages, pages = [], []
    for i in range(n):
        words = [WORDS[i % 16], WORDS[(i * 7 + 3) % 16], WORDS[(i * 5 + 1) % 16]]
        url = f"https://wiki.test/page_{i}"
        text = f"passage {i} mentions {' '.join(words)}."
        passages.append(Passage(id=str(i), title=f"Page {i}", text=text, url=url))
        pages.append(Page(url=url, title=f"Page {i}", contents=f"Page {i}\n\n{text} More about {words[0]}."))
    return passages, pages


LIMITS = ServerConfig(max_queries=8, max_topk=10, max_query_chars=200, max_urls=4, max_body_bytes=4096)


@pytest.fixture(scope="module")
def corpus():
    return make_corpus()


@pytest.fixture(scope="module")
def server(corpus):
    passages, pages = corpus
    retriever = OverlapRetriever(passages)
    app = create_app(retriever, DictPages(pages), cfg=LIMITS, info={"index": "in-test", "method": "overlap"})
    with serve_in_thread(app) as url:
        yield url, retriever


HTTP = httpx.Client(timeout=10)  # one client for all tests: building one costs ~0.1 s (its TLS context)


def post(url: str, path: str, body: object) -> httpx.Response:
    return HTTP.post(url + path, json=body)


# --------------------------------------------------------------------------- /retrieve


def test_retrieve_docs_match_the_retriever(server):
    url, retriever = server
    queries = ["alpha bravo", "golf hotel india", "zzz nothing"]
    r = post(url, "/retrieve", {"queries": queries, "topk": 4})
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    direct = retriever.search(queries, 4)
    assert len(result) == 3
    for row, hits in zip(result, direct, strict=True):
        assert [d["id"] for d in row] == [h.passage.id for h in hits]
        for d, h in zip(row, hits, strict=True):
            assert d == h.passage.to_doc()
            assert d["contents"].split("\n", 1)[0] == f'"{h.passage.title}"'
    assert len(result[0]) == 4 and result[2] == []


def test_retrieve_with_scores(server):
    url, retriever = server
    r = post(url, "/retrieve", {"queries": ["delta echo"], "topk": 3, "return_scores": True})
    row = r.json()["result"][0]
    hits = retriever.search(["delta echo"], 3)[0]
    assert [(item["document"]["id"], item["score"]) for item in row] == [
        (h.passage.id, h.score) for h in hits
    ]
    assert set(row[0]) == {"document", "score"}


def test_single_query_field_and_default_topk(server):
    url, _ = server
    single = post(url, "/retrieve", {"query": "kilo lima"}).json()["result"]
    listed = post(url, "/retrieve", {"queries": ["kilo lima"]}).json()["result"]
    assert single == listed
    assert len(single) == 1 and len(single[0]) == ServerConfig().default_topk


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"queries": ["a"] * 9}, 413, "max_queries=8"),
        ({"queries": ["a"], "topk": 11}, 422, "max_topk=10"),
        ({"queries": ["a"], "topk": 0}, 422, "topk"),
        ({"queries": ["a"], "top_k": 3}, 422, "top_k"),
        ({"queries": ["a"], "query": "b"}, 422, "exactly one of"),
        ({}, 422, "exactly one of"),
        ({"queries": [1, 2]}, 422, "queries.0"),
        (["alpha"], 422, "body"),
    ],
)
def test_retrieve_bounds_and_bad_requests(server, body, status, needle):
    url, _ = server
    r = post(url, "/retrieve", body)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]


def test_malformed_json_is_a_400_with_a_message(server):
    url, _ = server
    for path in ("/retrieve", "/access"):
        r = HTTP.post(url + path, content=b'{"queries": ["a"', headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "not valid JSON" in r.json()["detail"]


def test_body_over_the_byte_limit_is_413(server):
    url, _ = server
    r = post(url, "/retrieve", {"queries": ["y" * 150] * 30})
    assert r.status_code == 413
    assert "max_body_bytes=4096" in r.json()["detail"]

    def chunked():  # no Content-Length: the limit must hold while the body streams in
        yield b'{"queries": ['
        for _ in range(40):
            yield b'"' + b"z" * 150 + b'", '
        yield b'"end"]}'

    r = HTTP.post(url + "/retrieve", content=chunked())
    assert r.status_code == 413 and "max_body_bytes=4096" in r.json()["detail"]


def test_json_body_is_read_whatever_the_content_type(server):
    url, retriever = server
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}):
        r = HTTP.post(url + "/retrieve", content=b'{"queries": ["alpha"], "topk": 2}', headers=headers)
        assert r.status_code == 200, r.text
        assert [d["id"] for d in r.json()["result"][0]] == [
            h.passage.id for h in retriever.search(["alpha"], 2)[0]
        ]
    r = HTTP.post(url + "/retrieve", content=b"")
    assert r.status_code == 422 and "request body is empty" in r.json()["detail"]


# --------------------------------------------------------------------------- /access, /health


def test_access_known_unknown_and_normalised_urls(server, corpus):
    url, _ = server
    _, pages = corpus
    asked = [pages[3].url, "https://wiki.test/nope", f"  <{pages[5].url}/>  ", pages[7].url + "#History"]
    r = post(url, "/access", {"urls": asked})
    assert r.status_code == 200, r.text
    got = r.json()["result"]
    assert got[0] == pages[3].to_dict()
    assert got[1] is None
    assert got[2] == pages[5].to_dict()
    assert got[3] == pages[7].to_dict()


def test_access_bounds(server):
    url, _ = server
    r = post(url, "/access", {"urls": ["u"] * 5})
    assert r.status_code == 413 and "max_urls=4" in r.json()["detail"]
    r = post(url, "/access", {"url": "u"})
    assert r.status_code == 422 and "urls" in r.json()["detail"]


def test_health(server, corpus):
    url, _ = server
    h = HTTP.get(url + "/health").json()
    assert h["status"] == "ok"
    assert h["retriever"] == "overlap"
    assert h["pages"] == len(corpus[1])
    assert h["info"] == {"index": "in-test", "method": "overlap"}


# --------------------------------------------------------------------------- /stats, errors


def test_stats_counts_and_latency_percentiles(corpus):
    passages, pages = corpus
    app = create_app(OverlapRetriever(passages), DictPages(pages), cfg=LIMITS, info={"manifest": {"n": 40}})
    with serve_in_thread(app) as url:
        for i in range(5):
            assert post(url, "/retrieve", {"queries": [WORDS[i]]}).status_code == 200
        assert post(url, "/retrieve", {"queries": ["a"] * 9}).status_code == 413
        assert post(url, "/access", {"urls": [pages[0].url]}).status_code == 200
        HTTP.get(url + "/health")
        stats = HTTP.get(url + "/stats").json()
    ret = stats["endpoints"]["/retrieve"]
    assert ret["requests"] == 6 and ret["errors"] == 1
    assert ret["status_codes"] == {"200": 5, "413": 1}
    lat = ret["latency_ms"]
    assert lat["samples"] == 6
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert stats["endpoints"]["/access"]["requests"] == 1
    assert stats["endpoints"]["/health"]["requests"] == 1
    assert stats["batching"]["queries"] == 5  # the rejected request never reached the retriever
    assert sum(stats["batching"]["size_histogram"].values()) == stats["batching"]["batches"]
    assert stats["index"] == {"manifest": {"n": 40}}


def test_retriever_failure_is_a_500_that_names_it(corpus):
    passages, pages = corpus
    app = create_app(OverlapRetriever(passages, fail=True), DictPages(pages), cfg=LIMITS)
    with serve_in_thread(app) as url:
        r = post(url, "/retrieve", {"queries": ["alpha"]})
        assert r.status_code == 500
        assert "overlap" in r.json()["detail"] and "index file vanished" in r.json()["detail"]
        # the server survives and keeps answering
        assert HTTP.get(url + "/health").status_code == 200


def test_slow_search_does_not_block_the_event_loop(corpus):
    passages, pages = corpus
    app = create_app(OverlapRetriever(passages, delay_s=0.6), DictPages(pages), cfg=LIMITS)

    async def go(url: str) -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            t0 = time.perf_counter()
            search = asyncio.create_task(c.post("/retrieve", json={"queries": ["alpha"]}))
            await asyncio.sleep(0.1)
            await c.get("/health")
            health_done = time.perf_counter() - t0
            await search
            return health_done, time.perf_counter() - t0

    with serve_in_thread(app) as url:
        health_s, search_s = asyncio.run(go(url))
    assert health_s < search_s and search_s >= 0.6


# --------------------------------------------------------------------------- batching


def test_concurrent_requests_are_batched_and_match_unbatched_results(corpus):
    passages, pages = corpus
    retriever = OverlapRetriever(passages, delay_s=0.1)  # a slow search lets the next requests queue up
    cfg = ServerConfig(max_batch=64)  # default window (0): batches form from what queues meanwhile
    app = create_app(retriever, DictPages(pages), cfg=cfg)
    reference = OverlapRetriever(passages)
    queries = [f"{WORDS[i % 16]} {WORDS[(i * 3) % 16]}" for i in range(32)]
    topks = [1 + i % 5 for i in range(32)]  # mixed topk: each caller must get exactly its own

    async def clients(url: str) -> list[list[dict]]:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=64)) as c:
            rs = await asyncio.gather(
                *(
                    c.post("/retrieve", json={"queries": [q], "topk": k, "return_scores": True})
                    for q, k in zip(queries, topks, strict=True)
                )
            )
        return [r.json()["result"][0] for r in rs]

    with serve_in_thread(app) as url:
        got = asyncio.run(clients(url))
        stats = HTTP.get(url + "/stats").json()["batching"]

    for q, k, row in zip(queries, topks, got, strict=True):
        expected = reference.search([q], k)[0]  # unbatched, one query at a time
        assert [(d["document"]["id"], d["score"]) for d in row] == [(h.passage.id, h.score) for h in expected]
    assert stats["queries"] == 32
    assert stats["batches"] == len(retriever.calls) < 32
    assert stats["max_size"] > 1
    assert any(bucket != "1" and n > 0 for bucket, n in stats["size_histogram"].items())


def test_micro_batcher_respects_max_batch_and_splits_only_an_oversized_request(corpus):
    passages, _ = corpus
    retriever = OverlapRetriever(passages, delay_s=0.02)
    batcher = MicroBatcher(retriever, window_s=0.01, max_batch=8)
    requests = [[WORDS[(i + j) % 16] for j in range(3)] for i in range(10)] + [
        [WORDS[j % 16] for j in range(19)]
    ]

    async def go() -> list[list[list[SearchHit]]]:
        return await asyncio.gather(*(batcher.search(qs, 2) for qs in requests))

    try:
        got = asyncio.run(go())
    finally:
        batcher.close()
    sizes = [n for n, _ in retriever.calls]
    assert sum(sizes) == 3 * 10 + 19
    assert all(n <= 8 for n in sizes)  # the 19-query request went out in parts of 8, 8 and 3
    assert len(sizes) < len(requests) + 2  # 3-query requests still share batches
    for qs, rows in zip(requests, got, strict=True):
        assert rows == OverlapRetriever(passages).search(qs, 2)


def test_micro_batcher_rebinds_to_a_new_event_loop(corpus):
    passages, _ = corpus
    batcher = MicroBatcher(OverlapRetriever(passages), window_s=0.0)
    try:
        first = asyncio.run(batcher.search(["alpha"], 2))
        second = asyncio.run(
            batcher.search(["alpha"], 2)
        )  # a fresh loop: the old collector died with its loop
    finally:
        batcher.close()
    assert first == second and len(first[0]) == 2


def test_batch_bucket_labels():
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 100)] == [
        "1",
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
        "65-128",
    ]


def test_serve_in_thread_stops_cleanly(corpus):
    passages, pages = corpus

    def uvicorn_threads() -> int:
        return sum(t.name == "asearch-uvicorn" for t in threading.enumerate())

    before = uvicorn_threads()
    app = create_app(OverlapRetriever(passages), DictPages(pages))
    with serve_in_thread(app) as url:
        assert uvicorn_threads() == before + 1
        assert HTTP.get(url + "/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        HTTP.get(url + "/health", timeout=2)
    # the same app can be served again (executors are recreated after the first run's shutdown)
    with serve_in_thread(app) as url2:
        assert post(url2, "/retrieve", {"queries": ["alpha"]}).status_code == 200
        assert post(url2, "/access", {"urls": [pages[0].url]}).json()["result"][0]["url"] == pages[0].url
    assert uvicorn_threads() == before


# --------------------------------------------------------------------------- `asearch serve`


def test_cli_serve_warns_for_non_loopback_and_applies_options(monkeypatch, tmp_path, corpus):
    from typer.testing import CliRunner

    import asearch.retrieval.server as server_mod
    from asearch.cli.app import app as cli

    passages, pages = corpus
    seen: dict[str, object] = {}

    def fake_app_from_index(index_dir, *, method, cfg):
        seen["index"], seen["method"] = index_dir, method
        info = {"passages": len(passages), "pages": len(pages)}
        return create_app(OverlapRetriever(passages), DictPages(pages), cfg=cfg, info=info), info

    monkeypatch.setattr(server_mod, "app_from_index", fake_app_from_index)
    monkeypatch.setattr(server_mod, "run_server", lambda app, cfg: seen.update(cfg=cfg))
    cfg_file = tmp_path / "server.yaml"
    cfg_file.write_text("max_topk: 20\nport: 9001\n")
    res = CliRunner().invoke(
        cli,
        [
            "serve",
            "--index",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--method",
            "hybrid",
            "-c",
            str(cfg_file),
            "max_urls=7",
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = seen["cfg"]
    assert (cfg.host, cfg.port, cfg.max_topk, cfg.max_urls) == ("0.0.0.0", 9001, 20, 7)
    assert seen["method"] == "hybrid"
    assert "WARNING: not a loopback address" in res.output
    assert "curl -s -X POST http://<this-host>:9001/retrieve" in res.output


def test_cli_serve_end_to_end_on_a_real_index(tmp_path):
    """`asearch serve` in a subprocess over an index built by the real index builder."""
    import subprocess
    import sys

    from asearch.corpus.sources import open_corpus
    from asearch.retrieval.index import build_index

    corpus_file = tmp_path / "tiny.jsonl"
    corpus_file.write_text(
        "".join(
            json.dumps(
                {
                    "id": str(i),
                    "title": f"Topic {i}",
                    "text": f"{WORDS[i]} facts about topic {i}",
                    "url": f"https://t.test/{i}",
                }
            )
            + "\n"
            for i in range(12)
        )
    )
    index_dir = build_index(open_corpus(str(corpus_file)), tmp_path / "idx", progress=False)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asearch",
            "serve",
            "--index",
            str(index_dir),
            "--port",
            "0",
            "log_level=warning",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"server at (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "asearch serve did not print its url"
        health: dict = {}
        for _ in range(200):  # the url is printed just before uvicorn binds
            try:
                health = HTTP.get(url + "/health").json()
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert health["status"] == "ok" and health["info"]["passages"] == 12
        row = post(url, "/retrieve", {"query": "hotel facts", "topk": 2}).json()["result"][0]
        assert row[0]["url"] == "https://t.test/7" and row[0]["title"] == "Topic 7"
        page = post(url, "/access", {"urls": ["<https://t.test/7/>"]}).json()["result"][0]
        assert page["url"] == "https://t.test/7" and "hotel facts" in page["contents"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
