"""A fake web on loopback for tests and offline demos: one real HTTP server that speaks the Serper,
SearXNG and Jina-reader protocols over a small static site, with switches for failures and delays.

    POST /search                 Serper: header X-API-KEY, body {"q", "num"} -> {"organic": [...]}
    GET  /searxng/search         SearXNG: ?q=...&format=json -> {"results": [...]}
    GET  /jina/<url>             Jina reader: bearer key; JSON {"data": {...}} or its text format
    GET  /site/<name>            the static site: html pages, doc.pdf, broken.pdf, image.png, notype,
                                 latin1, big?bytes=N, gzip-bomb
    GET  /redirect?to=<url>      302 to <url> (to itself without `to`: a redirect loop)
    GET  /secret                 the target SSRF tests try to reach ("SECRET", counted)
"""

from __future__ import annotations

import gzip
import json
import re
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

DEFAULT_PAGES: dict[str, tuple[str, str]] = {
    "ada-varn": (
        "Ada Varn",
        "Ada Varn is a chemist. Ada Varn was born in Oslen. She works for Brightwell, where she leads the "
        "catalysis group. She studied at the University of Tarnia.",
    ),
    "oslen": ("Oslen", "Oslen is a harbour city in Tarnia. Oslen has a population of about 40,000 people."),
    "brightwell": (
        "Brightwell",
        "Brightwell is a chemicals company founded in 1921. Its headquarters are in Kettering.",
    ),
    "kettering": ("Kettering", "Kettering is an industrial town in northern Tarnia on the river Vell."),
}


def minimal_pdf(text: str, title: str = "") -> bytes:
    """A valid one-page PDF whose page shows `text` (Helvetica, one line) and whose Info dict has `title`."""
    esc = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream = f"BT /F1 12 Tf 72 720 Td ({esc}) Tj ET".encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> "
        b"/Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Title (" + title.encode("latin-1") + b") >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def page_html(title: str, text: str) -> str:
    """A page with the chrome real pages have (menu, script, footer) around the article."""
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title} - Fake Wiki</title>"
        "<script>window.tracker = 'not content';</script><style>body{font-family:serif}</style></head>"
        "<body><nav><a href='/'>Home</a> | <a href='/random'>Random page</a></nav>"
        f"<main><article><h1>{title}</h1><p>{text}</p></article></main>"
        "<footer>Text is available under a fake licence.</footer></body></html>"
    )


