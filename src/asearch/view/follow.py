"""Follow a growing jsonl file: each poll parses only the whole lines appended since the last one.

`asearch.files.iter_jsonl` reads a file from its start; a viewer polling a metrics.jsonl that a
training run appends to every few seconds must not re-read it each time, so this keeps a byte offset.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asearch.errors import DataFormatError

__all__ = ["JsonlFollower", "Line", "read_line_at"]

# Bad lines are counted without limit; only the first few messages are kept to show.
_KEEP_PROBLEMS = 5


@dataclass(frozen=True, slots=True)
class Line:
    """One parsed line and where it sits in the file (to read it again later without a scan)."""

    number: int  # 1-based line number
    offset: int  # byte offset of the line's start
    length: int  # bytes, newline included
    obj: dict[str, Any]


class JsonlFollower:
    """Reads the complete lines appended to `path` since the previous `poll()`.

    - A last line without its newline is a write in progress (or cut by a kill): it is left for the
      next poll, never parsed half-written.
    - A file that shrank or was replaced (another inode: an atomic rewrite) is read again from its
      start, and `generation` goes up so callers drop what they derived from the old content.
    - A whole line that is not a JSON object is skipped and counted in `bad_lines`; `problems` keeps
      the first few messages (file:line: problem), so nothing is dropped silently.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0  # bytes consumed; always the start of a line
        self.lines = 0  # lines consumed (blank ones included, for line numbers)
        self.generation = 0
        self.bad_lines = 0
        self.problems: list[str] = []
        self._inode: int | None = None
        self._mtime: float | None = None

    @property
    def mtime(self) -> float | None:
        """Modification time seen at the last poll (None: the file did not exist)."""
        return self._mtime

    def _restart(self) -> None:
        self.offset = self.lines = self.bad_lines = 0
        self.problems = []
        self.generation += 1

    def poll(self) -> list[Line]:
        """Parse and return the lines completed since the last call (empty when nothing changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._inode is not None:  # the file went away: what we had is stale
                self._inode = self._mtime = None
                self._restart()
            return []
        if self._inode is not None and (st.st_ino != self._inode or st.st_size < self.offset):
            self._restart()
        self._inode, self._mtime = st.st_ino, st.st_mtime
        if st.st_size == self.offset:
            return []
        out: list[Line] = []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while True:
                start = f.tell()
                raw = f.readline()
                if not raw.endswith(b"\n"):  # EOF, or a line still being written
                    break
                self.lines += 1
                self.offset = start + len(raw)
                if not raw.strip():
                    continue
                obj = self._parse(raw)
                if obj is not None:
                    out.append(Line(self.lines, start, len(raw), obj))
        return out

    def _parse(self, raw: bytes) -> dict[str, Any] | None:
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self._bad(f"not valid JSON ({e})")
            return None
        if not isinstance(obj, dict):
            self._bad(f"expected a JSON object, got {type(obj).__name__}")
            return None
        return obj

    def _bad(self, problem: str) -> None:
        self.bad_lines += 1
        if len(self.problems) < _KEEP_PROBLEMS:
            self.problems.append(str(DataFormatError(self.path, self.lines, None, problem)))


def read_line_at(path: Path, offset: int, length: int) -> dict[str, Any]:
    """The object on the line at `offset` (as recorded by a `Line`), read without scanning the file."""
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataFormatError(
            path, None, None, f"line at byte {offset} changed since it was indexed ({e})"
        ) from None
    if not isinstance(obj, dict):
        raise DataFormatError(path, None, None, f"line at byte {offset} is not a JSON object")
    return obj
