"""The web clients against loopback servers speaking their protocols: Serper, SearXNG, Jina reader, and a
static site read directly (HTML through trafilatura, PDF through pypdf, charsets, redirects, limits)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging

import pytest

from asearch.errors import ConfigError
from asearch.tools import AccessTool, SearchTool, run_tool
from asearch.web import (
    JinaReaderBackend,
    SearxngBackend,
    SerperBackend,
    WebPageBackend,
    WebRuntime,
    extract_text,
)
from asearch.web.fakes import minimal_pdf


def loopback(fake_web, **extra):
    """Direct-fetch config that trusts exactly the fake web's host:port (nothing else on loopback)."""
    return {"guard": {"allow_hosts": [f"127.0.0.1:{fake_web.port}"]}, **extra}


def test_serper_protocol_and_hits(fake_web):
    backend = SerperBackend({"base_url": fake_web.base_url})
    (hits,) = asyncio.run(backend.search(["Ada Varn Oslen"], 2))
    assert [h.passage.url for h in hits][0] == fake_web.url("ada-varn")
    assert len(hits) == 2 and hits[0].score == 1.0 and hits[1].score == 0.5
    assert hits[0].passage.title == "Ada Varn" and "born in Oslen" in hits[0].passage.text
    (req,) = fake_web.requests
    assert req.method == "POST" and req.path == "/search"
    assert req.headers["X-API-KEY"] == fake_web.serper_key
    assert json.loads(req.body) == {"q": "Ada Varn Oslen", "num": 2}


def test_serper_renders_like_local_search(fake_web):
    tool = SearchTool(SerperBackend({"base_url": fake_web.base_url}), {"topk": 3})
    obs = asyncio.run(run_tool(tool, "Brightwell Kettering"))
    assert obs.ok and obs.text.startswith(f'[Doc 1]({fake_web.url("brightwell")}):\n"Brightwell"\n')
    assert obs.metadata["urls"][0] == fake_web.url("brightwell") and obs.metadata["hit_count"] >= 2


def test_serper_bad_key_is_a_clear_observation_without_the_key(fake_web, monkeypatch, caplog):
    monkeypatch.setenv("SERPER_API_KEY", "sk-wrong-key-777")
    caplog.set_level(logging.DEBUG)
    backend = SerperBackend({"base_url": fake_web.base_url, "resilience": {"retries": 0}})
    obs = asyncio.run(run_tool(SearchTool(backend), "Oslen"))
    assert obs.error and "HTTP 403" in obs.text and "$SERPER_API_KEY" in obs.text
    assert "sk-wrong-key-777" not in obs.text + caplog.text + repr(backend)


