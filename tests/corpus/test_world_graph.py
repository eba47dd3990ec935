"""KnowledgeGraph: lookups and constraint queries on a hand-checked world; validation; find vs brute force."""

from __future__ import annotations

import random

import pytest

from asearch.corpus.world import RELATIONS, Entity, KnowledgeGraph, Range, WorldCorpus


def small_world(
    extra_triples: list[tuple[str, str, str]] | None = None, drop: tuple[str, str, str] | None = None
):
    """Two countries, three cities, four people, two orgs, a book and an event (drawn out in the asserts)."""
    E = Entity
    entities = [
        E("Alda", "country", "Alda"),
        E("Cora", "country", "Cora"),
        E("Bree", "city", "Bree", {"founded": 1100, "population": 90_000}),
        E("Edge", "city", "Edge", {"founded": 1500, "population": 4_000}),
        E("Dun", "city", "Dun", {"founded": 1300, "population": 300_000}),
        E("Ann_Bell", "person", "Ann Bell", {"birth_year": 1921, "gender": "female", "occupation": "poet"}),
        E("Bob_Bell", "person", "Bob Bell", {"birth_year": 1925, "gender": "male", "occupation": "sailor"}),
        E("Cy_Dole", "person", "Cy Dole", {"birth_year": 1931, "gender": "male", "occupation": "banker"}),
        E("Di_Dole", "person", "Di Dole", {"birth_year": 1950, "gender": "female", "occupation": "poet"}),
        E("Acme_Group", "company", "Acme Group", {"founded": 1960, "industry": "steel"}),
        E("Bree_University", "university", "Bree University", {"founded": 1955}),
        E("Moon_Road", "book", "Moon Road", {"year": 1960, "genre": "crime"}),
        E("Bree_Open", "event", "Bree Open", {"year": 1970, "category": "chess tournament"}),
    ]
    triples = [
        ("Bree", "country", "Alda"),
        ("Edge", "country", "Alda"),
        ("Dun", "country", "Cora"),
        ("Alda", "capital", "Bree"),
        ("Cora", "capital", "Dun"),
        ("Ann_Bell", "born_in", "Bree"),
        ("Bob_Bell", "born_in", "Edge"),
        ("Cy_Dole", "born_in", "Dun"),
        ("Di_Dole", "born_in", "Bree"),
        ("Ann_Bell", "spouse", "Bob_Bell"),
        ("Bob_Bell", "spouse", "Ann_Bell"),
        ("Ann_Bell", "employer", "Acme_Group"),
        ("Cy_Dole", "employer", "Acme_Group"),
        ("Di_Dole", "employer", "Bree_University"),
        ("Bob_Bell", "alma_mater", "Bree_University"),
        ("Acme_Group", "headquarters", "Dun"),
        ("Acme_Group", "founder", "Cy_Dole"),
        ("Bree_University", "headquarters", "Bree"),
        ("Bree_University", "founder", "Ann_Bell"),
        ("Moon_Road", "creator", "Ann_Bell"),
        ("Moon_Road", "publisher", "Acme_Group"),
        ("Bree_Open", "location", "Edge"),
        ("Bree_Open", "organiser", "Bree_University"),
        ("Bree_Open", "winner", "Bob_Bell"),
    ]
    triples = [t for t in triples if t != drop] + (extra_triples or [])
    return KnowledgeGraph(entities, triples)


@pytest.fixture(scope="module")
def g() -> KnowledgeGraph:
    return small_world()


def test_lookups(g: KnowledgeGraph):
    assert [e.id for e in g.entities("person")] == ["Ann_Bell", "Bob_Bell", "Cy_Dole", "Di_Dole"]
    assert [e.id for e in g.entities("org")] == ["Acme_Group", "Bree_University"]
    assert [e.name for e in g.entities("work")] == ["Moon Road"]
    assert len(g) == 13 and "Dun" in g and "Nowhere" not in g
    assert g.get("Ann Bell").id == "Ann_Bell" == g.get("Ann_Bell").id  # by name or id
    assert g.objects("Ann Bell", "spouse") == ["Bob_Bell"]
    assert g.subjects("born_in", "Bree") == ["Ann_Bell", "Di_Dole"]
    assert g.subjects("employer", "Acme Group") == ["Ann_Bell", "Cy_Dole"]
    assert g.one("Edge", "capital") is None and g.one("Alda", "capital") == "Bree"
    assert g.attr("Cy_Dole", "birth_year") == 1931
    assert g.follow("Moon_Road", "creator.spouse.born_in.country") == ["Alda"]
    assert g.follow("Cy_Dole", "~founder.~publisher.year") == [1960]
    assert ("founder", "Cy_Dole") in g.facts("Acme_Group") and ("industry", "steel") in g.facts("Acme_Group")
    with pytest.raises(KeyError, match="Nobody"):
        g.get("Nobody")
    with pytest.raises(ValueError, match="unknown relation"):
        g.objects("Ann_Bell", "sibling")
    with pytest.raises(ValueError, match="unknown entity type"):
        g.entities("planet")


def ids(g: KnowledgeGraph, constraints) -> list[str]:
    return g.find(constraints)


