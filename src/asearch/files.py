"""File primitives every output path uses: atomic writes, durable jsonl appends, numbered jsonl reads."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from asearch.errors import DataFormatError


def cache_dir(*parts: str) -> Path:
    """Where asearch keeps derived artefacts (converted models, built indexes): `$ASEARCH_CACHE` or ~/.cache/asearch."""
    env = os.environ.get("ASEARCH_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "asearch"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _new_file_mode(path: Path) -> int:
    """The mode `open(path, "w")` would give: the existing file's, else 0o666 minus the umask."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Stream into a temp file beside `path`; it replaces `path` only if the block succeeds.

    A reader sees the old file or the new one, never half of one; a kill leaves only a dot-temp file.
    """
    assert mode in ("w", "wb"), f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _new_file_mode(path))  # mkstemp makes 0600; outputs should be readable like any file
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: Iterable[Any]) -> int:
    """Stream `records` into `path` atomically (one JSON object per line); return how many were written."""
    n = 0
    with atomic_open(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n


def append_jsonl(path: str | Path, record: Any) -> None:
    """Append one record as a single write + fsync: a kill leaves whole lines (a torn tail is skipped on read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "ab") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def iter_jsonl(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream (line_number, object) for each non-blank line in constant memory.

    A bad line raises DataFormatError naming file and line. With `tolerate_torn_tail`, an
    unparseable final line without its newline (a write cut by a kill) is skipped instead.
    """
    path = Path(path)
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                if tolerate_torn_tail and not raw.endswith(b"\n"):  # only the last line can lack it
                    return
                raise DataFormatError(path, i, None, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, i, None, f"expected a JSON object, got {type(obj).__name__}")
            yield i, obj
