"""The synthetic world corpus: size, determinism, seed-disjoint names, consistency, pages, links, statements."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import subprocess
import sys

import pytest

from asearch.corpus.sources import open_corpus, parse_world_spec
from asearch.corpus.types import CorpusSource
from asearch.corpus.world import GENERATOR_VERSION, RELATIONS, WorldCorpus, generate_questions
from asearch.corpus.world.names import (
    GIVEN_NAMES_PER_GENDER,
    NAME_PARTITIONS,
    ROOT_SPACE,
    form_words,
    given_names,
    owned_roots,
    permute,
    root_index,
    root_string,
)
from asearch.errors import ConfigError

INDUSTRY_WORDS = {"publishing": "publishing house", "film": "film studio", "music": "record label"}


@pytest.fixture(scope="module")
def world() -> WorldCorpus:
    return WorldCorpus()


def test_default_world_is_large_enough(world: WorldCorpus):
    g = world.graph
    assert len(g) == 2000 and len(world) == 2000
    assert len(g.entities("city")) >= 100  # guessing a city earns ~1%
    assert len(g.entities("person")) >= 1000
    assert all(g.entities(t) for t in ("country", "company", "university", "book", "film", "album", "event"))
    assert sum(1 for _ in world.documents()) == sum(1 for _ in world.pages()) == 2000
    assert isinstance(world, CorpusSource)


DIGEST = (
    "import hashlib, sys\n"
    "from asearch.corpus.world import WorldCorpus, generate_questions\n"
    "w = WorldCorpus(int(sys.argv[1]), int(sys.argv[2]))\n"
    "qs = generate_questions(w, 90, seed=3)\n"
    "print(w.content_digest(), hashlib.sha256(repr([q.to_dict() for q in qs]).encode()).hexdigest())\n"
)


def test_same_seed_gives_identical_pages_and_questions_across_processes(world: WorldCorpus):
    questions = generate_questions(world, 90, seed=3)
    here = (
        world.content_digest(),
        hashlib.sha256(repr([q.to_dict() for q in questions]).encode()).hexdigest(),
    )
    assert WorldCorpus(0, 2000).content_digest() == here[0]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # set/dict hash order must not leak into the output
    out = subprocess.run(
        [sys.executable, "-c", DIGEST, "0", "2000"], capture_output=True, text=True, env=env, check=True
    )
    assert tuple(out.stdout.split()) == here


def test_different_seeds_share_no_entity_names():
    worlds = {s: WorldCorpus(s) for s in range(5)}
    names = {s: {e.name for e in w.graph.entities()} for s, w in worlds.items()}
    for a, b in itertools.combinations(range(5), 2):
        assert not names[a] & names[b], f"seeds {a} and {b} share {sorted(names[a] & names[b])[:5]}"
    assert len({w.content_digest() for w in worlds.values()}) == 5
    # the guarantee comes from root ownership: seeds own disjoint roots modulo NAME_PARTITIONS
    roots = [set(owned_roots(s)) for s in range(5)]
    assert all(not (x & y) for x, y in itertools.combinations(roots, 2))
    assert set(owned_roots(NAME_PARTITIONS)) == roots[0]  # the documented limit: seeds equal modulo 256


def test_worlds_can_share_a_name_pool_and_keep_their_own_facts():
    """`names=N`: names from world N's roots; which entity gets which name, and every fact, stay seed-specific."""
    a, b = WorldCorpus(1, 2000, names=9), WorldCorpus(2, 2000, names=9)
    pool, given = set(owned_roots(9)), {*given_names("female"), *given_names("male")}
    for w in (a, b):
        words = {r for e in w.graph.entities() for r in e.name.split()} - given
        roots = {r for r in words if root_index(r) is not None}
        assert roots and roots <= pool, sorted(roots - pool)[:5]
    used = [{r for e in w.graph.entities() for r in e.name.split()} - given for w in (a, b)]
    assert len(used[0] & used[1]) >= 0.3 * len(used[0])  # the same name words recur (other seeds: none)
    places = [{e.name: e for e in w.graph.entities() if e.type == "city"} for w in (a, b)]
    shared = sorted(places[0].keys() & places[1].keys())
    assert len(shared) >= 10, shared
    countries = [(a.graph.one(places[0][n].id, "country"), b.graph.one(places[1][n].id, "country")) for n in shared]
    differ = sum(a.graph.get(x).name != b.graph.get(y).name for x, y in countries)
    assert differ >= 0.6 * len(shared), (differ, len(shared))  # same name, other facts
    assert a.content_digest() != WorldCorpus(1, 2000).content_digest()
    assert a.name == "world:seed=1,entities=2000,names=9" and parse_world_spec(a.name)["names"] == 9
    assert a.fingerprint() != WorldCorpus(1, 2000).fingerprint()
    assert WorldCorpus(1, 600).fingerprint() == WorldCorpus(1, 600, names=None).fingerprint()
    opened = open_corpus("world:seed=2,entities=2000,names=9")
    assert opened.content_digest() == b.content_digest()