def test_find_exact_range_and_hop_constraints(g: KnowledgeGraph):
    assert ids(g, {"type": "person", "born_in": "Bree"}) == ["Ann_Bell", "Di_Dole"]
    assert ids(g, {"born_in.country": "Alda"}) == ["Ann_Bell", "Bob_Bell", "Di_Dole"]
    assert ids(g, {"type": "person", "birth_year": Range.decade(1920)}) == ["Ann_Bell", "Bob_Bell"]
    assert ids(g, {"employer.headquarters": "Dun", "birth_year": Range(high=1925)}) == ["Ann_Bell"]
    assert ids(g, {"~founder.industry": "steel"}) == ["Cy_Dole"]  # people who founded a steel company
    assert ids(g, {"spouse.born_in": "Edge"}) == ["Ann_Bell"]
    assert ids(g, {"born_in": {"Edge", "Dun"}}) == ["Bob_Bell", "Cy_Dole"]  # any of
    assert ids(g, {"occupation": "poet", "born_in.population": Range(low=100_000)}) == []
    assert ids(g, {"type": "org", "founded": Range(1950, 1959)}) == ["Bree_University"]
    assert ids(g, {"type": ["city", "country"], "~born_in.occupation": "poet"}) == ["Bree"]
    assert ids(g, {"type": "person"}) == ["Ann_Bell", "Bob_Bell", "Cy_Dole", "Di_Dole"]
    assert ids(g, {"~winner.location.country": "Alda", "alma_mater": "Bree University"}) == ["Bob_Bell"]


def test_count_and_unique_match(g: KnowledgeGraph):
    assert g.count_matching({"type": "person", "occupation": "poet"}) == 2
    assert g.unique_match({"type": "person", "occupation": "poet"}) is None  # two poets
    assert g.unique_match({"occupation": "poet", "birth_year": Range(1940, 1959)}) == "Di_Dole"
    assert g.count_matching({"born_in": "Dun", "birth_year": Range(1900, 1910)}) == 0


def test_bad_constraints_say_what_is_wrong(g: KnowledgeGraph):
    with pytest.raises(ValueError, match="unknown relation or attribute 'hometown'"):
        g.find({"hometown": "Bree"})
    with pytest.raises(ValueError, match="no entity with id or name 'Atlantis'"):
        g.find({"born_in": "Atlantis"})
    with pytest.raises(ValueError, match="a Range needs a path ending in an attribute"):
        g.find({"born_in": Range(1, 2)})
    with pytest.raises(ValueError, match="can only be the last step"):
        g.find({"birth_year.country": "Alda"})
    with pytest.raises(ValueError, match="low must be <= high"):
        Range(1930, 1920)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"drop": ("Bob_Bell", "spouse", "Ann_Bell")}, "lacks its mirror"),
        ({"extra_triples": [("Alda", "capital", "Dun")]}, "functional relation 'capital'"),
        ({"extra_triples": [("Ann_Bell", "born_in", "Nowhere")]}, "'Nowhere' is not an entity"),
        ({"extra_triples": [("Bree", "born_in", "Edge")]}, "subject type city"),
        ({"drop": ("Dun", "country", "Cora")}, "capital 'Dun' of 'Cora' is not located in 'Cora'"),
    ],
)
def test_inconsistent_graphs_are_refused(change, problem):
    with pytest.raises(ValueError, match=problem):
        small_world(**change)


def test_bad_entities_are_refused():
    with pytest.raises(ValueError, match="must be int"):
        KnowledgeGraph([Entity("X", "person", "X", {"birth_year": "1920"})], [])
    with pytest.raises(ValueError, match="cannot have attribute 'population'"):
        KnowledgeGraph([Entity("X", "person", "X", {"population": 3})], [])
    with pytest.raises(ValueError, match="duplicate entity name"):
        KnowledgeGraph([Entity("X", "city", "Same"), Entity("Y", "city", "Same")], [])


def _brute_force(g: KnowledgeGraph, constraints: dict) -> list[str]:
    """Scan every entity and follow paths through a plain triple list (no graph indexes)."""
    forward: dict[tuple[str, str], list[str]] = {}
    for s, r, o in g.triples():
        forward.setdefault((s, r), []).append(o)
        forward.setdefault((o, "~" + r), []).append(s)
    out = []
    for e in g.entities():
        ok = True
        for key, want in constraints.items():
            values: list = [e.id]
            for step in key.split("."):
                if step.removeprefix("~") in RELATIONS:
                    values = [o for v in values for o in forward.get((v, step), [])]
                else:
                    values = [g.get(v).attrs[step] for v in values if step in g.get(v).attrs]
            ok &= any(v in want for v in values) if isinstance(want, Range) else want in values
        if ok:
            out.append(e.id)
    return out


def test_find_agrees_with_brute_force_on_a_generated_world():
    world = WorldCorpus(seed=11, n_entities=300)
    g = world.graph
    rng = random.Random(5)
    people = g.entities("person")
    for _ in range(60):
        p = rng.choice(people)
        constraints: dict = {}
        if rng.random() < 0.7:
            constraints["born_in.country"] = g.follow(p.id, "born_in.country")[0]
        decade = int(p.attrs["birth_year"]) // 10 * 10
        constraints["birth_year"] = Range.decade(decade)
        if (employer := g.one(p.id, "employer")) and rng.random() < 0.5:
            constraints["employer.headquarters"] = g.one(employer, "headquarters")
        expected = _brute_force(g, constraints)
        assert p.id in expected
        assert g.find(constraints) == expected, constraints
        assert g.count_matching(constraints) == len(expected)
