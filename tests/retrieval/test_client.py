"""RetrievalClient against real loopback servers: round trips, retries with backoff, and RemoteError."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Sequence

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from asearch.corpus.types import Page, Passage
from asearch.errors import RemoteError
from asearch.retrieval.base import SearchHit
from asearch.retrieval.client import RetrievalClient
from asearch.retrieval.server import create_app, serve_in_thread

# --------------------------------------------------------------------------- scaffolding (not the product)


class OverlapRetriever:
    """Scores a passage by how many query words it shares; ties go to the lower index."""

    name = "overlap"

    def __init__(self, passages: list[Passage]):
        self.passages = passages
        self._tok = [set(re.findall(r"[a-z0-9]+", (p.title + " " + p.text).lower())) for p in passages]

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        out = []
        for q in queries:
            qt = set(re.findall(r"[a-z0-9]+", q.lower()))
            scored = sorted(((len(qt & t), i) for i, t in enumerate(self._tok)), key=lambda s: (-s[0], s[1]))
            out.append([SearchHit(self.passages[i], float(s)) for s, i in scored[:topk] if s > 0])
        return out


class DictPages(dict):
    def get(self, url: str) -> Page | None:  # type: ignore[override]
        return super().get(url)


COLORS = "red green blue cyan magenta yellow black white".split()
PASSAGES = [
    Passage(
        id=str(i),
        title=f"Color {i}",
        text=f"{COLORS[i % 8]} and {COLORS[(i * 3 + 1) % 8]}",
        url=f"https://c.test/{i}",
    )
    for i in range(20)
]
PAGES = DictPages({p.url: Page(url=p.url, title=p.title, contents=p.text * 3) for p in PASSAGES})


@pytest.fixture(scope="module")
def server_url():
    with serve_in_thread(create_app(OverlapRetriever(PASSAGES), PAGES, info={"method": "overlap"})) as url:
        yield url


class Flaky:
    """A tiny loopback server whose /retrieve fails `fail_times` times with `status`, then answers."""

    def __init__(self, fail_times: int, status: int = 503, delay_s: float = 0.0, body: object = None):
        self.calls = 0
        self.app = FastAPI()

        @self.app.post("/retrieve")
        async def retrieve() -> JSONResponse:
            self.calls += 1
            if delay_s:
                await asyncio.sleep(delay_s)
            if self.calls <= fail_times:
                return JSONResponse({"detail": f"failure {self.calls}"}, status_code=status)
            if body is not None:
                return JSONResponse(body)
            doc = {"id": "7", "contents": '"Seven"\nthe seventh doc'}  # Search-R1 shape: no url/title/text
            return JSONResponse({"result": [[{"document": doc, "score": 1.5}]]})


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- round trips


def test_search_access_health_stats_round_trip(server_url):
    async def go():
        async with RetrievalClient(server_url, timeout=5) as client:
            hits = await client.search(["red green", "nothing here"], topk=3)
            pages = await client.access([PASSAGES[2].url, "https://c.test/missing", f"<{PASSAGES[4].url}/>"])
            return hits, pages, await client.health(), await client.stats()

    hits, pages, health, stats = run(go())
    expected = OverlapRetriever(PASSAGES).search(["red green", "nothing here"], 3)
    assert hits == expected  # passages (id, title, text, url) and scores survive the wire exactly
    assert pages == [PAGES[PASSAGES[2].url], None, PAGES[PASSAGES[4].url]]
    assert health.status == "ok" and health.pages == len(PAGES) and health.info == {"method": "overlap"}
    assert stats.endpoints["/retrieve"].requests >= 1 and stats.endpoints["/access"].requests >= 1


def test_base_url_may_be_the_retrieve_endpoint(server_url):
    client = RetrievalClient(server_url + "/retrieve/")
    assert client.base_url == server_url
    assert len(run(client.search(["blue"], topk=2))[0]) == 2


def test_client_reused_across_event_loops(server_url):
    client = RetrievalClient(server_url)
    first = run(client.search(["cyan"], topk=2))
    second = run(client.search(["cyan"], topk=2))  # a fresh asyncio.run: the client makes a new pool
    assert first == second and first[0]


def test_4xx_is_not_retried_and_names_the_limit(server_url):
    client = RetrievalClient(server_url, retries=3, backoff_s=0.01)
    with pytest.raises(RemoteError, match=r"HTTP 422.*max_topk=100"):
        run(client.search(["red"], topk=101))


# --------------------------------------------------------------------------- retries


def test_retries_5xx_then_succeeds_and_parses_search_r1_docs():
    flaky = Flaky(fail_times=2, status=503)
    with serve_in_thread(flaky.app) as url:
        client = RetrievalClient(url, retries=3, backoff_s=0.05, max_backoff_s=0.2)
        start = time.perf_counter()
        hits = run(client.search(["anything"], topk=1))
        elapsed = time.perf_counter() - start
    assert flaky.calls == 3
    (hit,) = hits[0]
    assert hit.score == 1.5 and hit.passage.id == "7" and hit.passage.text == '"Seven"\nthe seventh doc'
    assert elapsed >= 0.05 * 0.5 + 0.1 * 0.5  # two jittered backoffs really waited


def test_gives_up_after_retries_with_a_message_that_says_what_to_check():
    flaky = Flaky(fail_times=100, status=500)
    with serve_in_thread(flaky.app) as url:
        client = RetrievalClient(url, retries=2, backoff_s=0.01)
        with pytest.raises(RemoteError) as err:
            run(client.search(["q"], topk=1))
    assert flaky.calls == 3
    msg = str(err.value)
    assert "failed after 3 attempt(s)" in msg and "HTTP 500: failure 3" in msg and "/health" in msg


def test_connection_refused_is_retried_then_remote_error():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = RetrievalClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.05, max_backoff_s=0.05)
    start = time.perf_counter()
    with pytest.raises(RemoteError, match=r"ConnectError.*asearch serve"):
        run(client.access(["https://c.test/1"]))
    assert time.perf_counter() - start >= 2 * 0.05 * 0.5


def test_read_timeout_is_not_retried():
    slow = Flaky(fail_times=0, delay_s=0.5)
    with serve_in_thread(slow.app) as url:
        client = RetrievalClient(url, timeout=0.1, retries=3, backoff_s=0.01)
        with pytest.raises(RemoteError, match=r"timed out after 0.1 s"):
            run(client.search(["q"], topk=1))
    assert slow.calls == 1


def test_unexpected_body_is_a_remote_error():
    odd = Flaky(fail_times=0, body={"hits": []})
    with serve_in_thread(odd.app) as url:
        with pytest.raises(RemoteError, match=r"not a ScoredRetrieveResponse"):
            run(RetrievalClient(url, retries=0).search(["q"], topk=1))


def test_empty_inputs_make_no_request():
    client = RetrievalClient("http://127.0.0.1:9", retries=0)  # nothing listens on the discard port
    assert run(client.search([], topk=3)) == [] and run(client.access([])) == []


def test_negative_retries_rejected():
    with pytest.raises(ValueError, match="retries must be >= 0, got -1"):
        RetrievalClient("http://127.0.0.1:1", retries=-1)
