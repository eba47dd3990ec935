"""The retrieval HTTP server: FastAPI app over any Retriever + PageStore, with micro-batched search.

Concurrent /retrieve requests are merged by `MicroBatcher` into one `retriever.search` call that runs
in a worker thread, so the event loop never blocks and no global lock serialises clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from asearch.config import Config
from asearch.errors import RemoteError
from asearch.retrieval.base import PageStore, Retriever
from asearch.retrieval.batching import MicroBatcher
from asearch.retrieval.protocol import (
    AccessRequest,
    BatchStats,
    EndpointStats,
    ErrorResponse,
    HealthResponse,
    Percentiles,
    RetrieveRequest,
    StatsResponse,
    hits_to_wire,
    lookup_page,
)

log = logging.getLogger(__name__)


class ServerConfig(Config):
    """`asearch serve` settings: where to listen, request bounds, and how concurrent searches are batched."""

    host: str = Field(
        "127.0.0.1", description="Bind address; loopback by default, anything else is reachable."
    )
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port).")
    default_topk: int = Field(3, ge=1, description="topk when a request omits it (Search-R1 default).")
    max_topk: int = Field(100, ge=1, description="Largest topk accepted (422 above).")
    max_queries: int = Field(
        16384,
        ge=1,
        description=(
            "Most queries in one /retrieve request (413 above); a trainer sends its whole rollout batch at "
            "once (Search-R1 GRPO: 512 prompts x 5 = 2,560), searched in parts of max_batch."
        ),
    )
    max_query_chars: int = Field(
        4096,
        ge=1,
        description=(
            "Queries longer than this are cut to it before searching, never refused; the response's "
            "`truncated_queries` and /stats count them."
        ),
    )
    max_urls: int = Field(64, ge=1, description="Most urls in one /access request (413 above).")
    max_body_bytes: int = Field(
        64 << 20,
        ge=1024,
        description=(
            "Largest request body (413), by Content-Length or as it streams in; room for max_queries queries "
            "of a few thousand characters."
        ),
    )
    max_pending: int = Field(
        4096,
        ge=1,
        description=(
            "Most /retrieve and /access requests in the server at once; one more is answered 503 with "
            "Retry-After (its client waits and retries) instead of queueing without bound."
        ),
    )
    retry_after_s: int = Field(1, ge=1, description="The Retry-After seconds of an over-capacity 503.")
    batch_window_ms: float = Field(
        0.0,
        ge=0,
        description=(
            "Extra wait for company when a request finds the batcher idle (the worker idles meanwhile); "
            "0 = batch exactly what queued up while the workers were busy."
        ),
    )
    max_batch: int = Field(
        256,
        ge=1,
        description=(
            "Most queries per retriever call: the memory bound of a search (encoder batch, score matrix); "
            "a larger request is searched in parts of this size."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        description="Retriever calls in flight at once; >1 needs a retriever safe for concurrent calls.",
    )
    stats_window: int = Field(2048, ge=1, description="Latency percentiles cover this many recent samples.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn log level."
    )


# --------------------------------------------------------------------------- statistics


class _Window:
    """The last `size` latency samples, for percentiles that follow the current load."""

    def __init__(self, size: int):
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)

    def percentiles(self) -> Percentiles:
        if not self._samples:
            return Percentiles()
        ordered = sorted(self._samples)
        n = len(ordered)

        def rank(p: float) -> float:  # nearest-rank: the smallest sample with >= p% of samples at or below it
            return round(ordered[max(0, math.ceil(p / 100 * n) - 1)] * 1000, 3)

        return Percentiles(p50=rank(50), p90=rank(90), p99=rank(99), samples=n)


def batch_bucket(size: int) -> str:
    """Power-of-two histogram label: 1, 2, 3-4, 5-8, 9-16, ..."""
    if size <= 2:
        return str(size)
    top = 1 << (size - 1).bit_length()
    return f"{top // 2 + 1}-{top}"


@dataclass
class _EndpointCounters:
    requests: int = 0
    errors: int = 0
    status_codes: dict[str, int] = field(default_factory=dict)
    window: _Window | None = None


class ServerStats:
    """Counters the /stats endpoint reports. Touched only from the event loop thread, so no locks."""

    ENDPOINTS = ("/retrieve", "/access", "/health", "/stats", "other")

    def __init__(self, window: int):
        self.started = time.monotonic()
        self.endpoints = {e: _EndpointCounters(window=_Window(window)) for e in self.ENDPOINTS}
        self.batches = 0
        self.batched_queries = 0
        self.truncated_queries = 0  # cut to max_query_chars (ServerConfig) before searching
        self.max_batch_seen = 0
        self._histogram: dict[int, int] = {}  # bucket upper bound -> count (sorted on report)
        self._batch_window = _Window(window)

    def record_request(self, path: str, status: int, seconds: float) -> None:
        c = self.endpoints[path if path in self.endpoints else "other"]
        c.requests += 1
        c.errors += status >= 400
        c.status_codes[str(status)] = c.status_codes.get(str(status), 0) + 1
        assert c.window is not None
        c.window.add(seconds)

    def record_batch(self, size: int, seconds: float) -> None:
        self.batches += 1
        self.batched_queries += size
        self.max_batch_seen = max(self.max_batch_seen, size)
        top = size if size <= 2 else 1 << (size - 1).bit_length()
        self._histogram[top] = self._histogram.get(top, 0) + 1
        self._batch_window.add(seconds)

    def histogram(self) -> dict[str, int]:
        return {batch_bucket(top): self._histogram[top] for top in sorted(self._histogram)}

    def report(self, index: dict[str, Any]) -> StatsResponse:
        endpoints = {}
        for name, c in self.endpoints.items():
            assert c.window is not None
            endpoints[name] = EndpointStats(
                requests=c.requests,
                errors=c.errors,
                status_codes=dict(c.status_codes),
                latency_ms=c.window.percentiles(),
            )
        batching = BatchStats(
            batches=self.batches,
            queries=self.batched_queries,
            max_size=self.max_batch_seen,
            size_histogram=self.histogram(),
            latency_ms=self._batch_window.percentiles(),
        )
        return StatsResponse(
            uptime_s=round(time.monotonic() - self.started, 3),
            endpoints=endpoints,
            batching=batching,
            truncated_queries=self.truncated_queries,
            index=index,
        )


class _StatsAndLimitMiddleware:
    """ASGI middleware: rejects oversized bodies by Content-Length (413), sheds load past `max_pending`
    requests in flight (503 + Retry-After: a client told when to come back, not a dropped connection) and
    times every request."""

    _SHED = frozenset({"/retrieve", "/access"})  # /health and /stats answer even when the server is full

    def __init__(
        self, app: Any, stats: ServerStats, max_body_bytes: int, max_pending: int = 4096, retry_after_s: int = 1
    ):
        self.app, self.stats, self.max_body_bytes = app, stats, max_body_bytes
        self.max_pending, self.retry_after_s = max_pending, retry_after_s
        self.pending = 0  # touched only on the event loop thread

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # if the app dies before answering, the client sees a dropped request: count it as 500
        path = scope.get("path", "")

        async def send_and_capture(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        counted = path in self._SHED
        try:
            if counted and self.pending >= self.max_pending:
                counted = False
                body = ErrorResponse(detail=f"server busy: {self.pending} requests in flight (max_pending)")
                headers = {"Retry-After": str(self.retry_after_s)}
                await JSONResponse(body.model_dump(), 503, headers)(scope, receive, send_and_capture)
                return
            self.pending += counted
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                body = ErrorResponse(
                    detail=f"request body is {int(length)} bytes, over max_body_bytes={self.max_body_bytes}"
                )
                await JSONResponse(body.model_dump(), status_code=413)(scope, receive, send_and_capture)
                return
            await self.app(scope, receive, send_and_capture)
        finally:
            self.pending -= counted
            self.stats.record_request(path, status, time.perf_counter() - start)


# --------------------------------------------------------------------------- the app


class _OneThread:
    """A single worker thread, started on first use and again after close() (an app can be served twice)."""

    def __init__(self, name: str):
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    def get(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _describe_errors(errors: Sequence[Any]) -> tuple[int, str]:
    """(status, one readable message) for a body that failed JSON parsing (400) or validation (422)."""
    problems = []
    for e in errors:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            return 400, f"request body is not valid JSON: {ctx.get('error', e.get('msg'))}"
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        got = e.get("input")
        shown = repr(got) if len(repr(got)) <= 80 else repr(got)[:77] + "..."
        problems.append(f"{loc}: {e.get('msg')} (got {shown})")
    return 422, "; ".join(problems) or "invalid request"


M = TypeVar("M", bound=BaseModel)


_EXAMPLES = {RetrieveRequest: '{"queries": ["..."], "topk": 3}', AccessRequest: '{"urls": ["..."]}'}


async def _parse_body(request: Request, model: type[M], max_bytes: int) -> M:
    """The JSON body as `model`, whatever the Content-Type says (curl -d sends a form type, some clients
    none). Bodies over `max_bytes` are refused while streaming in, so chunked uploads are bounded too."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HTTPException(413, f"request body is over max_body_bytes={max_bytes}")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        example = _EXAMPLES.get(model, "{}")
        raise HTTPException(422, f"request body is empty; send a JSON object like {example}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        status, message = _describe_errors(e.errors())
        raise HTTPException(status, message) from None


_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 413, 422, 500)}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI request-body entry for a route that parses its body itself (see _parse_body)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def create_app(
    retriever: Retriever,
    pages: PageStore,
    *,
    cfg: ServerConfig | None = None,
    info: dict[str, Any] | None = None,
) -> FastAPI:
    """A FastAPI app serving `retriever` and `pages`; `info` (index path, method, manifest summary) is
    reported by /health and /stats."""
    service = RetrievalService(retriever, pages, cfg or ServerConfig(), dict(info or {}))
    app = FastAPI(
        title="asearch retrieval server",
        description="Search-R1/ASearcher-compatible /retrieve and /access over a local index.",
        lifespan=_lifespan,
    )
    app.state.service = service
    app.state.stats, app.state.batcher, app.state.config = service.stats, service.batcher, service.cfg
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.include_router(routes)
    app.add_middleware(
        _StatsAndLimitMiddleware, stats=service.stats, max_body_bytes=service.cfg.max_body_bytes,
        max_pending=service.cfg.max_pending, retry_after_s=service.cfg.retry_after_s,
    )  # fmt: skip
    return app


