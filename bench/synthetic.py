"""Synthetic passages for the retrieval benchmarks (bench/retrieval.py, bench/server.py): Zipf-distributed words.

Run from bench/ as a sibling module (the benchmarks are scripts, not a package).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# The synthetic vocabulary's most frequent ranks are real English function words, so stopword removal
# matters as it does on real text; the rest are pronounceable made-up words that the stemmer may conflate.
FUNCTION_WORDS = (
    "the of and to in a is that for it as was with be by on not he i this are or his from at which but have an "
    "they you were her she there one all we their been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like "
    "our over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while last"
).split()


def _make_vocab(size: int, rng: np.random.Generator) -> list[str]:
    onsets = "b c d f g h j k l m n p r s t v w z br cl dr fl gr pl st tr sh ch".split()
    vowels = "a e i o u ai ea io ou".split()
    codas = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd"]
    words = list(dict.fromkeys(FUNCTION_WORDS))
    seen = set(words)
    while len(words) < size:
        n_syll = int(rng.integers(1, 4))
        w = "".join(
            onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))] for _ in range(n_syll)
        )
        w += codas[rng.integers(len(codas))]
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def synth_passages(n: int, seed: int, vocab_size: int = 100_000, zipf_s: float = 1.0) -> Iterator[str]:
    """`n` passages of 60-100 words drawn from a Zipf(s) vocabulary; same seed -> same text."""
    rng = np.random.default_rng(seed)
    vocab = np.array(_make_vocab(vocab_size, rng), dtype=object)
    weights = 1.0 / np.arange(1, vocab_size + 1) ** zipf_s
    cdf = np.cumsum(weights / weights.sum())
    block = 10_000
    for start in range(0, n, block):
        m = min(block, n - start)
        lengths = rng.integers(60, 101, size=m)
        ids = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), vocab_size - 1)
        words = vocab[ids]
        ends = np.cumsum(lengths)
        for e, length in zip(ends, lengths, strict=True):
            yield " ".join(words[e - length : e])
