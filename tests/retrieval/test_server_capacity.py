"""Over capacity the retrieval server sheds load with 503 + Retry-After, never a dropped connection, and
/health still answers; under max_pending every request is served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from asearch.corpus.types import Page, Passage
from asearch.retrieval.base import SearchHit
from asearch.retrieval.server import ServerConfig, create_app, serve_in_thread


class SlowRetriever:
    """Every query hits passage 0, after `delay_s`: requests stay in flight long enough to fill the server."""

    name = "slow"

    def __init__(self, passage: Passage, delay_s: float):
        self.passage, self.delay_s = passage, delay_s

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        time.sleep(self.delay_s)
        return [[SearchHit(self.passage, 1.0)] for _ in queries]


class OnePage:
    def __init__(self, page: Page):
        self.page = page

    def get(self, url: str) -> Page | None:
        return self.page if url == self.page.url else None

    def __len__(self) -> int:
        return 1


def test_requests_past_max_pending_get_503_with_retry_after_and_the_rest_are_served():
    page = Page(url="https://wiki.test/a", title="A", contents="A\ntext")
    passage = Passage(id="0", title="A", text="text", url=page.url)
    cfg = ServerConfig(max_pending=3, retry_after_s=2, max_batch=1)  # one query a call: 0.5 s each
    app = create_app(SlowRetriever(passage, delay_s=0.5), OnePage(page), cfg=cfg)

    async def go(url: str) -> tuple[list[httpx.Response], httpx.Response, httpx.Response, dict]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            calls = [c.post("/retrieve", json={"queries": [f"alpha {i}"]}) for i in range(8)]
            tasks = [asyncio.create_task(x) for x in calls]
            await asyncio.sleep(0.2)  # the first 3 hold the server for >= 0.5 s each
            access = await c.post("/access", json={"urls": [page.url]})
            health = await c.get("/health")  # answered while the server is full
            answers = await asyncio.gather(*tasks)  # an exception here would be a dropped connection
            return answers, access, health, (await c.get("/stats")).json()

    with serve_in_thread(app) as url:
        answers, access, health, stats = asyncio.run(go(url))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 3 + [503] * 5, codes
    busy = [r for r in answers if r.status_code == 503] + [access]
    assert all(r.status_code == 503 and r.headers["retry-after"] == "2" for r in busy)
    assert all("max_pending" in r.json()["detail"] for r in busy)
    assert health.status_code == 200
    assert stats["endpoints"]["/retrieve"]["status_codes"] == {"200": 3, "503": 5}
    # once the load is gone, the same server answers again (the in-flight count went back to zero)
    with serve_in_thread(app) as url:
        assert httpx.post(url + "/retrieve", json={"queries": ["alpha"]}, timeout=10).status_code == 200
