"""The knowledge-graph backend: INJECT and FUZZ are graph edits rendered to English; uniqueness is exact.

Seed = an entity. Base QA = one of its facts ("Which city is the birthplace of Tavi Velmo?"). INJECT
reads a neighbour in the graph (a linked page) and adds the fact as a constraint on an entity of the
question; FUZZ blurs one detail (a year to its decade, a population to a band, an occupation to its
field, a name to a description). Every fact cites the page sentence that states it.
"""

from __future__ import annotations

import random
import re
from typing import Any

from asearch.corpus.world import RELATIONS, KnowledgeGraph, Range, WorldCorpus
from asearch.corpus.world.names import form_words
from asearch.corpus.world.questions import FINAL_ATTRIBUTES
from asearch.synth.backend import Draft, EditAction, GateResult, Seed, register_synth_backend
from asearch.synth.config import GateConfig, GraphBackendConfig, SynthConfig
from asearch.synth.pattern import (
    CONSTRAINABLE,
    HEAD_ATTRIBUTES,
    AttrConstraint,
    GraphQuestion,
    Matcher,
    Node,
    Renderer,
    answer_variants,
    intended_answer,
)
from asearch.synth.records import Statement, Uniqueness

# Occupations blurred to their field ("a chemist" -> "a scientist"); occupations outside stay exact.
OCCUPATION_FIELDS: dict[str, frozenset[str]] = {
    "scientist": frozenset({"chemist", "physicist", "biologist", "botanist", "geologist", "astronomer",
                            "mathematician"}),
    "artist": frozenset({"painter", "sculptor", "photographer"}),
    "writer": frozenset({"novelist", "poet", "writer", "journalist", "translator"}),
    "musician": frozenset({"singer", "composer", "musician"}),
    "filmmaker": frozenset({"film director", "filmmaker"}),
    "athlete": frozenset({"runner", "cyclist", "golfer", "tennis player", "sailor", "jockey"}),
    "health worker": frozenset({"physician", "nurse", "pharmacist"}),
}  # fmt: skip
DESCRIBE_WEIGHT = 3.0  # FUZZ picks name -> description this many times as often as any other blur
# Asking the occupation of someone known for their works or wins gives it away ("the person who wrote X").
_OCCUPATION_GIVEAWAYS = ("creator", "winner")
_STOP_WORDS = {w.lower() for w in form_words()} | {"the", "of", "a", "an", "in", "to", "and"}
_WORDS = re.compile(r"[a-z0-9]+")


