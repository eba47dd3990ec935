"""Replayable runs (`tools.record`): every answer the search and page backends give a run is kept on disk,
one file per distinct request, and a run with `tools.record.replay` (`--replay RUN_DIR`) is answered from
that record only, so an evaluation of a web-search agent reruns bit-identically and without API calls.

A record (`<run dir>/tool-record/`, or a shared `tools.record.dir`):

    manifest.json                      format, created / updated, the sources recorded, entries per tool, bytes
    search/3f/3f9c…e1.json             one answer: {"tool", "request", "answer", "error", "digest", "recorded_at"}
    access/a0/a07b…42.json

An entry's name is its key: sha256 of the canonical JSON of {"tool": t, "request": r}, with
r = {"query": q, "topk": k} for search (one entry per query of a batched call) and r = {"url": u} for
access (the url as the access tool normalised it). Requests are exact, not case-folded: a backend may
answer two spellings differently. Pages are stored whole, so a replay may cut them into other chunks.
`digest` is sha256 of the canonical {"answer", "error"}; a replay checks it and the key.

Writes: an answer reaches the agent only once its entry is on disk (temp file, fsync, then a hard link
into place), so a killed run leaves whole entries, and every result it wrote can be replayed. The link
fails when another writer (a concurrent episode, an eval shard, a run sharing the dir) was first: the
first answer stays. A later, different answer to a recorded request is counted (`record/changed`): that
backend is not deterministic, and a replay gives the first answer. A damaged entry is rewritten.

What is recorded: answers (hits, pages, "no such page") and a backend's own `ToolError` (a refused url, a
web cache miss: deterministic refusals), replayed as the same error. Infrastructure failures
(`RemoteError`, timeouts) are not recorded: they say nothing about the request.

Replay: no backend is opened. A call whose requests all have entries gets their answers; any other is
refused with `ReplayMiss` (a damaged entry too, counted apart), which `run_tool` turns into an
observation of error kind `replay_miss`, an infrastructure fault, so the episode is masked and a miss
never passes for the model's own answer (docs/replay.md). Counters: `record_metrics(tools)`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from asearch.config import Config
from asearch.corpus.types import Page, Passage
from asearch.errors import ConfigError, RemoteError, ToolError
from asearch.files import atomic_write_json
from asearch.retrieval.base import SearchHit
from asearch.tools.access import as_page_backend
from asearch.tools.base import ReplayMiss, ToolSources, behind_tools
from asearch.tools.search import as_search_backend

__all__ = [
    "RECORD_DIR",
    "RecordDamaged",
    "Recorder",
    "ToolRecord",
    "ToolRecordConfig",
    "record_dir_of",
    "record_metrics",
    "record_sources",
]

log = logging.getLogger(__name__)

RECORD_DIR = "tool-record"  # the record's place in a run directory
MANIFEST = "manifest.json"
FORMAT = "asearch-tool-record/1"
RecordedTool = Literal["search", "access"]
WriteOutcome = Literal["new", "same", "changed"]


class ToolRecordConfig(Config):
    """Recording the answers of the search and page backends, and replaying a run from them (docs/replay.md)."""

    enabled: bool = Field(
        True,
        description="Record every search/access answer the run gets: eval and train under <run dir>/tool-record/, "
        "ask under $ASEARCH_CACHE/tool-record/; disk about the size of the passages and pages read "
        "(docs/replay.md). `tools.record=false` turns it off.",
    )
    dir: Path | None = Field(
        None,
        description="Record into this directory instead of the run's: one several runs share (concurrent "
        "writers are safe; the first answer to a request is kept).",
    )
    replay: Path | None = Field(
        None,
        description="Answer every search/access call from this record only: a run directory (its tool-record/) "
        "or a record directory. A call it has no answer to is refused (error kind replay_miss, an "
        "infrastructure fault: the episode is masked) and counted; no backend is opened and nothing is "
        "recorded. `--replay RUN_DIR` sets it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _switch(cls, data: Any) -> Any:
        """`tools.record=false` turns recording off, `true` on (as `enabled` does)."""
        return {"enabled": data} if isinstance(data, bool) else data


class RecordDamaged(Exception):
    """An entry file that is not what was written: unreadable, not this request's, or its digest differs."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _sha256(obj: Any) -> str:
    return hashlib.sha256(_canonical(obj)).hexdigest()


