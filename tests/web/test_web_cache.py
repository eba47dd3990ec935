"""The persistent web cache: keys, TTL, hit rates, cache-only replay without a server, and several
processes writing one SQLite file at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from asearch.errors import ConfigError
from asearch.tools import AccessTool, SearchTool, run_tool
from asearch.web import (
    CacheConfig,
    SerperBackend,
    WebCache,
    WebConfig,
    WebPageBackend,
    WebRuntime,
    normalize_query,
    normalize_url_key,
    open_web,
)


def test_keys_are_normalised():
    assert normalize_query("  Ada   VARN\tborn ") == normalize_query("ada varn born") == "ada varn born"
    assert normalize_query("Ｏｓｌｅｎ") == "oslen"  # full-width forms (NFKC)
    assert normalize_url_key("HTTPS://Example.ORG:443/Wiki/A?x=1#frag") == "https://example.org/Wiki/A?x=1"
    assert normalize_url_key("http://example.org") == "http://example.org/"
    assert normalize_url_key("http://example.org:8080/a") == "http://example.org:8080/a"


def test_values_persist_and_expire(tmp_path):
    now = [1000.0]
    path = tmp_path / "c.sqlite"

    async def go():
        cache = WebCache(path, ttl_s=60, clock=lambda: now[0])
        await cache.put("search/x", "k", [{"url": "u"}])
        cache.close()
        again = WebCache(path, ttl_s=60, clock=lambda: now[0])  # a new process would see the same
        first = await again.get("search/x", "k")
        now[0] += 61
        expired = await again.get("search/x", "k")
        missing = await again.get("search/x", "other")
        stats = again.stats()
        again.close()
        return first, expired, missing, stats

    first, expired, missing, stats = asyncio.run(go())
    assert first == [{"url": "u"}] and expired is None and missing is None
    assert stats == {
        "hits": 1,
        "misses": 2,
        "expired": 1,
        "writes": 0,
        "errors": 0,
        "hit_rate": pytest.approx(1 / 3),
    }


def test_repeated_searches_hit_the_cache(fake_web, tmp_path):
    rt = WebRuntime(WebCache(tmp_path / "c.sqlite"))
    tool = SearchTool(SerperBackend({"base_url": fake_web.base_url}, runtime=rt))

    async def go():
        return [
            await run_tool(tool, q)
            for q in ("Oslen harbour", "oslen   HARBOUR", "Kettering", "Oslen harbour")
        ]

    obs = asyncio.run(go())
    assert obs[0].text == obs[1].text == obs[3].text
    assert fake_web.hits["serper"] == 2
    assert rt.cache.stats()["hits"] == 2 and rt.cache.stats()["hit_rate"] == 0.5
    assert rt.costs.stats()["serper_calls"] == 2  # cached answers cost nothing


def test_cache_only_replays_without_any_server(fake_web, tmp_path, monkeypatch):
    path = tmp_path / "replay.sqlite"
    cfg = WebConfig.model_validate(
        {
            "serper": {"base_url": fake_web.base_url},
            "fetch": {"guard": {"allow_hosts": [f"127.0.0.1:{fake_web.port}"]}},
            "cache": {"path": str(path)},
        }
    )
    recorded = open_web(cfg)
    page_url, gone_url = fake_web.url("brightwell"), fake_web.url("atlantis")

    async def session(web):
        search, access = SearchTool(web.search), AccessTool(web.pages)
        s = await run_tool(search, "Brightwell founded")
        a = await run_tool(access, page_url)
        gone = await run_tool(access, gone_url)
        return s, a, gone

    live = asyncio.run(session(recorded))
    asyncio.run(recorded.aclose())
    fake_web.stop()  # nothing answers any more, and no key is needed
    monkeypatch.delenv("SERPER_API_KEY")

    replay = open_web(cfg.model_copy(update={"cache": CacheConfig(path=str(path), mode="cache_only")}))
    again = asyncio.run(session(replay))
    assert [o.text for o in again] == [o.text for o in live]
    assert live[2].error and "HTTP 404" in live[2].text  # the 404 was recorded and replays as such
    assert replay.runtime.cache.stats()["hits"] == 3 and replay.runtime.cache.stats()["hit_rate"] == 1.0

    miss = asyncio.run(run_tool(SearchTool(replay.search), "never asked before"))
    assert miss.error and "cache_only mode" in miss.text and "no request is made" in miss.text
    asyncio.run(replay.aclose())


def test_cache_only_needs_an_existing_cache(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        WebCache(tmp_path / "nope.sqlite", mode="cache_only")


def test_a_corrupt_cache_file_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="bad.sqlite"):
        WebCache(bad)


def test_blocked_urls_never_touch_the_cache(tmp_path):
    rt = WebRuntime(WebCache(tmp_path / "c.sqlite"))
    obs = asyncio.run(run_tool(AccessTool(WebPageBackend(runtime=rt)), "http://127.0.0.1/admin"))
    assert obs.error and rt.cache.stats()["misses"] == 0 and rt.cache.stats()["hits"] == 0


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from asearch.web.cache import WebCache

    async def main(path, worker):
        cache = WebCache(path)
        for i in range(40):
            await cache.put("page/direct", f"w{worker}-{i}", {"worker": worker, "i": i})
            await cache.put("page/direct", "shared", {"worker": worker, "i": i})
            assert (await cache.get("page/direct", f"w{worker}-{i}"))["i"] == i
        cache.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def test_processes_share_one_cache_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    WebCache(path).close()  # create the schema once, as a run would
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)], stderr=subprocess.PIPE)
        for w in range(3)
    ]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    cache = WebCache(path)

    async def read_all():
        return [await cache.get("page/direct", f"w{w}-{i}") for w in range(3) for i in range(40)]

    values = asyncio.run(read_all())
    assert values == [{"worker": w, "i": i} for w in range(3) for i in range(40)]
    assert len(cache) == 3 * 40 + 1
    shared = asyncio.run(cache.get("page/direct", "shared"))
    assert shared["i"] == 39  # the last write of whichever worker finished last
    cache.close()
