"""Near-duplicate removal: LSH-proposed, Jaccard-decided, agreeing with an exhaustive greedy pass."""

from __future__ import annotations

import random

import pytest

from asearch.synth.dedup import NearDuplicateIndex, auto_bands, jaccard, near_duplicates, shingles


def test_shingles_are_normalised_word_bigrams():
    assert shingles("Who founded the Velmo Steel?") == frozenset(
        {"who founded", "founded velmo", "velmo steel"}
    )
    assert shingles("Velmo") == frozenset({"velmo"})
    assert jaccard(shingles("x y z w"), shingles("x y z v")) == pytest.approx(2 / 4)


def exhaustive(texts: list[str], groups: list[str], threshold: float) -> list[tuple[int, int]]:
    """Greedy in order, comparing with every kept item: the reference the LSH version must match."""
    kept: list[int] = []
    removed: list[tuple[int, int]] = []
    sets = [shingles(t) for t in texts]
    for i, s in enumerate(sets):
        scores = [(jaccard(s, sets[j]), j) for j in kept if groups[j] == groups[i]]
        best = max(scores, default=(0.0, -1))
        if best[0] >= threshold:
            removed.append((i, best[1]))
        else:
            kept.append(i)
    return removed


def corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Template questions with planted near-copies (one or two words changed) and shared answers."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(60)]
    texts, groups = [], []
    for _ in range(n):
        if texts and rng.random() < 0.3:
            i = rng.randrange(len(texts))
            t = texts[i].split()
            for _ in range(rng.choice((1, 2))):
                t[rng.randrange(len(t))] = rng.choice(words)
            texts.append(" ".join(t))
            groups.append(groups[i] if rng.random() < 0.8 else "other")
        else:
            texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(8, 16))))
            groups.append(rng.choice("abc"))
    return texts, groups


@pytest.mark.parametrize("threshold", [0.5, 0.7])
def test_lsh_agrees_with_the_exhaustive_pass(threshold):
    texts, groups = corpus(400)
    found = near_duplicates(texts, threshold=threshold, groups=groups)
    reference = {i for i, _ in exhaustive(texts, groups, threshold)}
    assert len(reference) > 15
    removed = {d.index for d in found}
    for d in found:  # every removal is real: similar enough, same group, to an item that was kept
        assert d.of not in removed and groups[d.of] == groups[d.index]
        assert jaccard(shingles(texts[d.index]), shingles(texts[d.of])) == d.similarity >= threshold
    # LSH may miss a pair with small probability (and a miss changes what later items are compared with)
    assert len(removed & reference) >= 0.97 * len(reference) and len(removed) <= 1.02 * len(reference)


def test_bands_are_chosen_for_the_threshold():
    assert auto_bands(0.7, 128) == 32  # 4 rows: a pair at 0.7 is proposed with p = 1 - (1 - 0.7^4)^32 > 0.999
    assert auto_bands(0.5, 128) == 64
    assert auto_bands(0.95, 128) < auto_bands(0.7, 128)


def test_groups_keep_same_text_different_answers_apart():
    texts = ["Which city hosted the Velmo Open?"] * 3
    assert [d.index for d in near_duplicates(texts, threshold=0.7, groups=["a", "b", "a"])] == [2]
    index = NearDuplicateIndex(0.7, num_perm=32, bands=8)
    assert index.add(0, texts[0], "x") is None
    dup = index.add(1, texts[0], "x")
    assert dup is not None and dup.of == 0 and dup.similarity == 1.0
    with pytest.raises(ValueError, match="multiple"):
        NearDuplicateIndex(0.7, num_perm=30, bands=8)
