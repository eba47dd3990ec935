"""Near-duplicate removal: MinHash signatures of word-bigram sets, LSH bands for candidates, exact Jaccard to decide.

Items are kept in the order given (the first of a cluster wins); every removal names the kept item it
duplicates, so the filter report can count and show them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from asearch.metrics.normalize import normalize_answer

_MERSENNE = (1 << 61) - 1


def shingles(text: str) -> frozenset[str]:
    """Word bigrams of the SQuAD-normalised text (unigrams for one-word texts)."""
    words = normalize_answer(text).split()
    if len(words) < 2:
        return frozenset(words)
    return frozenset(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _hash64(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class MinHasher:
    """`num_perm` universal hashes (a*x + b mod p); a fixed seed makes signatures reproducible."""

    def __init__(self, num_perm: int, seed: int = 0):
        self.params = [
            (_hash64(f"a{seed}/{i}") % (_MERSENNE - 1) + 1, _hash64(f"b{seed}/{i}") % _MERSENNE)
            for i in range(num_perm)
        ]

    def signature(self, items: frozenset[str]) -> tuple[int, ...]:
        xs = [_hash64(s) for s in items] or [0]
        return tuple(min((a * x + b) % _MERSENNE for x in xs) for a, b in self.params)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Item `index` was removed as a near-duplicate of the kept item `of` (Jaccard `similarity`)."""

    index: int
    of: int
    similarity: float


def auto_bands(threshold: float, num_perm: int, recall: float = 0.995) -> int:
    """The fewest LSH bands (longest, most selective) that still propose a pair at `threshold` with `recall`.

    A pair of Jaccard t shares one band of r rows with probability t^r, so it becomes a candidate with
    probability 1 - (1 - t^r)^(num_perm / r).
    """
    for rows in sorted((r for r in range(1, num_perm + 1) if num_perm % r == 0), reverse=True):
        if 1 - (1 - threshold**rows) ** (num_perm // rows) >= recall:
            return num_perm // rows
    return num_perm


class NearDuplicateIndex:
    """Online form: `add` returns the Duplicate an item would be, or None after indexing it as kept."""

    def __init__(self, threshold: float, *, num_perm: int = 128, bands: int | None = None):
        bands = auto_bands(threshold, num_perm) if bands is None else bands
        if num_perm % bands:
            raise ValueError(f"num_perm={num_perm} must be a multiple of bands={bands}")
        self.threshold, self.bands, self.rows = threshold, bands, num_perm // bands
        self.hasher = MinHasher(num_perm)
        self._sets: dict[int, frozenset[str]] = {}
        self._buckets: dict[tuple[str, int, tuple[int, ...]], list[int]] = {}

    def add(self, index: int, text: str, group: str = "") -> Duplicate | None:
        s = shingles(text)
        sig = self.hasher.signature(s)
        keys = [(group, b, sig[b * self.rows : (b + 1) * self.rows]) for b in range(self.bands)]
        candidates = dict.fromkeys(j for key in keys for j in self._buckets.get(key, ()))
        best = max(((jaccard(s, self._sets[j]), j) for j in candidates), default=(0.0, -1))
        if best[0] >= self.threshold:
            return Duplicate(index, best[1], best[0])
        self._sets[index] = s
        for key in keys:  # only kept items become candidates for later ones
            self._buckets.setdefault(key, []).append(index)
        return None


def near_duplicates(
    texts: Sequence[str],
    *,
    threshold: float,
    groups: Sequence[str] | None = None,
    num_perm: int = 128,
    bands: int | None = None,
) -> list[Duplicate]:
    """Items to drop: each is at least `threshold` Jaccard-similar to an earlier kept item of the same group.

    LSH only proposes candidate pairs (pairs far below the threshold are never compared; bands are
    chosen so a pair at the threshold is proposed with probability >= 0.995); the decision is the exact
    Jaccard of the shingle sets, so a reported duplicate really is one.
    """
    index = NearDuplicateIndex(threshold, num_perm=num_perm, bands=bands)
    group_of = list(groups) if groups is not None else [""] * len(texts)
    return [d for i, t in enumerate(texts) if (d := index.add(i, t, group_of[i])) is not None]
