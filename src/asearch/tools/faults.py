"""Injected tool faults (`tools.faults`): a chosen fraction of search / access calls fails the way a real
retrieval server fails, so a run can be checked for what it does when the infrastructure is flaky.

`inject_faults(sources, cfg)` wraps the search and page backends `build_tools` opened (a local index, a
retrieval server or the web alike). Before a call reaches its backend, the injector decides whether it
fails, and how. A failing call never reaches the backend: it is sent by a real `RetrievalClient` to a
transport that answers with the fault, so the tool gets the client's own exception, not an imitation:

    kind          the transport                     the tool gets                               metadata["error"]
    timeout       raises httpx.ReadTimeout          RemoteError "... timed out after 30 s ..."  timeout
    server_error  answers HTTP 503                  RemoteError "... (last: HTTP 503: ...)"     remote
    garbage       answers 200 with a non-JSON body  RemoteError "... answered data that is not" garbage

Faults come at once (a timeout does not wait out a deadline), so a run with faults is not slower.

Which calls fail: a call of backend t (`search` or `access`) whose arguments a were asked n times before
draws u = H(seed, t, a, n) in [0, 1) (H: a keyed hash) and fails as `timeout` when u < r_timeout, as
`server_error` when u < r_timeout + r_server_error, as `garbage` when u < the sum of the three rates. So
which calls fail depends on the seed and on what was asked, not on how concurrent episodes interleave
(among identical calls, only which episode gets the n-th one can), and a repeated call gets a fresh draw.
The injector counts calls and faults by kind (`metrics()`, `fault_metrics`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import httpx
from pydantic import Field, model_validator

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.retrieval.base import SearchHit
from asearch.retrieval.client import RetrievalClient
from asearch.tools.access import as_page_backend
from asearch.tools.base import ToolSources, behind_tools
from asearch.tools.search import as_search_backend

__all__ = ["FaultConfig", "FaultInjector", "FaultKind", "fault_metrics", "inject_faults"]

FaultKind = Literal["timeout", "server_error", "garbage"]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
FaultyBackend = Literal["search", "access"]

# Where the injected calls go; `.invalid` can never resolve, and the url in a failure message says what it was.
INJECTED_URL = "http://injected-fault.invalid"


class FaultConfig(Config):
    """Injected tool faults: per-kind fractions of the calls that fail as a real server's would (docs/tools.md)."""

    timeout: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Fraction of calls that fail as a read timeout (RetrievalClient's RemoteError over "
        "httpx.ReadTimeout; error kind `timeout`). Raised at once, without waiting.",
    )  # fmt: skip
    server_error: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Fraction of calls that fail as an HTTP 503 from the server (error kind `remote`).",
    )  # fmt: skip
    garbage: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Fraction of calls answered with HTTP 200 and a body that is not the protocol's JSON "
        "(error kind `garbage`).",
    )  # fmt: skip
    seed: int = Field(
        0, description="Which calls fail: the same seed fails the same calls (module docstring)."
    )
    tools: tuple[FaultyBackend, ...] = Field(
        ("search", "access"),
        description="The backends whose calls may fail: `search` (what the search tool calls) and `access` "
        "(the page backend, what access calls).",
    )

    @model_validator(mode="after")
    def _rates_fit(self) -> FaultConfig:
        if self.rate > 1.0:
            raise ValueError(
                f"tools.faults rates add up to {self.rate:g} (timeout {self.timeout:g} + server_error "
                f"{self.server_error:g} + garbage {self.garbage:g}); their sum must be at most 1"
            )
        return self

    @property
    def rate(self) -> float:
        """The fraction of calls that fail, all kinds together."""
        return self.timeout + self.server_error + self.garbage


