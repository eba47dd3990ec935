"""Fixtures of the web tests: a fake web (Serper, SearXNG, Jina, a static site) on 127.0.0.1 and API keys
in the environment. Loopback is allowed only where a test says so (allow_private / allow_hosts)."""

from __future__ import annotations

import pytest

from asearch.web.fakes import DEFAULT_PAGES, FakeWeb

SERPER_KEY = "sk-serper-test-0123456789abcdef"
JINA_KEY = "jina-test-fedcba9876543210"


@pytest.fixture
def fake_web():
    with FakeWeb(serper_key=SERPER_KEY, jina_key=JINA_KEY) as web:
        yield web


@pytest.fixture(autouse=True)
def api_keys(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    monkeypatch.setenv("JINA_API_KEY", JINA_KEY)


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    """A byte-level BPE tokenizer that knows the fake web's pages and the agent's tags."""
    texts = [t for _, t in DEFAULT_PAGES.values()] * 20
    texts += ["<search></search><access></access><answer></answer><summary></summary><think></think>"] * 20
    return make_tokenizer(texts, vocab_size=400)
