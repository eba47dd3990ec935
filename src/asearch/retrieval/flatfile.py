"""Faiss flat index files as the peers ship them (Search-R1's and ASearcher's `e5_Flat.index`), read by block:
the header says where the float32 rows start, so no file of 64 GB is ever loaded whole.

Also the exact re-scoring of a compressed index's candidates from such a file (`rerank`): the compressed index
stays in memory, the flat file on disk, and a query reads only its candidates' rows.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asearch.errors import IndexError_

# faiss write_index of an IndexFlat: fourcc, d (i32), ntotal (i64), two unused i64, is_trained (u8), metric (i32)
_HEADER = struct.Struct("<4siqqq?i")
_FLAT_FOURCC = {b"IxFI": "inner_product", b"IxF2": "l2", b"IxFl": "other"}
_METRIC_INNER_PRODUCT = 0


@dataclass(frozen=True)
class FlatVectors:
    """The float32 rows of a faiss flat index file, read by block (never loaded whole)."""

    path: Path
    dim: int
    ntotal: int
    offset: int  # byte offset of row 0

    @property
    def nbytes(self) -> int:
        return self.ntotal * self.dim * 4

    def rows(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.ntotal)
        with open(self.path, "rb") as f:
            f.seek(self.offset + start * self.dim * 4)
            out = np.fromfile(f, dtype="<f4", count=max(0, stop - start) * self.dim)
        return out.reshape(-1, self.dim)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given rows (one positioned read each: a sample of 100k rows reads 100k x 4*dim bytes)."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        size = self.dim * 4
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
                out[i] = np.frombuffer(os.pread(fd, size, self.offset + row * size), dtype="<f4")
        finally:
            os.close(fd)
        return out

    def blocks(self, batch: int) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.ntotal, batch):
            yield start, self.rows(start, start + batch)


def read_flat_header(path: str | Path) -> FlatVectors:
    """Where the vectors of a faiss IndexFlatIP file are; IndexError_ for any other kind of file."""
    p = Path(path)
    if not p.is_file():
        raise IndexError_(f"{p}: no such flat index file")
    with open(p, "rb") as f:
        head = f.read(_HEADER.size + 12)
    if len(head) < _HEADER.size + 8:
        raise IndexError_(f"{p}: {len(head)} bytes, too short for a faiss index header")
    fourcc, dim, ntotal, _, _, _, metric = _HEADER.unpack_from(head)
    if fourcc not in _FLAT_FOURCC:
        raise IndexError_(
            f"{p}: a faiss index of type {fourcc!r}, not a flat one (IxFI); import takes the flat index the "
            "peers ship (e5_Flat.index), since only its vectors can be recompressed"
        )
    if metric != _METRIC_INNER_PRODUCT:
        raise IndexError_(f"{p}: flat index with faiss metric {metric}; import takes inner-product (IxFI) ones")
    pos = _HEADER.size
    (count,) = struct.unpack_from("<Q", head, pos)  # number of floats that follow
    offset = pos + 8
    size = p.stat().st_size
    if count != dim * ntotal or size < offset + count * 4:
        raise IndexError_(
            f"{p}: header says {ntotal} vectors of {dim} dims ({count} floats) but the file has "
            f"{size - offset} bytes of data: truncated or damaged"
        )
    return FlatVectors(p, int(dim), int(ntotal), offset)


def write_flat_file(path: str | Path, dim: int, ntotal: int, blocks: Iterable[np.ndarray]) -> Path:
    """Write `ntotal` vectors in faiss's IndexFlatIP file format block by block (what faiss.write_index writes)."""
    p = Path(path)
    written = 0
    with open(p, "wb") as f:
        f.write(_HEADER.pack(b"IxFI", dim, ntotal, 1 << 20, 1 << 20, True, _METRIC_INNER_PRODUCT))
        f.write(struct.pack("<Q", ntotal * dim))
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype="<f4").tobytes())
            written += len(block)
    if written != ntotal:
        p.unlink()
        raise ValueError(f"write_flat_file: {written} vectors written, header says {ntotal}")
    return p


def exact_topk(flat: FlatVectors, queries: np.ndarray, k: int, batch: int = 65_536) -> np.ndarray:
    """Rows of the exact top-k inner products of each query, by one streaming pass over the flat file."""
    nq = len(queries)
    best_s = np.full((nq, k), -np.inf, dtype=np.float32)
    best_r = np.full((nq, k), -1, dtype=np.int64)
    for start, block in flat.blocks(batch):
        scores = queries @ block.T
        rows = np.broadcast_to(np.arange(start, start + len(block)), scores.shape)
        all_s = np.concatenate([best_s, scores], axis=1)
        all_r = np.concatenate([best_r, rows], axis=1)
        top = np.argpartition(-all_s, min(k, all_s.shape[1] - 1), axis=1)[:, :k]
        best_s = np.take_along_axis(all_s, top, axis=1)
        best_r = np.take_along_axis(all_r, top, axis=1)
    order = np.lexsort((best_r, -best_s), axis=1)  # score descending, ties by row
    return np.take_along_axis(best_r, order, axis=1)



def rerank(flat: FlatVectors, queries: np.ndarray, candidates: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """The best k of each query's candidate rows (-1 = none) by exact inner product with the flat file's rows."""
    out = []
    for q, rows in zip(queries, candidates, strict=True):
        rows = np.unique(rows[rows >= 0])  # sorted: reads go forward through the file
        scores = flat.take(rows) @ q if len(rows) else np.zeros(0, np.float32)
        order = np.lexsort((rows, -scores))[:k]  # score descending, ties by row
        out.append([(int(rows[i]), float(scores[i])) for i in order])
    return out
