"""Built-in sets: specs, determinism, and that every question has exactly one answer in its corpus."""

from __future__ import annotations

import pytest

from asearch.corpus.world.names import NAME_PARTITIONS
from asearch.errors import AsearchError
from asearch.eval.builtin import (
    HELD_OUT_WORLD_SEED,
    MIN_DESCRIPTION_WORDS,
    Wiki10kSetSpec,
    WorldSetSpec,
    parse_builtin_spec,
    wiki10k_candidates,
    wiki10k_questions,
    world_questions,
)
from asearch.eval.datasets import load_dataset
from asearch.metrics.normalize import normalize_answer


def test_spec_parsing():
    assert parse_builtin_spec("world") == WorldSetSpec()
    assert parse_builtin_spec("world:hops=2") == WorldSetSpec(hops=(2,))
    assert parse_builtin_spec("world:seed=1000,n=200") == WorldSetSpec(seed=1000, n=200)
    assert parse_builtin_spec("world:hops=1-3,entities=500,qseed=4") == WorldSetSpec(
        hops=(1, 2, 3), entities=500, qseed=4
    )
    assert parse_builtin_spec("world:hops=3+1") == WorldSetSpec(hops=(1, 3))
    assert parse_builtin_spec("world:seed=3,names=9") == WorldSetSpec(seed=3, names=9)
    assert parse_builtin_spec("world:forward=1,answers=entity") == WorldSetSpec(forward=True, answers="entity")
    assert parse_builtin_spec("world:phrasing=keys") == WorldSetSpec(phrasing="keys")
    assert parse_builtin_spec("wiki10k") == Wiki10kSetSpec()
    assert parse_builtin_spec("wiki10k:n=50,seed=2") == Wiki10kSetSpec(n=50, seed=2)
    for bad, msg in [
        ("world:size=3", "bad option 'size=3'.*seed, n, hops"),
        ("world:n=x", "not an integer"),
        ("world:hops=two", "hops='two'"),
        ("world:hops=0", ">= 1"),
        ("wiki10k:n=0", "n must be >= 1"),
        ("world:answers=year", "answers='year' must be 'any' or 'entity'"),
        ("world:forward=yes", "forward='yes' must be 0 or 1"),
        ("world:phrasing=plain", "phrasing='plain' must be 'natural' or 'keys'"),
        ("wiki10k:hops=2", "bad option"),
    ]:
        with pytest.raises(AsearchError, match=msg):
            parse_builtin_spec(bad)


def test_world_set_with_a_shared_name_pool_points_at_that_corpus():
    from asearch.corpus.sources import open_corpus

    records = world_questions(WorldSetSpec(seed=3, n=6, entities=600, names=9), dataset="w")
    corpus = records[0].metadata["corpus"]
    assert corpus == "world:seed=3,entities=600,names=9"
    world = open_corpus(corpus)
    for r in records:  # every evidence page is in the corpus the record names
        for ev in r.metadata["evidence"]:
            assert world.page(ev["url"]).title == ev["entity"]


def test_held_out_seed_shares_no_names_with_low_training_seeds():
    assert HELD_OUT_WORLD_SEED % NAME_PARTITIONS not in range(0, 232)


def test_world_set_is_deterministic_and_answers_are_unique():
    from asearch.corpus.world import WorldCorpus
    from asearch.corpus.world.questions import follow_path

    spec = WorldSetSpec(seed=1000, n=30, entities=600)
    a = world_questions(spec, dataset="w")
    assert a == world_questions(spec, dataset="w")  # a pure function of the spec
    assert a != world_questions(WorldSetSpec(seed=1000, n=30, entities=600, qseed=1), dataset="w")
    assert len({r.id for r in a}) == 30 and {r.dataset for r in a} == {"w"}
    assert sorted({r.metadata["hops"] for r in a}) == [1, 2, 3]
    graph = WorldCorpus(1000, 600).graph
    for r in a:
        assert r.metadata["corpus"] == "world:seed=1000,entities=600"
        assert len(r.metadata["evidence"]) == r.metadata["hops"]
        start = graph.by_name(r.metadata["subject"]).id
        values = follow_path(graph, start, r.metadata["path"])
        assert len(values) == 1, r  # exactly one answer in the world
        value = values[0]
        answer = graph.get(value).name if isinstance(value, str) and value in graph else str(value)
        assert answer == r.golds[0]


def test_world_spec_through_load_dataset():
    recs = load_dataset("world:hops=2,n=4,entities=400")
    assert len(recs) == 4 and all(r.metadata["hops"] == 2 for r in recs)
    assert {r.dataset for r in recs} == {"world:hops=2,n=4,entities=400"}
    with pytest.raises(AsearchError, match="distinct"):
        load_dataset("world:hops=1,n=500,entities=100")


class _FakeWiki:
    """wiki10k-shaped entries: enough to check each filter rule by hand."""

    def __init__(self, rows):
        from asearch.corpus.wiki10k import WikiEntry

        self._entries = [WikiEntry(title=t, extract="x", description=d, topic=topic) for t, d, topic in rows]

    def entries(self):
        return self._entries


FAKE = [
    ("Chuck Berry", "American musician (1926–2017)", "People"),
    ("Tennis", "Racket sport", "Everyday life"),  # too short
    ("Kestrel", "Family of birds", "Biology"),
    ("Swift", "Family of birds", "Biology"),  # shared with Kestrel: neither is kept
    ("Chinese mythology", "Mythology of the greater Chinese area", "Religion"),  # names the title
    ("Mustard (condiment)", "Condiment made from mustard seeds", "Everyday life"),  # names the title
    ("Casablanca (film)", "1942 American romantic drama film", "Arts"),
    ("Nameless", "", "Arts"),
]


def test_wiki10k_filter_rules():
    kept, rejected = wiki10k_candidates(_FakeWiki(FAKE).entries())
    assert [e.title for e in kept] == ["Chuck Berry", "Casablanca (film)"]
    assert rejected == {
        "description too short": 1,
        "description shared with another article": 2,
        "description contains the title": 2,
        "no description": 1,
    }
    recs = wiki10k_questions(Wiki10kSetSpec(n=2), corpus=_FakeWiki(FAKE))
    by_id = {r.id: r for r in recs}
    assert (
        by_id["wiki10k-Chuck_Berry"].question
        == 'Who is described on Wikipedia as "American musician (1926–2017)"?'
    )
    assert by_id["wiki10k-Casablanca_(film)"].golds == ["Casablanca (film)", "Casablanca"]
    assert by_id["wiki10k-Casablanca_(film)"].question.startswith("What is described")
    with pytest.raises(AsearchError, match="2 eligible"):
        wiki10k_questions(Wiki10kSetSpec(n=3), corpus=_FakeWiki(FAKE))


def test_wiki10k_set_is_deterministic_with_unique_answers():
    from asearch.corpus import Wiki10kCorpus

    entries = Wiki10kCorpus().entries()
    recs = load_dataset("wiki10k:n=200")
    assert recs == load_dataset("wiki10k:n=200") and len(recs) == 200
    assert recs != load_dataset("wiki10k:n=200,seed=1")
    assert len({r.id for r in recs}) == 200
    by_description: dict[str, list[str]] = {}
    for e in entries:
        by_description.setdefault(normalize_answer(e.description), []).append(e.title)
    for r in recs:
        description = r.metadata["description"]
        assert by_description[normalize_answer(description)] == [r.golds[0]]  # exactly one article fits
        assert len(description.split()) >= MIN_DESCRIPTION_WORDS
        assert normalize_answer(r.golds[0]) not in normalize_answer(r.question)
