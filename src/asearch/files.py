"""File primitives every path uses: atomic writes, durable jsonl appends, numbered jsonl and UTF-8 text reads."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from asearch.errors import DataFormatError

log = logging.getLogger(__name__)


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
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
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
    """Append one record as a single write + fsync: a kill leaves whole lines and at most one torn tail,
    which is cut away (`repair_jsonl_tail`) before the next record goes in. One writer per file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        if not _ends_whole(f):
            repair_jsonl_tail(path)  # a torn tail: the new line must not be glued to it
        f.write(line)  # O_APPEND: at the end of the file as it is now, after any cut
        f.flush()
        os.fsync(f.fileno())


def repair_jsonl_tail(path: str | Path) -> int:
    """Cut a torn last line off a jsonl file that is about to be appended to; return the bytes cut (0: none).

    A last line without its newline is a write cut by a kill (writers put the newline in the same write),
    even when it parses; a last line that is not valid JSON is a fragment an older append was glued to.
    Appending after either would glue the next record to it. Every line before it is kept; a cut is
    logged as a warning naming the file.
    """
    path = Path(path)
    try:
        f = open(path, "r+b")  # noqa: SIM115 - closed by the with below; a missing file has no tail
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        keep = _torn_tail_start(f, size)
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    log.warning("%s: cut a torn last line (%d bytes) before appending to it", path, size - keep)
    return size - keep


def _ends_whole(f: IO[bytes]) -> bool:
    """Whether the open file is empty or ends with a newline (one byte read: cheap enough per append)."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return True
    f.seek(size - 1)
    return f.read(1) == b"\n"


def _torn_tail_start(f: IO[bytes], size: int) -> int:
    """Where the torn last line of the open file starts, or `size` when its last line is whole."""
    if size == 0:
        return 0
    if not _ends_whole(f):
        return _line_start(f, size)
    start = _line_start(f, size - 1)
    f.seek(start)
    last = f.read(size - start)
    if not last.strip():
        return size
    try:
        json.loads(last)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return start
    return size


def _line_start(f: IO[bytes], end: int, block: int = 1 << 16) -> int:
    """The offset just after the last newline before `end` (0 when there is none), read back in blocks."""
    pos = end
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        newline = f.read(pos - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0


def iter_jsonl(path: str | Path, *, tolerate_torn_tail: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream (line_number, object) for each non-blank line in constant memory.

    Lines are UTF-8 (a byte-order mark before the first is dropped). A bad line, undecodable or not a JSON
    object, raises DataFormatError naming file and line. With `tolerate_torn_tail`, a bad final line
    without its newline (a write cut by a kill, maybe inside a character) is skipped instead.
    """
    path = Path(path)
    with open(path, "rb") as f:
        end = 0  # byte offset of the end of the line read so far: names where an undecodable byte sits
        for i, raw in enumerate(f, start=1):
            start, end = end, end + len(raw)
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
                obj = json.loads(text.removeprefix("\ufeff") if i == 1 else text)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                if tolerate_torn_tail and not raw.endswith(b"\n"):  # only the last line can lack it
                    return
                if isinstance(e, UnicodeDecodeError):
                    raise DataFormatError(path, i, None, not_utf8(raw[e.start], start + e.start)) from None
                raise DataFormatError(path, i, None, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(path, i, None, f"expected a JSON object, got {type(obj).__name__}")
            yield i, obj


def not_utf8(byte: int, offset: int) -> str:
    """The problem text for a byte that is not UTF-8: which byte, and where in the file."""
    return f"not UTF-8 text (byte 0x{byte:02x} at byte {offset} of the file); save it as UTF-8"


def read_utf8_text(path: str | Path) -> str:
    """A whole text file decoded as UTF-8 (a leading byte-order mark dropped); a byte that is not UTF-8
    raises DataFormatError naming the file, the line and the byte's offset."""
    path = Path(path)
    data = path.read_bytes()
    body = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        offset = len(data) - len(body) + e.start
        line = data.count(b"\n", 0, offset) + 1
        raise DataFormatError(path, line, None, not_utf8(data[offset], offset)) from None