def test_root_strings_are_distinct_and_decode_back():
    # exhaustive: distinct indices give distinct strings, so disjoint root sets give disjoint names
    assert len({root_string(i) for i in range(ROOT_SPACE)}) == ROOT_SPACE
    assert all(root_index(root_string(i)) == i for i in range(0, ROOT_SPACE, 97))
    assert root_index("Press") is None and root_index("Velmo") is not None


@pytest.mark.parametrize("size", [1, 2, 1000, 4097])
def test_permutation_is_a_bijection(size: int):
    assert sorted(permute(i, size) for i in range(size)) == list(range(size))


def test_fixed_name_words_are_neither_roots_nor_given_names():
    givens = set(given_names("female")) | set(given_names("male"))
    assert len(givens) == 2 * GIVEN_NAMES_PER_GENDER
    for word in form_words():
        assert root_index(word) is None, f"{word!r} could be a root: names would be ambiguous"
        assert word not in givens


def test_relations_are_consistent(world: WorldCorpus):
    g = world.graph
    triples = list(g.triples())
    pairs = {(s, r, o) for s, r, o in triples}
    ids = {e.id for e in g.entities()}
    for s, r, o in triples:
        assert s in ids and o in ids, f"dangling ({s}, {r}, {o})"
        spec = RELATIONS[r]
        assert g.get(s).type in spec.subject_types and g.get(o).type in spec.object_types
        if r == "spouse":
            assert (o, "spouse", s) in pairs
    per_subject = {}
    for s, r, _ in triples:
        per_subject[(s, r)] = per_subject.get((s, r), 0) + 1
    assert max(per_subject.values()) == 1  # every relation here is functional
    for country in g.entities("country"):
        capital = g.objects(country.id, "capital")
        assert len(capital) == 1 and g.objects(capital[0], "country") == [country.id]
    assert sum(1 for *_, r in [(0, t[1]) for t in triples] if r == "spouse") > 0.3 * len(g.entities("person"))


def test_years_are_plausible(world: WorldCorpus):
    g = world.graph

    def born(person_id: str) -> int:
        return int(g.get(person_id).attrs["birth_year"])

    for org in g.entities("org"):
        assert born(g.one(org.id, "founder")) + 25 <= int(org.attrs["founded"])
    for work in g.entities("work"):
        assert born(g.one(work.id, "creator")) + 20 <= int(work.attrs["year"]) <= 2020
        assert int(g.get(g.one(work.id, "publisher")).attrs["founded"]) <= int(work.attrs["year"])
    for event in g.entities("event"):
        assert 18 <= int(event.attrs["year"]) - born(g.one(event.id, "winner"))
        assert int(g.get(g.one(event.id, "organiser")).attrs["founded"]) <= int(event.attrs["year"])
    for p in g.entities("person"):
        if (spouse := g.one(p.id, "spouse")) is not None:
            assert abs(born(spouse) - born(p.id)) <= 15


def test_publishers_fit_the_kind_of_work(world: WorldCorpus):
    g = world.graph
    industry = {"book": "publishing", "film": "film", "album": "music"}
    for work in g.entities("work"):
        assert g.get(g.one(work.id, "publisher")).attrs["industry"] == industry[work.type]


def test_pages_have_stable_urls_and_links_that_resolve(world: WorldCorpus):
    pages = {p.url: p for p in world.pages()}
    links = world.links()
    assert set(links) == set(pages)
    for url, page in pages.items():
        assert url == "https://world0.example/wiki/" + page.title.replace(" ", "_")
        assert world.entity_by_url(url).name == page.title
        for target in links[url]:
            assert target in pages and target != url
            assert pages[target].title in page.contents  # linked entities are named on the page
    linked_to = {t for targets in links.values() for t in targets}
    unlinked = [world.entity_by_url(u) for u in pages if u not in linked_to]
    # a crawler reaches every place, organisation, work and event
    assert not [e.name for e in unlinked if e.type != "person"]
    assert len(unlinked) < 0.3 * len(pages)
    with pytest.raises(KeyError, match="not a page"):
        world.entity_by_url("https://world1.example/wiki/Nowhere")
    docs = {d.url: d for d in world.documents()}
    assert all(pages[u].contents.startswith(d.text) for u, d in docs.items())


