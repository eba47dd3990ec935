"""A persistent web cache: search results and pages in one SQLite file, keyed by normalised query or url.

Safe across processes (WAL journal, busy timeout, one upsert per write), entries expire after a TTL,
and every lookup is counted so a run can report its hit rate. `cache_only` mode never goes to the
network: training and evaluation replay exactly what was recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field

from asearch.config import Config
from asearch.errors import ConfigError, ToolError

log = logging.getLogger(__name__)

CacheMode = Literal["off", "read_write", "cache_only"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    stored_at REAL NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID
"""


class CacheConfig(Config):
    """Where and how long web results are kept."""

    mode: CacheMode = Field(
        "read_write",
        description="off: no cache; read_write: use and fill it; cache_only: never call the network (a miss "
        "is an error observation, expiry is ignored) for reproducible training and evaluation.",
    )
    path: str | None = Field(
        None, description="SQLite file; default $ASEARCH_CACHE/web/web_cache.sqlite (~/.cache/asearch/...)."
    )
    ttl_s: float | None = Field(
        7 * 24 * 3600.0, gt=0, description="Entries older than this are fetched again (None = keep forever)."
    )


class CacheMiss(ToolError):
    """cache_only mode and the answer is not in the cache."""


def normalize_query(query: str) -> str:
    """The cache key of a query: Unicode NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def normalize_url_key(url: str) -> str:
    """The cache key of a url: lower-case scheme and host, no default port, no #fragment, `/` for an empty
    path. Path and query keep their case (servers treat them as case-sensitive)."""
    try:
        u = httpx.URL(url.strip())
    except (httpx.InvalidURL, ValueError):
        return url.strip()
    if not u.host:
        return url.strip()
    default = {"http": 80, "https": 443}.get(u.scheme)
    port = "" if u.port in (None, default) else f":{u.port}"
    host = f"[{u.host}]" if ":" in u.host else u.host
    path = u.raw_path.decode("ascii") or "/"
    return f"{u.scheme}://{host}{port}{path}"


class WebCache:
    """`await get(namespace, key)` -> the stored JSON value or None; `await put(namespace, key, value)`.

    SQLite runs in one worker thread per cache so the event loop never waits on the disk or on another
    process's write lock. Values are JSON (dicts and lists); lookups, hits and writes are counted.
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        mode: CacheMode = "read_write",
        ttl_s: float | None = 7 * 24 * 3600.0,
        clock: Any = time.time,
    ):
        self.mode: CacheMode = mode
        self.ttl_s, self.clock = ttl_s, clock
        self.path: Path | None = None
        if mode != "off":
            if path is None:
                from asearch.files import cache_dir

                path = cache_dir("web") / "web_cache.sqlite"
            self.path = Path(path)
            if mode == "cache_only" and not self.path.exists():
                raise ConfigError(
                    f"web cache {self.path} does not exist; cache_only mode needs a filled cache"
                )
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asearch-web-cache")
        self._local = threading.local()
        self._lock = threading.Lock()
        self.hits = self.misses = self.expired = self.writes = self.errors = 0
        if self.path is not None:
            try:
                self._executor.submit(self._connect).result()
            except sqlite3.DatabaseError as e:
                raise ConfigError(f"web cache {self.path} cannot be opened: {e}") from None

    @classmethod
    def from_config(cls, cfg: CacheConfig) -> WebCache:
        return cls(cfg.path, mode=cfg.mode, ttl_s=cfg.ttl_s)

    @classmethod
    def disabled(cls) -> WebCache:
        return cls(None, mode="off")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    # ------------------------------------------------------------------ sqlite, in the worker thread

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            assert self.path is not None
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            # WAL lets readers in other processes go on while one process writes; busy_timeout (the
            # `timeout` above) makes a writer wait for the lock instead of failing.
            if self.mode != "cache_only":
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(_SCHEMA)
            self._local.conn = conn
        return conn

    def _get_sync(self, namespace: str, key: str) -> tuple[str, float] | None:
        row = (
            self._connect()
            .execute("SELECT value, stored_at FROM entries WHERE namespace = ? AND key = ?", (namespace, key))
            .fetchone()
        )
        return None if row is None else (row[0], float(row[1]))

    def _put_sync(self, namespace: str, key: str, value: str, stored_at: float) -> None:
        self._connect().execute(
            "INSERT INTO entries (namespace, key, value, stored_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, stored_at = excluded.stored_at",
            (namespace, key, value, stored_at),
        )

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    # ------------------------------------------------------------------ public API

    async def get(self, namespace: str, key: str) -> Any | None:
        """The value stored under (namespace, key), or None on a miss or an expired entry.
        In cache_only mode entries never expire (a replay must see what was recorded)."""
        if not self.enabled:
            return None
        try:
            row = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._get_sync, namespace, key
            )
        except sqlite3.Error as e:
            self._count("errors")
            if self.mode == "cache_only":
                raise CacheMiss(f"web cache {self.path} could not be read: {e}") from e
            log.warning("web cache %s: read failed (%s); treating it as a miss", self.path, e)
            row = None
        if row is None:
            self._count("misses")
            return None
        text, stored_at = row
        if self.mode != "cache_only" and self.ttl_s is not None and self.clock() - stored_at > self.ttl_s:
            self._count("expired")
            self._count("misses")
            return None
        self._count("hits")
        return json.loads(text)

    async def put(self, namespace: str, key: str, value: Any) -> None:
        """Store a JSON value (a no-op when the cache is off or replaying); a failed write is counted,
        logged and otherwise ignored: the caller already has its answer."""
        if self.mode != "read_write":
            return
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._put_sync, namespace, key, text, self.clock()
            )
        except sqlite3.Error as e:
            self._count("errors")
            log.warning("web cache %s: write failed (%s)", self.path, e)
            return
        self._count("writes")

    def __len__(self) -> int:
        if not self.enabled:
            return 0
        return self._executor.submit(
            lambda: self._connect().execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        ).result()

    def stats(self) -> dict[str, float]:
        lookups = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "expired": self.expired,
            "writes": self.writes,
            "errors": self.errors,
            "hit_rate": round(self.hits / lookups, 6) if lookups else 0.0,
        }

    def close(self) -> None:
        def _close() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

        try:
            self._executor.submit(_close).result()
        except RuntimeError:  # already shut down
            pass
        self._executor.shutdown(wait=True)

    def __repr__(self) -> str:
        return f"WebCache({str(self.path) if self.path else None!r}, mode={self.mode!r}, ttl_s={self.ttl_s})"