def _fault_client(kind: FaultKind) -> RetrievalClient:
    """A real RetrievalClient whose transport answers every request with fault `kind` (no retries, so a
    503 fails at once, as it does once a real client's retries are spent)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if kind == "timeout":
            raise httpx.ReadTimeout("injected fault: no answer in time", request=request)
        if kind == "server_error":
            return httpx.Response(503, json={"detail": "injected fault: service unavailable"})
        return httpx.Response(200, content=b"<html>\xff\xfe injected fault: not the protocol's JSON</html>")

    return RetrievalClient(INJECTED_URL, retries=0, transport=httpx.MockTransport(answer))


class FaultInjector:
    """Decides, per call, whether it fails and how (`cfg`), raises that failure, and counts calls and
    faults. One injector serves the search and page backends of one `build_tools`."""

    def __init__(self, cfg: FaultConfig):
        self.cfg = cfg
        self.calls: Counter[str] = Counter()  # by backend
        self.injected: Counter[tuple[str, str]] = Counter()  # by (backend, kind)
        self._asked: dict[bytes, int] = {}  # how often each (backend, arguments) was asked
        self._clients = {kind: _fault_client(kind) for kind in FAULT_KINDS}

    def draw(self, backend: str, key: str) -> FaultKind | None:
        """The fault of this call of `backend` with arguments `key`, or None; counts the call."""
        self.calls[backend] += 1
        if backend not in self.cfg.tools or self.cfg.rate <= 0.0:
            return None
        asked = hashlib.blake2b(f"{backend}\x00{key}".encode(), digest_size=12).digest()
        n = self._asked.get(asked, 0)
        self._asked[asked] = n + 1
        digest = hashlib.blake2b(f"{self.cfg.seed}\x00{n}".encode() + asked, digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64
        edge = 0.0
        for kind in FAULT_KINDS:
            edge += getattr(self.cfg, kind)
            if u < edge:
                self.injected[(backend, kind)] += 1
                return kind
        return None

    async def search(self, kind: FaultKind, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        """The failing search call: raises what RetrievalClient.search raises for `kind`."""
        return await self._clients[kind].search(queries, topk)

    async def access(self, kind: FaultKind, urls: Sequence[str]) -> list[Page | None]:
        """The failing page call: raises what RetrievalClient.access raises for `kind`."""
        return await self._clients[kind].access(urls)

    def counts(self) -> dict[str, int]:
        """Faults injected by kind, all backends together (every kind listed)."""
        out: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        for (_, kind), n in self.injected.items():
            out[kind] += n
        return out

    def metrics(self, prefix: str = "faults/") -> dict[str, float]:
        """`{"faults/calls": ..., "faults/injected": ..., "faults/injected/timeout": ..., ...}` for RunDir.log
        and summary.json (cumulative over the injector's life)."""
        counts = self.counts()
        out = {
            f"{prefix}calls": float(sum(self.calls.values())),
            f"{prefix}injected": float(sum(counts.values())),
        }
        out.update({f"{prefix}injected/{kind}": float(n) for kind, n in counts.items()})
        return out

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()


class _FaultyBackend:
    """A backend behind the injector; every other attribute is the wrapped backend's (so `web_metrics`
    still finds a web backend's runtime)."""

    def __init__(self, inner: Any, faults: FaultInjector):
        self.inner, self.faults = inner, faults

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "faults"):  # not set yet (a copy being made): no recursion through self.inner
            raise AttributeError(name)
        return getattr(self.inner, name)


class FaultySearchBackend(_FaultyBackend):
    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        kind = self.faults.draw("search", "\x1f".join(queries))
        if kind is not None:
            return await self.faults.search(kind, queries, topk)
        return await self.inner.search(queries, topk)


class FaultyPageBackend(_FaultyBackend):
    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        kind = self.faults.draw("access", "\x1f".join(urls))
        if kind is not None:
            return await self.faults.access(kind, urls)
        return await self.inner.access(urls)


def inject_faults(sources: ToolSources, cfg: FaultConfig) -> tuple[ToolSources, list[Any]]:
    """`sources` with both backends behind one FaultInjector, and the closers of what this made."""
    faults = FaultInjector(cfg)
    search, pages = as_search_backend(sources.search), as_page_backend(sources.pages)
    pairs: tuple[tuple[Any, Any], ...] = ((search, sources.search), (pages, sources.pages))  # made: an adapter
    made = [b.close for b, given in pairs if b is not given]
    wrapped = ToolSources(search=FaultySearchBackend(search, faults), pages=FaultyPageBackend(pages, faults))
    return wrapped, [*made, faults.aclose]


def fault_metrics(tools: Mapping[str, Any]) -> dict[str, float]:
    """`FaultInjector.metrics()` of the injector behind an agent's tools, or {} without `tools.faults`.
    Eval and training call it on whatever tools the config built, like `web_metrics`."""
    faults = behind_tools(tools, "faults", FaultInjector)
    return faults.metrics() if faults is not None else {}
