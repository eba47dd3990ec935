"""On-disk passage and page stores: jsonl records plus memory-mapped int64 offsets and a sorted-hash key index.

Opening is O(1) (nothing is read until asked), reads are thread-safe (mmap slices, no shared file position),
and writing streams: only 16 bytes per record are held in memory, to sort the key index once at the end.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asearch.corpus.types import Page, Passage
from asearch.errors import IndexError_

# File suffixes of one store called NAME:  NAME.jsonl  NAME.offsets.i64  NAME.keys.u64  NAME.rows.i64
_SUFFIXES = (".jsonl", ".offsets.i64", ".keys.u64", ".rows.i64")


def key_hash(key: str) -> int:
    """64-bit hash of a key (url or passage id); collisions are resolved by comparing the stored key."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def store_files(name: str) -> list[str]:
    """The file names a store called `name` consists of (for manifests and cleanup)."""
    return [name + s for s in _SUFFIXES]


class RecordWriter:
    """Streams json records to NAME.jsonl, their byte offsets to NAME.offsets.i64, and (hash, row) pairs.

    `close()` sorts the (hash, row) pairs into the key index and counts duplicate keys (the first row wins);
    `first_duplicate` is then (key, earlier row, row) of the duplicate that comes first in row order, or None.
    """

    _FLUSH = 65_536  # offsets buffered before a write: bounded memory, few syscalls

    def __init__(self, directory: Path, name: str, key_field: str):
        self.dir, self.name, self.key_field = Path(directory), name, key_field
        self._data = open(self.dir / f"{name}.jsonl", "wb")
        self._offsets = open(self.dir / f"{name}.offsets.i64", "wb")
        self._pairs = open(self.dir / f"{name}.pairs.tmp", "wb")
        self._pos = 0
        self._buf_off: list[int] = [0]
        self._buf_pairs: list[int] = []
        self.count = 0
        self.duplicates = 0
        self.first_duplicate: tuple[str, int, int] | None = None

    def add(self, record: dict[str, Any]) -> int:
        """Append one record; return its row number."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        self._data.write(line)
        self._pos += len(line)
        self._buf_off.append(self._pos)
        self._buf_pairs += (key_hash(record[self.key_field]), self.count)
        self.count += 1
        if len(self._buf_off) >= self._FLUSH:
            self._flush()
        return self.count - 1

    def _flush(self) -> None:
        self._offsets.write(np.asarray(self._buf_off, dtype="<i8").tobytes())
        # hashes are u64 and rows small non-negative ints: both fit a u64 pair array
        self._pairs.write(np.asarray(self._buf_pairs, dtype="<u8").tobytes())
        self._buf_off, self._buf_pairs = [], []

    def close(self) -> dict[str, int]:
        """Finish the files; return {"records": n, "duplicate_keys": d}."""
        self._flush()
        for f in (self._data, self._offsets, self._pairs):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        pairs_path = self.dir / f"{self.name}.pairs.tmp"
        pairs = np.fromfile(pairs_path, dtype="<u8").reshape(-1, 2)
        order = np.argsort(
            pairs[:, 0], kind="stable"
        )  # stable: equal hashes keep row order, so first row wins
        keys, rows = pairs[order, 0].copy(), pairs[order, 1].astype("<i8")
        del pairs, order
        keys.tofile(self.dir / f"{self.name}.keys.u64")
        rows.tofile(self.dir / f"{self.name}.rows.i64")
        pairs_path.unlink()
        self.duplicates = self._count_duplicates(keys, rows)
        return {"records": self.count, "duplicate_keys": self.duplicates}

    def _count_duplicates(self, keys: np.ndarray, rows: np.ndarray) -> int:
        """Records whose key equals an earlier record's key (equal hash alone may be a collision)."""
        same = np.flatnonzero(keys[1:] == keys[:-1])
        if len(same) == 0:
            return 0
        reader = _Records(self.dir, self.name, self.count)
        dup = 0
        for i in same.tolist():
            row_a, row_b = int(rows[i]), int(rows[i + 1])  # row_a < row_b: the sort was stable
            a, b = reader.records([row_a, row_b])
            if a[self.key_field] == b[self.key_field]:
                dup += 1
                if self.first_duplicate is None or row_b < self.first_duplicate[2]:
                    self.first_duplicate = (a[self.key_field], row_a, row_b)
        reader.close()
        return dup