def test_every_fact_is_stated_on_its_page(world: WorldCorpus):
    g = world.graph
    for e in g.entities():
        text = world.rendered(e.id).text
        for key, value in g.facts(e.id):
            if key == "gender":
                continue  # shown by pronouns only
            sentence = world.statement(e.id, key)
            assert sentence in text
            if key in RELATIONS:
                shown = g.get(value).name
            elif key == "population":
                shown = f"{value:,}"
            else:
                shown = INDUSTRY_WORDS.get(str(value), str(value)) if key == "industry" else str(value)
            assert shown in sentence, f"{e.name}: {key}={shown!r} not in {sentence!r}"


def test_page_text_is_clean(world: WorldCorpus):
    for doc in world.documents():
        assert "{" not in doc.text and "  " not in doc.text and doc.text.endswith(".")
        assert not re.search(r"\ban [^aeiouAEIOU]|\ba [aeioAEIO]|\ban uni", doc.text), doc.text


def test_person_pages_are_short(world: WorldCorpus):
    lengths = [len(world.rendered(p.id).text.split()) for p in world.graph.entities("person")]
    assert max(lengths) <= 90 and sum(lengths) / len(lengths) <= 40


def test_distractors_city_pages_name_people_born_there(world: WorldCorpus):
    g = world.graph
    natives_named = 0
    for city in g.entities("city"):
        text = world.rendered(city.id).text
        natives_named += sum(1 for p in g.subjects("born_in", city.id) if g.get(p).name in text)
    assert natives_named > len(g.entities("city"))


def test_fingerprint_and_name(world: WorldCorpus):
    assert world.fingerprint() == WorldCorpus(0, 2000).fingerprint()  # needs no generation: cheap
    assert world.fingerprint() != WorldCorpus(1, 2000).fingerprint()
    assert WorldCorpus(0, 300).fingerprint() != WorldCorpus(0, 301).fingerprint()
    assert f"v{GENERATOR_VERSION}" in world.fingerprint()
    assert parse_world_spec(world.name) == {"seed": 0, "n_entities": 2000}


def test_open_corpus_builds_the_world():
    corpus = open_corpus("world:seed=7,entities=300")
    assert isinstance(corpus, WorldCorpus)
    assert (corpus.seed, len(corpus)) == (7, 300)
    assert next(corpus.pages()).url.startswith("https://world7.example/wiki/")


def test_bad_sizes_are_refused_with_the_limit():
    with pytest.raises(ConfigError, match="n_entities must be an integer >= 100"):
        WorldCorpus(0, 10)
    with pytest.raises(ConfigError, match=r"use n_entities <= (\d+)") as refused:
        WorldCorpus(0, 20000)
    limit = int(re.search(r"<= (\d+)", str(refused.value)).group(1))
    assert len(WorldCorpus(0, limit).graph) == limit  # the limit it names does work


def test_facts_pages_state_each_fact_as_a_key_value_field():
    """`pages=facts`: same graph, `Name : type ; key value ; ...` pages whose statements back the questions."""
    prose, facts = WorldCorpus(5, 600), WorldCorpus(5, 600, pages="facts")
    assert facts.name == "world:seed=5,entities=600,pages=facts" and parse_world_spec(facts.name)["pages"] == "facts"
    assert facts.fingerprint() != prose.fingerprint() and open_corpus(facts.name).page_style == "facts"
    g = facts.graph
    person = next(e for e in g.entities("person") if g.one(e.id, "spouse") and g.one(e.id, "employer"))
    page = facts.rendered(person)
    spouse, employer = (g.get(g.one(person.id, r)).name for r in ("spouse", "employer"))
    assert page.text.startswith(f"{person.name} : person ; occupation ")
    assert f" ; spouse {spouse}" in page.text and f" ; employer {employer} ;" in page.text
    assert facts.statement(person, "birth_year") == f"birth year {person.attrs['birth_year']}"
    assert page.text.index("employer") < page.text.index("spouse")  # always the same order
    for q in generate_questions(facts, 60, hops=(1, 2, 3), seed=0):  # every cited statement is on its page
        for ev in q.evidence:
            assert ev.statement in facts.rendered(facts.entity_by_url(ev.url)).text
    with pytest.raises(ConfigError, match="pages must be one of"):
        WorldCorpus(5, 600, pages="poems")
    with pytest.raises(ConfigError, match="pages=TEXT"):
        parse_world_spec("world:seed=1,style=facts")
