"""k-hop world questions: unique answers (brute force), evidence on its pages, balance, determinism, files."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from asearch.corpus.world import (
    RELATIONS,
    WorldCorpus,
    WorldQuestion,
    generate_questions,
    read_questions_jsonl,
    write_questions_jsonl,
)
from asearch.corpus.world.names import form_words
from asearch.corpus.world.questions import follow_path
from asearch.errors import DataFormatError


@pytest.fixture(scope="module")
def world() -> WorldCorpus:
    return WorldCorpus(seed=2)


@pytest.fixture(scope="module")
def questions(world: WorldCorpus) -> list[WorldQuestion]:
    return generate_questions(world, 600, seed=1)


def _answers_by_brute_force(world: WorldCorpus, q: WorldQuestion) -> set[str]:
    """Every value that fits the question's relation path, found by scanning all triples and entities.

    Independent of the graph's indexes and of the generator's walk: for each step, any entity (of the
    named type, for inverse steps) related to any current candidate is a candidate.
    """
    g = world.graph
    triples = list(g.triples())
    starts = [e.id for e in g.entities() if e.name == q.subject]
    assert len(starts) == 1, f"{q.subject!r} names {len(starts)} entities"
    current: set = set(starts)
    for step in q.path:
        if step.startswith("~"):
            relation, _, type_ = step[1:].partition(":")
            current = {s for s, r, o in triples if r == relation and o in current and g.get(s).type == type_}
        elif step in RELATIONS:
            current = {o for s, r, o in triples if r == step and s in current}
        else:
            current = {e.attrs[step] for e in g.entities() if e.id in current and step in e.attrs}
    return {g.get(v).name if isinstance(v, str) and v in g else str(v) for v in current}


def test_every_answer_is_unique_by_brute_force(world: WorldCorpus, questions: list[WorldQuestion]):
    for q in questions:
        assert _answers_by_brute_force(world, q) == {q.answer}, q.question


def test_graph_path_lookup_agrees(world: WorldCorpus, questions: list[WorldQuestion]):
    g = world.graph
    for q in questions:
        (value,) = follow_path(g, q.subject, q.path)
        assert (g.get(value).name if isinstance(value, str) and value in g else str(value)) == q.answer


def test_evidence_statements_are_on_their_pages(world: WorldCorpus, questions: list[WorldQuestion]):
    pages = {p.url: p.contents for p in world.pages()}
    for q in questions:
        assert len(q.evidence) == q.hops == len(q.path)
        for ev in q.evidence:
            assert ev.statement in pages[ev.url], (q.question, ev)
            assert world.entity_by_url(ev.url).name == ev.entity
            assert ev.value in ev.statement or f"{int(ev.value):,}" in ev.statement
        last = q.evidence[-1]
        assert q.answer == (last.entity if q.path[-1].startswith("~") else last.value)
        # the chain is connected: each hop starts where the previous one ended
        for i in range(1, q.hops):
            prev, hop = q.evidence[i - 1], q.evidence[i]
            reached = prev.entity if q.path[i - 1].startswith("~") else prev.value
            assert reached == (hop.value if q.path[i].startswith("~") else hop.entity)


def test_balanced_distinct_and_natural(questions: list[WorldQuestion]):
    assert Counter(q.hops for q in questions) == {1: 200, 2: 200, 3: 200}
    assert len({q.id for q in questions}) == len({q.question for q in questions}) == 600
    assert len({q.template for q in questions}) > 60  # many relation paths, not a handful
    fixed_words = {w.lower() for w in form_words()} | {"the", "of", "a", "an", "in"}
    for q in questions:
        assert q.question[0].isupper() and q.question.endswith("?") and "{" not in q.question
        assert q.subject in q.question
        assert q.answers[0] == q.answer
        answer_words = set(re.findall(r"[a-z]+", q.answer.lower())) - fixed_words
        assert not answer_words & set(re.findall(r"[a-z]+", q.question.lower())), q.question  # no give-away


def test_answer_space_is_large(questions: list[WorldQuestion]):
    answers = Counter(q.answer for q in questions)
    assert len(answers) > 300
    assert answers.most_common(1)[0][1] <= 15  # no answer a guesser could bet on


def test_seeded_and_deterministic(world: WorldCorpus, questions: list[WorldQuestion]):
    again = generate_questions(world, 600, seed=1)
    assert [q.to_dict() for q in again] == [q.to_dict() for q in questions]
    other = generate_questions(world, 600, seed=2)
    assert [q.question for q in other] != [q.question for q in questions]


def test_hop_selection_and_remainder(world: WorldCorpus):
    assert Counter(q.hops for q in generate_questions(world, 10)) == {1: 4, 2: 3, 3: 3}
    assert {q.hops for q in generate_questions(world, 20, hops=(2,))} == {2}
    with pytest.raises(ValueError, match="hop counts >= 1"):
        generate_questions(world, 5, hops=(0,))


def test_forward_walks_and_entity_answers_are_drawn_not_filtered_after(world: WorldCorpus, questions: list[WorldQuestion]):
    """The restrictions redraw walks, so n questions come back, balanced over hops, all of the asked kind."""
    assert any(k.startswith("~") for q in questions for k in q.path)  # unrestricted walks take inverse steps
    assert any(q.path[-1] not in RELATIONS for q in questions)  # and end on attributes (years, occupations)
    kept = generate_questions(world, 300, seed=1, forward_only=True, entity_answers=True)
    assert len(kept) == 300 and Counter(q.hops for q in kept) == {1: 100, 2: 100, 3: 100}
    assert all(not k.startswith("~") for q in kept for k in q.path)
    assert all(q.path[-1] in RELATIONS and q.answer == q.evidence[-1].value for q in kept)  # a page's title
    forward = generate_questions(world, 300, seed=1, forward_only=True)
    assert any(q.path[-1] not in RELATIONS for q in forward)  # attribute answers stay without entity_answers


def test_keys_phrasing_words_every_hop_with_the_key_its_page_states(world: WorldCorpus):
    """`phrasing="keys"`: "What is the capital of the country of the birthplace of X?", the keys in walk order
    from the inside out, each the key of the statement the hop's page holds; the answers are the walks' own."""
    with pytest.raises(ValueError, match="pages=facts or long"):
        generate_questions(world, 5, phrasing="keys")  # prose pages state facts in sentences, not under keys
    world = WorldCorpus(seed=2, pages="long")
    keyed = generate_questions(world, 120, hops=(1, 2, 3, 4), seed=1, forward_only=True, entity_answers=True, phrasing="keys")
    assert Counter(q.hops for q in keyed) == {1: 30, 2: 30, 3: 30, 4: 30}
    for q in keyed:
        keys = [e.statement[: -len(str(e.value))].strip() for e in q.evidence]
        inner = " of ".join(f"the {k}" for k in reversed(keys[:-1]))
        said = {f"What is the {keys[-1]} of {inner + ' of ' if inner else ''}{s}?" for s in (q.subject, f"the {q.subject}")}
        assert q.question in said  # an event is "the X Cup"
        assert all(e.statement in world.page(e.url).contents.splitlines() for e in q.evidence)  # `key value` lines
        assert follow_path(world.graph, q.subject, q.path) and q.answer == q.evidence[-1].value
    natural = generate_questions(world, 120, hops=(1, 2, 3, 4), seed=1, forward_only=True, entity_answers=True)
    assert sum(q.question.startswith("What is the ") for q in natural) < len(natural) / 2
    with pytest.raises(ValueError, match="phrasing"):
        generate_questions(world, 5, phrasing="plain")


def test_too_many_questions_for_a_small_world_is_an_error():
    tiny = WorldCorpus(seed=4, n_entities=100)
    with pytest.raises(ValueError, match="distinct 1-hop questions"):
        generate_questions(tiny, 3000, hops=(1,))


def test_jsonl_round_trip_in_asearcher_shape(tmp_path, questions: list[WorldQuestion]):
    path = tmp_path / "qa" / "world.jsonl"
    assert write_questions_jsonl(path, questions[:20]) == 20
    first = json.loads(path.read_text().splitlines()[0])
    assert {"id", "question", "answer", "hops", "evidence"} <= set(first)
    assert isinstance(first["answer"], list) and first["answer"][0] == questions[0].answer
    assert set(first["evidence"][0]) == {"url", "entity", "relation", "value", "statement"}
    assert [q.to_dict() for q in read_questions_jsonl(path)] == [q.to_dict() for q in questions[:20]]


def test_reading_a_bad_line_names_file_line_and_field(tmp_path, questions: list[WorldQuestion]):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(questions[0].to_asearcher())
    broken = questions[1].to_asearcher()
    del broken["question"]
    path.write_text(good + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2: field 'question'"):
        read_questions_jsonl(path)