class _Records:
    """Read-only view of one store's files: row -> dict, key -> first row."""

    def __init__(self, directory: Path, name: str, expected: int | None = None):
        directory = Path(directory)
        paths = [directory / f for f in store_files(name)]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise IndexError_(f"{directory}: store {name!r} is incomplete (missing {', '.join(missing)})")
        self.path = paths[0]
        self._maps: list[mmap.mmap] = []
        self.offsets = self._map(paths[1], "<i8")
        n = len(self.offsets) - 1
        size = paths[0].stat().st_size
        if n < 0 or (expected is not None and n != expected) or int(self.offsets[-1]) != size:
            raise IndexError_(
                f"{directory}: store {name!r} is inconsistent: {n} offsets for {size} bytes"
                + (f", manifest says {expected} records" if expected is not None else "")
            )
        self.n = n
        self._keys = self._map(paths[2], "<u8")
        self._rows = self._map(paths[3], "<i8")
        self._data = self._map(paths[0], None)

    def _map(self, path: Path, dtype: str | None) -> Any:
        """A read-only mmap of `path`, as a numpy array of `dtype` (or raw bytes). np.frombuffer over mmap, not
        np.memmap: indexing a memmap builds a memmap scalar per access, slow for single elements (docs/retrieval.md)."""
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:  # mmap of an empty file is an error; nothing to read anyway
                return np.zeros(0, dtype) if dtype else b""
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps.append(mm)
        return np.frombuffer(mm, dtype=dtype) if dtype else mm

    def record(self, row: int) -> dict[str, Any]:
        if not 0 <= row < self.n:
            raise IndexError(f"row {row} out of range 0..{self.n - 1}")
        return json.loads(self._data[self.offsets[row] : self.offsets[row + 1]].decode("utf-8"))

    def records(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """Several records; offsets gathered in one numpy call (what a search result needs)."""
        idx = np.asarray(rows, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"rows {rows} out of range 0..{self.n - 1}")
        data, starts, ends = self._data, self.offsets[idx].tolist(), self.offsets[idx + 1].tolist()
        return [json.loads(data[a:b].decode("utf-8")) for a, b in zip(starts, ends, strict=True)]

    def find(self, key: str, key_field: str) -> tuple[int, dict[str, Any]] | None:
        """(row, record) of the first record whose `key_field` equals `key`, or None."""
        h = key_hash(key)
        i = int(self._keys.searchsorted(np.uint64(h)))
        while i < self.n and int(self._keys[i]) == h:  # a run of equal hashes: duplicated key, or a collision
            row = int(self._rows[i])
            rec = self.record(row)
            if rec[key_field] == key:
                return row, rec
            i += 1
        return None

    def close(self) -> None:
        # drop the numpy views first: an mmap with live buffer exports refuses to close
        self.offsets = self._keys = self._rows = self._data = None  # type: ignore[assignment]
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:  # a caller still holds a view; the map is freed with it
                pass


class PassageStore:
    """Passages by row (the id the BM25 and dense indexes return) or by passage id."""

    def __init__(self, directory: str | Path, expected: int | None = None, name: str = "passages"):
        self._r = _Records(Path(directory), name, expected)

    def __len__(self) -> int:
        return self._r.n

    def __getitem__(self, row: int) -> Passage:
        return _passage(self._r.record(row))

    def many(self, rows: Sequence[int]) -> list[Passage]:
        return [_passage(d) for d in self._r.records(rows)]

    def row_of(self, passage_id: str) -> int | None:
        """The row of a passage id, or None if unknown."""
        found = self._r.find(passage_id, "id")
        return None if found is None else found[0]

    def get(self, passage_id: str) -> Passage | None:
        found = self._r.find(passage_id, "id")
        return None if found is None else _passage(found[1])

    def texts(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """`contents` (quoted title + text) of rows start..stop, streamed: what the dense encoder embeds."""
        for row in range(start, self._r.n if stop is None else min(stop, self._r.n)):
            yield self[row].contents

    def close(self) -> None:
        self._r.close()


def _passage(d: dict[str, Any]) -> Passage:
    return Passage(id=d["id"], title=d["title"], text=d["text"], url=d["url"])


class PageStoreFile:
    """url -> Page from the on-disk page store (implements `asearch.retrieval.base.PageStore`)."""

    def __init__(self, directory: str | Path, expected: int | None = None, name: str = "pages"):
        self._r = _Records(Path(directory), name, expected)

    def get(self, url: str) -> Page | None:
        found = self._r.find(url, "url")
        if found is None:
            return None
        d = found[1]
        return Page(url=d["url"], title=d["title"], contents=d["contents"])

    def __len__(self) -> int:
        return self._r.n

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self._r.find(url, "url") is not None

    def close(self) -> None:
        self._r.close()