class RetrievalService:
    """What the routes serve: the retriever behind a micro-batcher, the page store on its own thread, the
    stats; `close()` stops the batcher's workers and the page thread."""

    def __init__(self, retriever: Retriever, pages: PageStore, cfg: ServerConfig, info: dict[str, Any]) -> None:
        self.pages, self.cfg, self.info = pages, cfg, info
        self.stats = ServerStats(cfg.stats_window)
        self.batcher = MicroBatcher(
            retriever,
            window_s=cfg.batch_window_ms / 1000,
            max_batch=cfg.max_batch,
            workers=cfg.workers,
            on_batch=self.stats.record_batch,
        )
        # Page lookups get their own single thread: they never wait behind a search batch, and stores that
        # keep per-thread handles (sqlite) always see the same thread.
        self.page_thread = _OneThread("asearch-pages")
        self.retriever_name = str(getattr(retriever, "name", type(retriever).__name__))

    async def retrieve(self, req: RetrieveRequest) -> dict[str, Any]:
        """Top-k passages per query, with queries over max_query_chars cut and counted."""
        cfg, queries = self.cfg, req.query_list()
        topk = req.topk if req.topk is not None else cfg.default_topk
        if len(queries) > cfg.max_queries:
            raise HTTPException(413, f"too many queries: {len(queries)} > max_queries={cfg.max_queries}")
        if topk > cfg.max_topk:
            raise HTTPException(422, f"topk={topk} is over max_topk={cfg.max_topk}")
        # peers' servers take any length, and their clients retry a refusal until they fail: cut and count
        truncated = sum(len(q) > cfg.max_query_chars for q in queries)
        if truncated:
            queries = [q[: cfg.max_query_chars] for q in queries]
            self.stats.truncated_queries += truncated
        try:
            hits = await self.batcher.search(queries, topk)
        except Exception as e:
            log.exception("retriever %s failed on a batch", self.retriever_name)
            raise HTTPException(500, f"retriever {self.retriever_name!r} failed: {type(e).__name__}: {e}") from e
        return {"result": hits_to_wire(hits, req.return_scores), "truncated_queries": truncated}

    async def access(self, req: AccessRequest) -> dict[str, Any]:
        """Full pages by url, None for a url not in the corpus."""
        if len(req.urls) > self.cfg.max_urls:
            raise HTTPException(413, f"too many urls: {len(req.urls)} > max_urls={self.cfg.max_urls}")

        def fetch() -> list[dict[str, Any] | None]:
            found = [lookup_page(self.pages, u) for u in req.urls]
            return [None if p is None else p.to_dict() for p in found]

        try:
            result = await asyncio.get_running_loop().run_in_executor(self.page_thread.get(), fetch)
        except Exception as e:
            log.exception("page store failed")
            raise HTTPException(500, f"page store failed: {type(e).__name__}: {e}") from e
        return {"result": result}

    def health(self) -> HealthResponse:
        return HealthResponse(
            status="ok",
            retriever=self.retriever_name,
            pages=len(self.pages),
            uptime_s=round(time.monotonic() - self.stats.started, 3),
            info=self.info,
        )

    def close(self) -> None:
        self.batcher.close()
        self.page_thread.close()