def test_serper_without_key_fails_at_construction(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY")
    with pytest.raises(ConfigError, match="SERPER_API_KEY"):
        SerperBackend()


def test_searxng_protocol(fake_web):
    backend = SearxngBackend({"base_url": f"{fake_web.base_url}/searxng", "language": "en"})
    (hits,) = asyncio.run(backend.search(["Oslen harbour"], 3))
    assert hits[0].passage.url == fake_web.url("oslen") and hits[0].passage.title == "Oslen"
    (req,) = fake_web.requests
    assert req.method == "GET" and "format=json" in req.path and "q=Oslen+harbour" in req.path
    assert "language=en" in req.path


def test_searxng_403_explains_the_json_format_setting(fake_web):
    fake_web.fail_next("searxng", 1, status=403)
    backend = SearxngBackend({"base_url": f"{fake_web.base_url}/searxng"})
    obs = asyncio.run(run_tool(SearchTool(backend), "Oslen"))
    assert obs.error and "search.formats" in obs.text and "settings.yml" in obs.text


def test_jina_reader_json_and_bearer_key(fake_web):
    backend = JinaReaderBackend({"base_url": f"{fake_web.base_url}/jina"})
    target = "https://wiki.example.org/site/kettering"
    (page,) = asyncio.run(backend.access([target]))
    assert page.url == target and page.title == "Kettering" and "river Vell" in page.contents
    (req,) = fake_web.requests
    assert req.path == f"/jina/{target}" and req.headers["Authorization"] == f"Bearer {fake_web.jina_key}"
    assert "application/json" in req.headers["Accept"]


def test_jina_text_format_and_unknown_page(fake_web):
    from asearch.web.jina import parse_jina_text

    text = "Title: Oslen\n\nURL Source: https://x/oslen\n\nMarkdown Content:\nOslen is a city.\n"
    assert parse_jina_text(text) == {"title": "Oslen", "contents": "Oslen is a city."}
    tool = AccessTool(JinaReaderBackend({"base_url": f"{fake_web.base_url}/jina"}))
    obs = asyncio.run(run_tool(tool, "https://wiki.example.org/site/atlantis"))
    assert obs.error and "HTTP 422" in obs.text and "Failed to goto" in obs.text


def test_jina_refuses_local_targets_before_asking_the_reader(fake_web):
    tool = AccessTool(JinaReaderBackend({"base_url": f"{fake_web.base_url}/jina"}))
    obs = asyncio.run(run_tool(tool, "http://169.254.169.254/latest/meta-data/"))
    assert obs.error and "metadata" in obs.text
    assert fake_web.hits["jina"] == 0


def test_direct_fetch_extracts_main_text(fake_web):
    tool = AccessTool(WebPageBackend(loopback(fake_web)))
    obs = asyncio.run(run_tool(tool, fake_web.url("ada-varn")))
    assert obs.ok and obs.metadata["title"] == "Ada Varn"
    assert obs.text.startswith(f"[page 1/1 of {fake_web.url('ada-varn')}]\n")
    assert "born in Oslen" in obs.text
    assert "window.tracker" not in obs.text and "font-family" not in obs.text  # script and style dropped


def test_direct_fetch_pdf_text_charset_and_redirect(fake_web):
    pytest.importorskip("pypdf", reason="PDF text needs the web extra")
    backend = WebPageBackend(loopback(fake_web))
    redirect = f"{fake_web.base_url}/redirect?to=/site/oslen"
    urls = [fake_web.url("doc.pdf"), fake_web.url("notype"), fake_web.url("latin1"), redirect]
    pdf, notype, latin1, moved = asyncio.run(backend.access(urls))
    assert pdf.title == "Vell report" and "Kettering had 12 mills" in pdf.contents
    assert notype.contents == "Plain words from a server that names no type."
    assert "Café in Oslen, naïve prices." in latin1.contents
    assert moved.url == redirect and "harbour city" in moved.contents


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("image.png", "image/png; access reads only"),
        ("big?bytes=300000", "limit is 200,000"),
        ("atlantis", "HTTP 404 (the page does not exist)"),
        pytest.param(
            "broken.pdf",
            "the PDF could not be read",
            marks=pytest.mark.skipif(importlib.util.find_spec("pypdf") is None, reason="needs pypdf"),
        ),
        ("gzip-bomb", "over the 200,000-byte limit"),
    ],
)
def test_direct_fetch_refusals_are_observations(fake_web, name, needle):
    tool = AccessTool(WebPageBackend(loopback(fake_web, max_bytes=200_000)))
    obs = asyncio.run(run_tool(tool, fake_web.url(name)))
    assert obs.error and needle in obs.text


def test_redirect_loops_stop(fake_web):
    loop_url = f"{fake_web.base_url}/redirect"  # redirects to itself
    tool = AccessTool(WebPageBackend(loopback(fake_web, max_redirects=3)))
    obs = asyncio.run(run_tool(tool, loop_url))
    assert obs.error and "more than 3 times" in obs.text
    assert fake_web.hits["redirect"] == 4


def test_extract_pdf_and_html_fallback():
    pytest.importorskip("pypdf", reason="PDF text needs the web extra")
    got = extract_text(minimal_pdf("Hello from a PDF", "T"), "application/pdf", None, "x")
    assert got.kind == "pdf" and got.text == "Hello from a PDF" and got.title == "T"
    from asearch.web.extract import _SimpleHtmlText

    simple = _SimpleHtmlText.run(
        "<title>A</title><nav>menu</nav><script>x()</script><p>one</p><p>two &amp; 3</p>"
    )
    assert simple.title == "A" and simple.text == "one\ntwo & 3"


def test_one_runtime_counts_every_provider(fake_web):
    rt = WebRuntime()
    serper = SerperBackend({"base_url": fake_web.base_url}, runtime=rt)
    pages = WebPageBackend(loopback(fake_web), runtime=rt)

    async def go():
        await serper.search(["Oslen", "Kettering"], 2)
        await pages.access([fake_web.url("oslen")])

    asyncio.run(go())
    stats = rt.stats()
    assert stats["serper"]["calls"] == 2 and stats["direct"]["calls"] == 1
    assert stats["cost"]["serper_calls"] == 2 and stats["cost"]["serper_usd"] == pytest.approx(0.002)
    assert fake_web.hits["serper"] == 2 and fake_web.hits["site"] == 1


def test_an_answer_in_the_wrong_shape_is_a_final_error(fake_web):
    fake_web.fail_next("serper", 1, status=200)  # 200 with a body that has no `organic` list
    backend = SerperBackend({"base_url": fake_web.base_url})
    obs = asyncio.run(run_tool(SearchTool(backend), "Oslen"))
    assert obs.text == (
        "search failed: serper: answered without an 'organic' result list; is base_url a Serper-style API?"
    )
    assert fake_web.hits["serper"] == 1 and backend.runtime.costs.total_usd == 0.0
