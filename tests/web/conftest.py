"""Fixtures of the web tests: a fake web (Serper, SearXNG, Jina, a static site) on 127.0.0.1 and API keys
in the environment. Loopback is allowed only where a test says so (allow_private / allow_hosts)."""

from __future__ import annotations

import pytest

from asearch.web.fakes import FakeWeb

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