def period_of(name: str, year: int) -> Range:
    """The blur of a year: a decade, or a century for city foundings (800-1900, so decades say too much)."""
    if name == "founded" and year < 1900:
        return Range(year // 100 * 100, year // 100 * 100 + 99)
    return Range.decade(year // 10 * 10)


def population_band(n: int) -> Range:
    """1-3 x 10^k or 3-10 x 10^k, the band holding n ('between 1,000,000 and 3,000,000')."""
    magnitude = 10 ** (len(str(n)) - 1)
    low, high = (magnitude, 3 * magnitude) if n < 3 * magnitude else (3 * magnitude, 10 * magnitude)
    return Range(low, high)


class GraphBackend:
    """Synthesis over `WorldCorpus(world_seed, entities)`; `seeds()` is a seeded shuffle of every entity."""

    name = "graph"
    candidates_for_uniqueness = False

    def __init__(self, cfg: GraphBackendConfig, gates: GateConfig, run_seed: int = 0):
        self.cfg, self.gates, self.run_seed = cfg, gates, run_seed
        self.world = WorldCorpus(cfg.world_seed, cfg.entities)
        self.graph: KnowledgeGraph = self.world.graph
        self.corpus = self.world.name

    def models(self) -> dict[str, str]:
        return {"generator": f"graph:{self.world.name}"}

    def seeds(self) -> list[Seed]:
        ids = [e.id for e in self.graph.entities()]
        random.Random(f"asearch-synth/{self.world.name}/{self.run_seed}").shuffle(ids)
        return [Seed(i, x, self.world.url(x), self.graph.get(x).name) for i, x in enumerate(ids)]

    async def aclose(self) -> None:
        return None

    # ---------------------------------------------------------------- drafts
    def draft(self, q: GraphQuestion, note: str = "") -> Draft:
        """Render a pattern with its answers and the statements of every fact it uses."""
        matcher = Matcher(self.graph, q)
        return Draft(
            question=Renderer(self.graph, q, matcher).question(),
            answers=answer_variants(self.graph, q),
            statements=self.statements(q),
            state=q,
            paraphrases=self._paraphrases(q),
            note=note,
        )

    def statements(self, q: GraphQuestion) -> list[Statement]:
        """One statement per fact: each relation, each attribute constraint, and the asked attribute."""
        out: list[Statement] = []
        for e in q.edges:
            parent, child = q.nodes[e.parent].entity, q.nodes[e.child].entity
            subject, obj = (parent, child) if e.parent_is_subject else (child, parent)
            out.append(self._statement(subject, e.relation, self.graph.get(obj).name))
        for a in q.attrs:
            entity = q.nodes[a.node].entity
            out.append(self._statement(entity, a.name, str(self.graph.get(entity).attrs[a.name])))
        if q.ask != "name":
            entity = q.nodes[0].entity
            out.append(self._statement(entity, q.ask, str(self.graph.get(entity).attrs[q.ask])))
        return out

    def _statement(self, subject: str, key: str, value: str) -> Statement:
        return Statement(
            text=self.world.statement(subject, key),
            url=self.world.url(subject),
            entity=self.graph.get(subject).name,
            relation=key,
            value=value,
        )

    def _paraphrases(self, q: GraphQuestion) -> list[str]:
        """Longer forms a grader may meet: "Britis, Purno" for a city, "The X by Y" for a work."""
        if q.ask != "name":
            return []
        e = self.graph.get(q.nodes[0].entity)
        if e.type == "city" and (country := self.graph.one(e.id, "country")):
            return [f"{e.name}, {self.graph.get(country).name}"]
        if e.type in ("book", "film", "album") and (creator := self.graph.one(e.id, "creator")):
            return [f"{e.name} by {self.graph.get(creator).name}"]
        return []

    # ---------------------------------------------------------------- base QA
    async def base(self, seed: Seed, rng: random.Random) -> Draft | None:
        q = self.base_pattern(seed.key, rng)
        return None if q is None else self.draft(q, note=f"base: {self._describe_base(q)}")

    def base_pattern(self, entity_id: str, rng: random.Random) -> GraphQuestion | None:
        """One fact of the seed: ask the entity it points to (or that points to it), or one of its attributes."""
        g = self.graph
        s = g.get(entity_id)
        asks = [a for a in FINAL_ATTRIBUTES.get(s.type, ()) if a in s.attrs]  # what world questions ask
        if asks and rng.random() < self.cfg.ask_attribute_share:
            return GraphQuestion(nodes=(Node(s.id, s.type, True),), ask=rng.choice(asks))
        options: list[tuple[str, bool, str]] = []  # (relation, seed is subject, other entity)
        for r, spec in RELATIONS.items():
            if s.type in spec.subject_types:
                options += [(r, True, o) for o in g.objects(s.id, r)]
            if s.type in spec.object_types and not spec.symmetric:
                by_type: dict[str, list[str]] = {}
                for x in g.subjects(r, s.id):
                    by_type.setdefault(g.get(x).type, []).append(x)
                # "the company founded by X" names one company only when X founded one
                options += [(r, False, xs[0]) for xs in by_type.values() if len(xs) == 1]
        if not options:
            return None
        r, seed_is_subject, other = rng.choice(options)
        o = g.get(other)
        # node 0 is the other entity; the seed hangs off it, named
        root = GraphQuestion(nodes=(Node(o.id, o.type, False),))
        return root.with_node(Node(s.id, s.type, True), 0, r, parent_is_subject=not seed_is_subject)

    def _describe_base(self, q: GraphQuestion) -> str:
        if q.ask != "name":
            return f"{q.ask} of {self.graph.get(q.nodes[0].entity).name}"
        e = q.edges[0]
        return f"{'~' if not e.parent_is_subject else ''}{e.relation} of {self.graph.get(q.nodes[1].entity).name}"

    # ---------------------------------------------------------------- operators
    async def edit(self, draft: Draft, action: EditAction, rng: random.Random) -> Draft | None:
        q: GraphQuestion = draft.state
        made = self.inject(q, rng) if action == "inject" else self.fuzz(q, rng)
        if made is None:
            return None
        new_q, note = made
        return self.draft(new_q, note=f"{action}: {note}")

    def inject(self, q: GraphQuestion, rng: random.Random) -> tuple[GraphQuestion, str] | None:
        """Add one fact about a described entity of the question, read from its page or a linked page."""
        g = self.graph
        depth_of = _depths(q)
        per_node: list[tuple[int, list[tuple[str, Any]]]] = []
        for i, n in enumerate(q.nodes):
            if n.named:
                continue
            options = self._fact_options(q, i, allow_edges=depth_of[i] + 1 <= self.gates.max_depth)
            if options:
                per_node.append((i, options))
        if not per_node:
            return None
        i, options = rng.choice(per_node)
        kind, what = _pick_kind(options, rng)
        return self._apply_fact(q, i, kind, what, g)

    def _fact_options(self, q: GraphQuestion, i: int, *, allow_edges: bool) -> list[tuple[str, Any]]:
        """Facts about node i not yet in the question: ("attr", name) or ("edge", (relation, fwd, entity))."""
        g = self.graph
        n = q.nodes[i]
        e = g.get(n.entity)
        used = {a.name for a in q.attrs_of(i)}
        options: list[tuple[str, Any]] = [
            ("attr", a)
            for a in CONSTRAINABLE.get(n.type, ())
            if a in e.attrs and a not in used and not (i == 0 and a == q.ask)
        ]
        if allow_edges:
            taken = q.entities()
            for r, spec in RELATIONS.items():
                if n.type in spec.subject_types:
                    options += [("edge", (r, True, o)) for o in g.objects(e.id, r) if o not in taken]
                if n.type in spec.object_types and not spec.symmetric:
                    options += [("edge", (r, False, x)) for x in g.subjects(r, e.id) if x not in taken]
        return options

    def _apply_fact(
        self, q: GraphQuestion, i: int, kind: str, what: Any, g: KnowledgeGraph
    ) -> tuple[GraphQuestion, str]:
        n = q.nodes[i]
        if kind == "attr":
            value = g.get(n.entity).attrs[what]
            return q.with_attr(AttrConstraint(i, what, value)), f"{g.get(n.entity).name}: {what} = {value}"
        r, node_is_subject, other = what
        o = g.get(other)
        new = q.with_node(Node(o.id, o.type, True), i, r, parent_is_subject=node_is_subject)
        here = g.get(n.entity).name
        subject, obj = (here, o.name) if node_is_subject else (o.name, here)
        return new, f"({subject}, {r}, {obj})"

    def fuzz(self, q: GraphQuestion, rng: random.Random) -> tuple[GraphQuestion, str] | None:
        """Blur one detail: year -> period, population -> band, occupation -> field or a head noun dropped,
        or a name -> a description (facts added until the answer is unique again)."""
        g = self.graph
        options: list[tuple[str, Any]] = []
        for a in q.attrs:
            if isinstance(a.value, int) and a.name in ("birth_year", "founded", "year"):
                options.append(("period", a))
            elif isinstance(a.value, int) and a.name == "population":
                options.append(("band", a))
            elif a.name == HEAD_ATTRIBUTES.get(q.nodes[a.node].type) and not isinstance(a.value, frozenset):
                options.append(("generalise", a))
        depth_of = _depths(q)
        for j, n in enumerate(q.nodes):
            if n.named and (j != 0 or q.ask != "name"):
                options.append(("describe", j))
        if not options:
            return None
        # naming -> describing is what makes a question multi-hop, so it is the likeliest blur
        kind, what = rng.choices(
            options, weights=[DESCRIBE_WEIGHT if k == "describe" else 1.0 for k, _ in options]
        )[0]
        if kind == "period":
            period = period_of(what.name, int(what.value))
            name = g.get(q.nodes[what.node].entity).name
            return q.replace_attr(what, AttrConstraint(what.node, what.name, period)), (
                f"{name}: {what.name} {what.value} -> {period.low}-{period.high}"
            )
        if kind == "band":
            band = population_band(int(what.value))
            return q.replace_attr(what, AttrConstraint(what.node, "population", band)), (
                f"population {what.value:,} -> {band.low:,}-{band.high:,}"
            )
        if kind == "generalise":
            field = next((f for f, members in OCCUPATION_FIELDS.items() if what.value in members), None)
            if what.name == "occupation" and field is not None:
                new = AttrConstraint(what.node, "occupation", OCCUPATION_FIELDS[field], label=field)
                return q.replace_attr(what, new), f"occupation {what.value} -> {field}"
            return q.replace_attr(what, None), f"{what.name} {what.value} dropped"
        return self._describe(q, what, rng, depth_of)

    def _describe(
        self, q: GraphQuestion, j: int, rng: random.Random, depth_of: dict[int, int]
    ) -> tuple[GraphQuestion, str]:
        """Replace node j's name by facts about it, added one by one until the answer is unique again."""
        g = self.graph
        name = g.get(q.nodes[j].entity).name
        answer = intended_answer(g, q)
        new = q.with_named(j, False)
        options = self._fact_options(new, j, allow_edges=depth_of[j] + 1 <= self.gates.max_depth)
        # naming a neighbour whose name shares a word with the answer would give the answer away
        options = [o for o in options if not (o[0] == "edge" and _shares_word(g.get(o[1][2]).name, answer))]
        rng.shuffle(options)
        added: list[str] = []
        for kind, what in options[: self.cfg.max_description_facts * 3]:
            if len(added) >= self.cfg.max_description_facts:
                break
            if kind == "attr" and any(a.name == what for a in new.attrs_of(j)):
                continue
            if kind == "edge" and what[2] in new.entities():
                continue
            new, note = self._apply_fact(new, j, kind, what, g)
            added.append(note)
            if Matcher(g, new).answer_values() == {answer}:
                break
        return new, f"{name} -> described by {'; '.join(added) or 'its type only'}"

    # ---------------------------------------------------------------- gates
    async def quality(self, before: Draft | None, after: Draft) -> GateResult:
        q: GraphQuestion = after.state
        g = self.graph
        if before is not None and after.answer != before.answer:
            return GateResult(False, f"answer changed: {before.answer!r} -> {after.answer!r}")
        if intended_answer(g, q) != after.answer:
            return GateResult(False, "the pattern's answer is not the draft's answer")
        problem = text_problems(after.question, self.gates.max_words)
        if problem:
            return GateResult(False, problem)
        if q.n_facts > self.gates.max_facts:
            return GateResult(False, f"{q.n_facts} constraints > max_facts={self.gates.max_facts}")
        if q.depth() > self.gates.max_depth:
            return GateResult(False, f"nesting depth {q.depth()} > max_depth={self.gates.max_depth}")
        vacuous = [
            i for i, n in enumerate(q.nodes) if i and not n.named and not q.attrs_of(i) and not q.children(i)
        ]
        if vacuous:
            return GateResult(False, f"{Renderer(g, q).noun_phrase(vacuous[0])!r} describes nothing")
        if _shares_word(after.question, after.answer):
            return GateResult(False, "a word of the answer appears in the question")
        if q.ask == "occupation" and any(
            e.relation in _OCCUPATION_GIVEAWAYS and not e.parent_is_subject for e in q.children(0)
        ):
            return GateResult(
                False, "the question gives its answer away (an occupation implied by works or wins)"
            )
        for s in after.statements:  # solvable from the recorded statements, each on its page
            page = self.world.page(s.url).contents
            if s.text not in page:
                return GateResult(False, f"statement not on its page {s.url}: {s.text!r}")
            if _surface(s) not in s.text:
                return GateResult(False, f"statement does not state {s.relation}={s.value!r}: {s.text!r}")
        return GateResult(True)

    async def uniqueness(self, draft: Draft, wrong_answers: list[str]) -> Uniqueness:
        """Exact: every entity (or attribute value) the graph allows for the whole pattern."""
        values = Matcher(self.graph, draft.state).answer_values()
        held = values == {draft.answer}
        shown = ", ".join(sorted(values)[:5]) + (" ..." if len(values) > 5 else "")
        return Uniqueness("graph-exact", True, held, detail=f"{len(values)} answer(s) match: {shown}")


def text_problems(question: str, max_words: int) -> str:
    """Shape checks every backend applies: one question, ending in '?', not too long."""
    text = question.strip()
    if not text:
        return "empty question"
    if not text.endswith("?"):
        return "does not end with a question mark"
    if text.count("?") > 1:
        return "several questions in one (more than one '?')"
    if re.search(r"\b[a-z]\w{2,}[.!;]\s+[A-Z]", text):  # "... a city. Who ..." (not "J. R. Tolkien")
        return "several sentences in one question"
    if len(text.split()) > max_words:
        return f"{len(text.split())} words > max_words={max_words}"
    words = text.lower().split()
    if any(words[i] == words[i + 1] for i in range(len(words) - 1)):
        return "a word repeated back to back"
    return ""


def _surface(s: Statement) -> str:
    """How a page sentence writes a value: record labels for the music industry, thousands separators."""
    if s.relation == "industry":
        return {"music": "record label", "film": "film studio", "publishing": "publishing house"}.get(
            s.value, s.value
        )
    if s.relation == "population":
        return f"{int(s.value):,}"
    return s.value


def _shares_word(text: str, answer: str) -> bool:
    """True when a distinctive word of `answer` (not a form word like 'University') occurs in `text`."""
    words = set(_WORDS.findall(text.lower()))
    return any(w in words for w in _WORDS.findall(answer.lower()) if w not in _STOP_WORDS)


def _depths(q: GraphQuestion) -> dict[int, int]:
    """Edges from node 0 to each node."""
    depth = {0: 0}
    for e in q.edges:  # parents come before children
        depth[e.child] = depth[e.parent] + 1
    return depth


def _pick_kind(options: list[tuple[str, Any]], rng: random.Random) -> tuple[str, Any]:
    """Each attribute, and each (relation, direction), is equally likely; then one entity among them.

    Without the grouping, a city's ~born_in edges (dozens of natives) would crowd out everything else.
    """
    groups: dict[tuple[str, Any], list[tuple[str, Any]]] = {}
    for kind, what in options:
        key = (kind, what) if kind == "attr" else (kind, what[:2])
        groups.setdefault(key, []).append((kind, what))
    key = rng.choice(sorted(groups, key=str))
    return rng.choice(groups[key])


@register_synth_backend("graph")
def build_graph_backend(cfg: SynthConfig) -> GraphBackend:
    """The embedded world's knowledge graph: exact edits and checks, no model."""
    return GraphBackend(cfg.graph, cfg.gates, cfg.seed)