def _service(request: Request) -> RetrievalService:
    return request.app.state.service


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        yield
    finally:
        app.state.service.close()


async def _invalid_request(_request: Request, err: RequestValidationError) -> JSONResponse:
    status, message = _describe_errors(err.errors())
    return JSONResponse(ErrorResponse(detail=message).model_dump(), status_code=status)


async def _http_error(_request: Request, err: HTTPException) -> JSONResponse:
    return JSONResponse(ErrorResponse(detail=str(err.detail)).model_dump(), status_code=err.status_code)


routes = APIRouter()


@routes.post("/retrieve", responses=_ERRORS, openapi_extra=_json_body(RetrieveRequest))
async def retrieve(request: Request) -> JSONResponse:
    """Top-k passages per query: `{"result": [[doc, ...], ...], "truncated_queries": n}` (docs wrapped
    with scores on request; n queries were cut to max_query_chars)."""
    service = _service(request)
    req = await _parse_body(request, RetrieveRequest, service.cfg.max_body_bytes)
    return JSONResponse(await service.retrieve(req))


@routes.post("/access", responses=_ERRORS, openapi_extra=_json_body(AccessRequest))
async def access(request: Request) -> JSONResponse:
    """Full pages by url: `{"result": [page-or-null, ...]}`, null for a url not in the corpus."""
    service = _service(request)
    req = await _parse_body(request, AccessRequest, service.cfg.max_body_bytes)
    return JSONResponse(await service.access(req))