class ToolRecord:
    """One record directory: entries keyed by request, and the manifest. Stateless apart from the path, so
    every method is safe from many threads and processes at once."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def key(tool: str, request: Mapping[str, Any]) -> str:
        return _sha256({"tool": tool, "request": dict(request)})

    def entry_path(self, tool: str, key: str) -> Path:
        return self.root / tool / key[:2] / f"{key}.json"

    def read(self, tool: str, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The entry recorded for `request` (its `answer` and `error`), None if there is none; raises
        RecordDamaged for an entry that is not what was written."""
        key = self.key(tool, request)
        path = self.entry_path(tool, key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return self._check(path, raw, tool, key)

    def _check(self, path: Path, raw: bytes, tool: str, key: str) -> dict[str, Any]:
        try:
            entry = json.loads(raw)
            stored_key = self.key(entry["tool"], entry["request"])
            digest = _sha256({"answer": entry["answer"], "error": entry["error"]})
        except (ValueError, KeyError, TypeError) as e:
            raise RecordDamaged(path, f"not a whole entry ({type(e).__name__}: {e})") from None
        if entry["tool"] != tool or stored_key != key:
            raise RecordDamaged(
                path, f"holds the answer to another request ({entry['tool']} {entry['request']})"
            )
        if digest != entry.get("digest"):
            raise RecordDamaged(
                path, f"answer digest {digest[:12]} is not the recorded {str(entry.get('digest'))[:12]}"
            )
        return entry

    def write(
        self, tool: str, request: Mapping[str, Any], answer: Any, error: str | None
    ) -> tuple[WriteOutcome, str]:
        """Record one answer unless the request has one; returns (outcome, the digest recorded now): "new"
        (written), "same" (already recorded, equal) or "changed" (already recorded, different: the recorded
        one stays). A damaged entry is replaced."""
        key = self.key(tool, request)
        path = self.entry_path(tool, key)
        digest = _sha256({"answer": answer, "error": error})
        entry = {"tool": tool, "request": dict(request), "answer": answer, "error": error, "digest": digest,
                 "recorded_at": round(time.time(), 3)}  # fmt: skip
        damaged = False
        if path.exists():
            try:
                return self._outcome(path, tool, key, digest)
            except RecordDamaged as e:
                log.warning("tool record: replacing a damaged entry: %s", e)
                damaged = True
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # mkstemp makes 0600; a record is read by whoever replays it
            with os.fdopen(fd, "wb") as f:
                f.write(_canonical(entry) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            if damaged:
                os.replace(tmp, path)
                return "new", digest
            try:
                os.link(tmp, path)  # fails if another writer was first: its answer stays
            except FileExistsError:
                return self._outcome(path, tool, key, digest)
            except OSError:  # a filesystem without hard links: replace (the last answer stays)
                os.replace(tmp, path)
            return "new", digest
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _outcome(self, path: Path, tool: str, key: str, digest: str) -> tuple[WriteOutcome, str]:
        recorded = self._check(path, path.read_bytes(), tool, key)["digest"]
        return ("same" if recorded == digest else "changed"), recorded

    def counts(self) -> tuple[dict[str, int], int]:
        """({tool: entries}, bytes of all entries), counted on disk (so right whoever wrote them)."""
        entries: dict[str, int] = {}
        size = 0
        for tool in get_args(RecordedTool):
            if not (self.root / tool).is_dir():
                continue
            files = list((self.root / tool).glob("*/*.json"))
            entries[tool] = len(files)
            size += sum(f.stat().st_size for f in files)
        return entries, size

    def write_manifest(self, source: str | None = None) -> dict[str, Any]:
        """(Re)write manifest.json: the first `created`, every source recorded so far, counts from disk."""
        path = self.root / MANIFEST
        old: dict[str, Any] = {}
        try:
            old = json.loads(path.read_text("utf-8"))
        except (FileNotFoundError, ValueError):
            pass  # new, or cut by a kill: rebuilt from the entries below
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        sources = list(old.get("sources") or [])
        if source and source not in sources:
            sources.append(source)
        self.root.mkdir(parents=True, exist_ok=True)
        entries, size = self.counts()
        manifest = {"format": FORMAT, "created": old.get("created", now), "updated": now, "sources": sources,
                    "entries": entries, "bytes": size}  # fmt: skip
        atomic_write_json(path, manifest)
        return manifest


def record_dir_of(path: str | Path) -> Path:
    """The record a `--replay` path names: RUN_DIR/tool-record, or the record directory itself; a
    ConfigError saying what is missing otherwise."""
    path = Path(path)
    for candidate in (path / RECORD_DIR, path):
        manifest = candidate / MANIFEST
        if manifest.is_file():
            try:
                fmt = json.loads(manifest.read_text("utf-8")).get("format")
            except (ValueError, AttributeError):
                fmt = None
            if fmt == FORMAT:
                return candidate
    raise ConfigError(
        f"tools.record.replay: {path} holds no tool record ({path / RECORD_DIR / MANIFEST} or {path / MANIFEST} "
        f"of format {FORMAT}); was the run recorded with tools.record=false, or before recording existed?"
    )


# --------------------------------------------------------------------------- answers as JSON


def _encode_hits(hits: Sequence[SearchHit]) -> list[dict[str, Any]]:
    return [{"id": h.passage.id, "title": h.passage.title, "text": h.passage.text, "url": h.passage.url,
             "score": float(h.score)} for h in hits]  # fmt: skip


def _decode_hits(rows: Sequence[Mapping[str, Any]]) -> list[SearchHit]:
    return [SearchHit(Passage(r["id"], r["title"], r["text"], r["url"]), r["score"]) for r in rows]


def _encode_page(page: Page | None) -> dict[str, Any] | None:
    return None if page is None else {"url": page.url, "title": page.title, "contents": page.contents}


def _decode_page(row: Mapping[str, Any] | None) -> Page | None:
    return None if row is None else Page(row["url"], row["title"], row["contents"])


CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "search": (_encode_hits, _decode_hits),
    "access": (_encode_page, _decode_page),
}


# --------------------------------------------------------------------------- the backends


class Recorder:
    """Records the answers of one `build_tools`' backends, or replays them (`replaying`), and counts both.
    Disk work runs in worker threads, off the event loop."""

    def __init__(self, record: ToolRecord, *, replaying: bool, source: str | None = None):
        self.record, self.replaying, self.source = record, replaying, source
        self.counts: Counter[str] = Counter()
        # key -> digest of the answer recorded: a repeated request skips the disk
        self._recorded: dict[str, str] = {}

    async def replay(self, tool: RecordedTool, requests: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The recorded answers to `requests`, decoded; raises ReplayMiss (naming the first request without
        one) or the recorded ToolError. Every request is counted as a hit, a miss or damaged."""
        looked_up = await asyncio.to_thread(lambda: [self._look_up(tool, r) for r in requests])
        for outcome, _ in looked_up:
            self.counts[f"{outcome}/{tool}"] += 1  # here, on the event loop: worker threads never count
        refused = next((found for outcome, found in looked_up if outcome != "hits"), None)
        if refused is not None:
            raise ReplayMiss(refused)
        entries: list[dict[str, Any]] = [found for _, found in looked_up]
        errored = next((e for e in entries if e["error"] is not None), None)
        if errored is not None:
            raise ToolError(errored["error"])
        return [CODECS[tool][1](e["answer"]) for e in entries]

    def _look_up(self, tool: RecordedTool, request: Mapping[str, Any]) -> tuple[str, Any]:
        """("hits", the entry), or ("misses" | "damaged", the refusal's message)."""
        try:
            entry = self.record.read(tool, request)
        except RecordDamaged as e:
            log.warning("tool record: refusing a damaged entry: %s", e)
            return (
                "damaged",
                f"the recorded answer to {tool} {dict(request)} is damaged ({e.problem}): {e.path}",
            )
        if entry is None:
            return "misses", (f"no recorded answer to {tool} {dict(request)} in {self.record.root}: a replay "
                              "answers only what the recorded run was answered (docs/replay.md)")  # fmt: skip
        return "hits", entry

    async def record_answers(
        self, tool: RecordedTool, requests: Sequence[Mapping[str, Any]], answers: Sequence[Any]
    ) -> None:
        """Put each answer on disk before it is returned (see the module docstring)."""
        encoded = [CODECS[tool][0](a) for a in answers]
        await self._write(tool, list(zip(requests, encoded, strict=True)), None)

    async def record_error(self, tool: RecordedTool, request: Mapping[str, Any], error: ToolError) -> None:
        await self._write(tool, [(request, None)], str(error))

    async def _write(
        self, tool: RecordedTool, items: list[tuple[Mapping[str, Any], Any]], error: str | None
    ) -> None:
        todo = []
        for request, answer in items:
            key, digest = ToolRecord.key(tool, request), _sha256({"answer": answer, "error": error})
            self.counts[f"answers/{tool}"] += 1
            seen = self._recorded.get(key)
            if seen is None:
                todo.append((request, answer))
            elif seen != digest:
                self.counts[f"changed/{tool}"] += 1
        if not todo:
            return
        written = await asyncio.to_thread(lambda: [self.record.write(tool, r, a, error) for r, a in todo])
        for (request, _), (outcome, recorded_digest) in zip(todo, written, strict=True):
            self._recorded[ToolRecord.key(tool, request)] = recorded_digest
            if outcome != "same":
                self.counts[f"{outcome}/{tool}"] += 1

    def metrics(self) -> dict[str, float]:
        """`replay/{hits,misses,damaged}` (and `/search`, `/access`) when replaying, else
        `record/{answers,new,changed}` (likewise): cumulative over this recorder's life."""
        names = ("hits", "misses", "damaged") if self.replaying else ("answers", "new", "changed")
        prefix = "replay/" if self.replaying else "record/"
        out: dict[str, float] = {}
        for name in names:
            per_tool = {tool: self.counts[f"{name}/{tool}"] for tool in CODECS}
            out[f"{prefix}{name}"] = float(sum(per_tool.values()))
            out.update({f"{prefix}{name}/{tool}": float(n) for tool, n in per_tool.items()})
        return out

    def close(self) -> None:
        """Write the manifest with the counts on disk now (a recording; a replay writes nothing)."""
        if not self.replaying:
            self.record.write_manifest(self.source)


class _RecordedBackend:
    """A backend behind the recorder (`inner` None when replaying); every other attribute is the wrapped
    backend's (so `web_metrics` and `fault_metrics` still find what they look for)."""

    tool: RecordedTool

    def __init__(self, inner: Any, recorder: Recorder):
        self.inner, self.recorder = inner, recorder

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "recorder") or self.inner is None:  # a copy being made, or nothing behind
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def _answers(
        self, requests: list[dict[str, Any]], call: Callable[[], Awaitable[list[Any]]]
    ) -> list[Any]:
        if self.recorder.replaying:
            return await self.recorder.replay(self.tool, requests)
        try:
            answers = await call()
        except RemoteError:
            raise  # the infrastructure's failure, not an answer to the request: nothing to record
        except ToolError as e:
            if len(requests) == 1:  # a deterministic refusal of this request: replayed as the same error
                await self.recorder.record_error(self.tool, requests[0], e)
            raise
        await self.recorder.record_answers(self.tool, requests, answers)
        return answers


class RecordedSearchBackend(_RecordedBackend):
    tool = "search"

    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        requests = [{"query": q, "topk": int(topk)} for q in queries]
        return await self._answers(requests, lambda: self.inner.search(queries, topk))


class RecordedPageBackend(_RecordedBackend):
    tool = "access"

    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        return await self._answers([{"url": u} for u in urls], lambda: self.inner.access(urls))


def record_sources(
    sources: ToolSources | None, record: ToolRecord, *, source: str | None = None
) -> tuple[ToolSources, list[Any]]:
    """Both backends of `sources` behind one Recorder that writes `record`, or, with `sources` None, backends
    answered from `record` alone; and the closers of what this made (the last writes the manifest)."""
    if sources is None:
        recorder = Recorder(record, replaying=True)
        return ToolSources(RecordedSearchBackend(None, recorder), RecordedPageBackend(None, recorder)), []
    recorder = Recorder(record, replaying=False, source=source)
    record.write_manifest(source)  # at once: a killed run's record is still recognisable as one
    search, pages = as_search_backend(sources.search), as_page_backend(sources.pages)
    pairs: tuple[tuple[Any, Any], ...] = ((search, sources.search), (pages, sources.pages))  # made: an adapter
    made = [b.close for b, given in pairs if b is not given]
    wrapped = ToolSources(RecordedSearchBackend(search, recorder), RecordedPageBackend(pages, recorder))
    return wrapped, [*made, recorder.close]


def record_metrics(tools: Mapping[str, Any]) -> dict[str, float]:
    """`Recorder.metrics()` of the recorder behind an agent's tools, or {} when nothing records or replays.
    Eval and training call it on whatever tools the config built, like `fault_metrics`."""
    recorder = behind_tools(tools, "recorder", Recorder)
    return recorder.metrics() if recorder is not None else {}