@dataclass
class Fault:
    """What the next `count` requests to a route get instead of a normal answer."""

    count: int
    status: int = 500
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedRequest:
    route: str
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeWeb:
    """The fake web server; use as a context manager. `base_url` is `http://127.0.0.1:<port>`."""

    def __init__(
        self,
        pages: dict[str, tuple[str, str]] | None = None,
        *,
        serper_key: str | None = "test-serper-key",
        jina_key: str | None = None,
        tls: tuple[str, str] | None = None,
    ):
        self.pages = dict(DEFAULT_PAGES if pages is None else pages)
        self.serper_key, self.jina_key = serper_key, jina_key
        self.tls = tls  # (certfile, keyfile): serve https
        self.requests: list[RecordedRequest] = []
        self.hits: Counter[str] = Counter()
        self.delay_s: dict[str, float] = {}
        self.max_in_flight: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> FakeWeb:
        web = self

        class Handler(_Handler):
            fake = web

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._port = int(self._server.server_address[1])  # kept after stop() for late, slow handlers
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeWeb:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._port is not None, "start() the fake web first"
        return self._port

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        """The url of a site page."""
        return f"{self.base_url}/site/{name}"

    def fail_next(
        self, route: str, count: int = 1, *, status: int = 500, delay_s: float = 0.0, **headers: str
    ) -> None:
        """The next `count` requests to `route` (serper, searxng, jina, site) answer `status` after `delay_s`."""
        with self._lock:
            self._faults.setdefault(route, []).append(
                Fault(count, status, delay_s, {k.replace("_", "-"): v for k, v in headers.items()})
            )

    def take_fault(self, route: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(route) or []
            while queue and queue[0].count <= 0:
                queue.pop(0)
            if not queue:
                return None
            queue[0].count -= 1
            return queue[0]

    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)
            self.hits[req.route] += 1

    def enter(self, route: str) -> None:
        with self._lock:
            self._in_flight[route] += 1
            self.max_in_flight[route] = max(self.max_in_flight[route], self._in_flight[route])

    def leave(self, route: str) -> None:
        with self._lock:
            self._in_flight[route] -= 1

    # ------------------------------------------------------------------ content

    def search(self, query: str, n: int) -> list[dict[str, Any]]:
        """Pages ranked by how many query words they contain (title words count double)."""
        words = set(re.findall(r"\w+", query.lower()))
        scored = []
        for name, (title, text) in self.pages.items():
            tw, xw = re.findall(r"\w+", title.lower()), re.findall(r"\w+", text.lower())
            score = sum(2 for w in tw if w in words) + sum(1 for w in set(xw) if w in words)
            if score:
                scored.append((score, name, title, text))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return [
            {"title": title, "url": self.url(name), "snippet": text[:160], "score": float(score)}
            for score, name, title, text in scored[:n]
        ]

    def page_for(self, url: str) -> tuple[str, str] | None:
        """The page behind a url of this site (any host: the reader does not care where it lives)."""
        path = urlsplit(url).path
        if path.startswith("/site/"):
            return self.pages.get(path[len("/site/") :])
        return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients that hang up are part of the tests
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeWeb
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    # ------------------------------------------------------------------ plumbing

    def _route(self) -> str:
        p = self.path
        if p.startswith("/searxng/"):
            return "searxng"
        if p.startswith("/search"):
            return "serper"
        if p.startswith("/jina/"):
            return "jina"
        if p.startswith("/site/"):
            return "site"
        if p.startswith("/redirect"):
            return "redirect"
        if p.startswith("/secret"):
            return "secret"
        return "other"

    def _send(
        self, status: int, body: bytes, ctype: str | None, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _handle(self) -> None:
        route = self._route()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.fake.record(RecordedRequest(route, self.command, self.path, dict(self.headers.items()), body))
        self.fake.enter(route)
        try:
            delay = self.fake.delay_s.get(route, 0.0)
            fault = self.fake.take_fault(route)
            if fault is not None:
                time.sleep(fault.delay_s)
                msg = json.dumps({"message": f"injected fault (HTTP {fault.status})"}).encode()
                self._send(fault.status, msg, "application/json", fault.headers)
                return
            if delay:
                time.sleep(delay)
            getattr(self, f"_{route}")(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            pass
        finally:
            self.fake.leave(route)

    do_GET = do_POST = do_HEAD = _handle

    # ------------------------------------------------------------------ protocols

    def _serper(self, body: bytes) -> None:
        key = self.fake.serper_key
        if key is not None and self.headers.get("X-API-KEY") != key:
            return self._json(403, {"message": "Unauthorized.", "statusCode": 403})
        if self.command != "POST":
            return self._json(405, {"message": "use POST"})
        try:
            req = json.loads(body)
            query, num = str(req["q"]), int(req.get("num", 10))
        except (ValueError, KeyError, TypeError):
            return self._json(400, {"message": "body must be JSON with q"})
        rows = self.fake.search(query, num)
        organic = [
            {"title": r["title"], "link": r["url"], "snippet": r["snippet"], "position": i}
            for i, r in enumerate(rows, 1)
        ]
        self._json(200, {"searchParameters": {"q": query, "num": num, "type": "search"}, "organic": organic})

    def _searxng(self, body: bytes) -> None:
        qs = parse_qs(urlsplit(self.path).query)
        if qs.get("format", ["html"])[0] != "json":
            return self._send(403, b"Forbidden", "text/plain")
        query = qs.get("q", [""])[0]
        rows = self.fake.search(query, 20)
        results = [
            {
                "url": r["url"],
                "title": r["title"],
                "content": r["snippet"],
                "engine": "fake",
                "score": r["score"],
            }
            for r in rows
        ]
        self._json(
            200,
            {
                "query": query,
                "number_of_results": len(results),
                "results": results,
                "answers": [],
                "suggestions": [],
            },
        )

    def _jina(self, body: bytes) -> None:
        key = self.fake.jina_key
        if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
            return self._json(401, {"code": 401, "message": "Invalid API key"})
        target = self.path[len("/jina/") :]
        page = self.fake.page_for(target)
        if page is None:
            return self._json(422, {"code": 422, "message": f"Failed to goto {target}"})
        title, text = page
        if "json" in (self.headers.get("Accept") or ""):
            data = {"title": title, "url": target, "content": text, "usage": {"tokens": len(text.split())}}
            return self._json(200, {"code": 200, "status": 20000, "data": data})
        out = f"Title: {title}\n\nURL Source: {target}\n\nMarkdown Content:\n{text}\n"
        self._send(200, out.encode(), "text/plain; charset=utf-8")

    def _site(self, body: bytes) -> None:
        parts = urlsplit(self.path)
        name = parts.path[len("/site/") :]
        if name == "doc.pdf":
            return self._send(
                200,
                minimal_pdf("The Vell report says Kettering had 12 mills.", "Vell report"),
                "application/pdf",
            )
        if name == "image.png":
            return self._send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png")
        if name == "notype":
            return self._send(200, b"Plain words from a server that names no type.", None)
        if name == "big":
            size = int(parse_qs(parts.query).get("bytes", ["1000000"])[0])
            return self._send(200, b"<html><body><p>" + b"x" * size + b"</p></body></html>", "text/html")
        if name == "broken.pdf":
            return self._send(200, minimal_pdf("x")[:60], "application/pdf")
        if name == "gzip-bomb":  # a few kB on the wire, megabytes once decompressed
            packed = gzip.compress(b"<html><body><p>" + b"0" * 3_000_000 + b"</p></body></html>")
            return self._send(200, packed, "text/html", {"Content-Encoding": "gzip"})
        if name == "latin1":
            html = "<html><body><p>Caf\u00e9 in Oslen, na\u00efve prices.</p></body></html>".encode("latin-1")
            return self._send(200, html, "text/html; charset=ISO-8859-1")
        page = self.fake.pages.get(name)
        if page is None:
            return self._send(404, b"<html><body>Not found</body></html>", "text/html")
        self._send(200, page_html(*page).encode(), "text/html; charset=utf-8")

    def _redirect(self, body: bytes) -> None:
        target = parse_qs(urlsplit(self.path).query).get("to", ["/redirect"])[0]  # no target: a loop
        self._send(302, b"", "text/plain", {"Location": target})

    def _secret(self, body: bytes) -> None:
        self._send(200, b"SECRET internal data", "text/plain")

    def _other(self, body: bytes) -> None:
        self._send(404, b"no such route", "text/plain")