@routes.get("/health", response_model=HealthResponse)
async def health(request: Request) -> HealthResponse:
    """Liveness plus what is being served."""
    return _service(request).health()


@routes.get("/stats", response_model=StatsResponse)
async def get_stats(request: Request) -> StatsResponse:
    """Request/error counts per endpoint, latency percentiles, batch sizes, index summary."""
    service = _service(request)
    return service.stats.report(service.info)


# --------------------------------------------------------------------------- running it


def summarize_manifest(manifest: dict[str, Any], *, max_entries: int = 16) -> dict[str, Any]:
    """What /health and /stats show of an index manifest: scalars and short lists, nested mappings one level
    deep; a mapping with more than `max_entries` entries (e.g. the file list) becomes its entry count."""
    out: dict[str, Any] = {}
    for key, value in manifest.items():
        if isinstance(value, str | int | float | bool) or value is None:
            out[key] = value
        elif (
            isinstance(value, list | tuple)
            and len(value) <= 8
            and all(isinstance(v, str | int | float) for v in value)
        ):
            out[key] = list(value)
        elif isinstance(value, dict):
            if len(value) > max_entries:
                out[key] = f"<{len(value)} entries>"
            else:
                inner = summarize_manifest(value, max_entries=max_entries)
                out[key] = {k: v for k, v in inner.items() if not isinstance(v, dict)}
    return out


def app_from_index(
    index_dir: str | Path,
    *,
    method: str = "bm25",
    cfg: ServerConfig | None = None,
) -> tuple[FastAPI, dict[str, Any]]:
    """Open the index at `index_dir` and build the app over its `method` retriever and its pages.
    Returns (app, info) where info is what /health reports."""
    from asearch.retrieval.index import open_index  # the index layer pulls in heavy optional deps

    index = open_index(index_dir)
    retriever = index.retriever(method)
    info = {
        "index": str(index_dir),
        "method": method,
        "passages": len(index),
        "pages": len(index.pages),
        "manifest": summarize_manifest(dict(index.manifest)),
    }
    return create_app(retriever, index.pages, cfg=cfg, info=info), info


def run_server(app: FastAPI, cfg: ServerConfig) -> None:
    """Serve `app` with uvicorn on cfg.host:cfg.port until interrupted."""
    import uvicorn

    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False)


@contextlib.contextmanager
def serve_in_thread(
    app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 20.0
) -> Iterator[str]:
    """Run `app` under a real uvicorn server in a background thread; yields its base url (for tests and
    embedding). Port 0 picks a free port, read back from the bound socket, so there is no race."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="asearch-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RemoteError(f"uvicorn failed to start on {host}:{port} (is the port taken?)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RemoteError(f"uvicorn did not start on {host}:{port} within {startup_timeout_s:g} s")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


__all__ = [
    "MicroBatcher",
    "ServerConfig",
    "ServerStats",
    "app_from_index",
    "batch_bucket",
    "create_app",
    "run_server",
    "serve_in_thread",
    "summarize_manifest",
]
