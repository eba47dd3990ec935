"""A graph question as a tree pattern over the world's knowledge graph: exact answer sets and English text.

Node 0 is what is asked (its name, or one of its attributes). Every other node hangs off one earlier
node by one relation; a node is either named in the text ("Tavi Velmo") or described by its own
facts ("a chemist who works for Thaves Music"). Each node is bound to the entity the generator had in
mind, so the intended answer is known; `answer_values` finds every answer the pattern allows by
semi-join over the tree with `KnowledgeGraph.find`, which is exact for trees.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from asearch.corpus.world.graph import KnowledgeGraph, Range
from asearch.corpus.world.render import article, join_names, mention

AttrValue = int | str | Range | frozenset

# Attributes shown as the head noun ("the chemist", "a steel company") rather than as a clause.
HEAD_ATTRIBUTES = {"person": "occupation", "company": "industry", "book": "genre", "film": "genre",
                   "album": "genre", "event": "category"}  # fmt: skip
# Attributes that may constrain a node (gender has no sentence of its own on a page, so it never does).
CONSTRAINABLE = {
    "person": ("birth_year", "occupation"),
    "city": ("founded", "population"),
    "company": ("founded", "industry"),
    "university": ("founded",),
    "book": ("year", "genre"),
    "film": ("year", "genre"),
    "album": ("year", "genre"),
    "event": ("year", "category"),
    "country": (),
}
TYPE_NOUNS = {"person": "person", "city": "city", "country": "country", "company": "company",
              "university": "university", "book": "book", "film": "film", "album": "album",
              "event": "event"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Node:
    """An entity of the question: `entity` is the id it is bound to; `named` shows its name in the text."""

    entity: str
    type: str
    named: bool


@dataclass(frozen=True, slots=True)
class Edge:
    """A relation between `parent` and `child` nodes: (parent, relation, child) when `parent_is_subject`,
    else (child, relation, parent). The child was added later, so the edges form a tree rooted at node 0."""

    parent: int
    child: int
    relation: str
    parent_is_subject: bool

    @property
    def key(self) -> str:
        """The `find` key that constrains the parent: 'employer', or '~founder' (the parent founded ...)."""
        return self.relation if self.parent_is_subject else "~" + self.relation


@dataclass(frozen=True, slots=True)
class AttrConstraint:
    """`node`'s attribute `name` is `value`: exact, within a Range, or one of a set (`label` names the set)."""

    node: int
    name: str
    value: AttrValue
    label: str = ""


@dataclass(frozen=True, slots=True)
class GraphQuestion:
    """The whole pattern; immutable, so an edit is a new pattern (`with_...` helpers)."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    attrs: tuple[AttrConstraint, ...] = ()
    ask: str = "name"  # "name" or an attribute of node 0

    # ---- structure
    def children(self, node: int) -> list[Edge]:
        return [e for e in self.edges if e.parent == node]

    def parent_edge(self, node: int) -> Edge | None:
        return next((e for e in self.edges if e.child == node), None)

    def attrs_of(self, node: int) -> list[AttrConstraint]:
        return [a for a in self.attrs if a.node == node]

    def depth(self, node: int = 0) -> int:
        """Edges on the longest path from `node` down to a leaf."""
        return max((1 + self.depth(e.child) for e in self.children(node)), default=0)

    @property
    def n_facts(self) -> int:
        return len(self.edges) + len(self.attrs)

    def entities(self) -> set[str]:
        return {n.entity for n in self.nodes}

    def with_node(self, node: Node, edge_from: int, relation: str, parent_is_subject: bool) -> GraphQuestion:
        """A new node hung off `edge_from`."""
        i = len(self.nodes)
        return dataclasses.replace(
            self,
            nodes=(*self.nodes, node),
            edges=(*self.edges, Edge(edge_from, i, relation, parent_is_subject)),
        )

    def with_attr(self, attr: AttrConstraint) -> GraphQuestion:
        return dataclasses.replace(self, attrs=(*self.attrs, attr))

    def replace_attr(self, old: AttrConstraint, new: AttrConstraint | None) -> GraphQuestion:
        attrs = tuple(new if a == old else a for a in self.attrs if a != old or new is not None)
        return dataclasses.replace(self, attrs=attrs)

    def with_named(self, node: int, named: bool) -> GraphQuestion:
        nodes = list(self.nodes)
        nodes[node] = dataclasses.replace(nodes[node], named=named)
        return dataclasses.replace(self, nodes=tuple(nodes))

    # ---- (de)serialisation for the attempts log
    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [[n.entity, n.type, n.named] for n in self.nodes],
            "edges": [[e.parent, e.child, e.relation, e.parent_is_subject] for e in self.edges],
            "attrs": [[a.node, a.name, _value_to_json(a.value), a.label] for a in self.attrs],
            "ask": self.ask,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphQuestion:
        return cls(
            nodes=tuple(Node(*n) for n in d["nodes"]),
            edges=tuple(Edge(*e) for e in d["edges"]),
            attrs=tuple(AttrConstraint(a[0], a[1], _value_from_json(a[2]), a[3]) for a in d["attrs"]),
            ask=d["ask"],
        )


def _value_to_json(v: AttrValue) -> Any:
    if isinstance(v, Range):
        return {"range": [v.low, v.high]}
    if isinstance(v, frozenset):
        return {"any_of": sorted(v)}
    return v


def _value_from_json(v: Any) -> AttrValue:
    if isinstance(v, dict) and "range" in v:
        return Range(*v["range"])
    if isinstance(v, dict) and "any_of" in v:
        return frozenset(v["any_of"])
    return v


# --------------------------------------------------------------------------- exact answers


@dataclass
class Matcher:
    """Candidate entities of each node of one pattern (the node's subtree only), memoised."""

    graph: KnowledgeGraph
    question: GraphQuestion
    _memo: dict[int, frozenset[str]] = field(default_factory=dict)

    def candidates(self, node: int) -> frozenset[str]:
        """Entities that can stand for `node` given its own facts and everything below it.

        A tree pattern is satisfiable with node = x iff x meets the node's local constraints and, for
        each child edge, relates to some candidate of that child: a semi-join per edge, which `find`
        computes when given the child's candidates as the set of acceptable values.
        """
        if node in self._memo:
            return self._memo[node]
        q, n = self.question, self.question.nodes[node]
        if n.named:
            found = frozenset({n.entity})
        else:
            # one find() per group of distinct keys: two children under the same key ("wrote X and
            # wrote Y") must each be satisfied, which a single mapping cannot say
            groups: list[dict[str, Any]] = [{"type": n.type}]
            for a in q.attrs_of(node):
                _put(groups, a.name, a.value)
            for e in q.children(node):
                _put(groups, e.key, set(self.candidates(e.child)))
            found = frozenset.intersection(*(frozenset(self.graph.find(g)) for g in groups))
        self._memo[node] = found
        return found

    def answer_values(self) -> set[str]:
        """Every answer string the pattern allows: names of node 0's candidates, or their asked attribute."""
        q = self.question
        if q.ask == "name":
            return {self.graph.get(x).name for x in self.candidates(0)}
        return {str(v) for x in self.candidates(0) if (v := self.graph.get(x).attrs.get(q.ask)) is not None}


def _put(groups: list[dict[str, Any]], key: str, value: Any) -> None:
    for g in groups:
        if key not in g:
            g[key] = value
            return
    groups.append({"type": groups[0]["type"], key: value})


def intended_answer(graph: KnowledgeGraph, q: GraphQuestion) -> str:
    """The answer the generator meant: node 0's name, or its asked attribute."""
    e = graph.get(q.nodes[0].entity)
    return e.name if q.ask == "name" else str(e.attrs[q.ask])


def answer_variants(graph: KnowledgeGraph, q: GraphQuestion) -> list[str]:
    """Accepted answers, canonical first: a title without "The", "the" + an event's name, "a/an" + occupation."""
    e = graph.get(q.nodes[0].entity)
    out = [intended_answer(graph, q)]
    if q.ask == "name":
        if e.name.startswith("The "):
            out.append(e.name[4:])
        if e.type == "event":
            out.append(mention(e))
    elif q.ask == "occupation":
        out.append(article(out[0]))
    return out


# --------------------------------------------------------------------------- English


_FORWARD: dict[Any, str] = {  # the parent is the subject: "<parent> was born in <child>"
    "born_in": "was born in {x}",
    "employer": "works for {x}",
    "alma_mater": "studied at {x}",
    "spouse": "is married to {x}",
    "country": "lies in {x}",
    "capital": "has {x} as its capital",
    "headquarters": "is based in {x}",
    "founder": "was founded by {x}",
    ("creator", "book"): "was written by {x}",
    ("creator", "film"): "was directed by {x}",
    ("creator", "album"): "was recorded by {x}",
    ("publisher", "book"): "was published by {x}",
    ("publisher", "film"): "was produced by {x}",
    ("publisher", "album"): "was released by {x}",
    "location": "took place in {x}",
    "organiser": "was organised by {x}",
    "winner": "was won by {x}",
}
_INVERSE: dict[Any, str] = {  # the parent is the object: "<parent> is the birthplace of <child>"
    "born_in": "is the birthplace of {x}",
    "employer": "employs {x}",
    "alma_mater": "educated {x}",
    "spouse": "is married to {x}",
    "country": "contains {x}",
    "capital": "is the capital of {x}",
    "headquarters": "is home to {x}",
    "founder": "founded {x}",
    ("creator", "book"): "wrote {x}",
    ("creator", "film"): "directed {x}",
    ("creator", "album"): "recorded {x}",
    ("publisher", "book"): "published {x}",
    ("publisher", "film"): "produced {x}",
    ("publisher", "album"): "released {x}",
    "location": "hosted {x}",
    "organiser": "organised {x}",
    "winner": "won {x}",
}
_ATTR_CLAUSES: dict[Any, str] = {
    "birth_year": "was born {y}",
    "founded": "was founded {y}",
    ("year", "book"): "was published {y}",
    ("year", "film"): "was released {y}",
    ("year", "album"): "was released {y}",
    ("year", "event"): "took place {y}",
    "population": "has {n} inhabitants",
}
_ASK: dict[Any, str] = {
    "birth_year": "In what year was {x} born?",
    "occupation": "What is the occupation of {x}?",
    "founded": "In what year was {x} founded?",
    ("year", "book"): "In what year was {x} published?",
    ("year", "film"): "In what year was {x} released?",
    ("year", "album"): "In what year was {x} released?",
    ("year", "event"): "In what year did {x} take place?",
}
_INDUSTRY_NOUNS = {"publishing": "publishing house", "film": "film studio", "music": "record label"}
_WORK_NOUNS = {"book": "novel", "film": "film", "album": "album"}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def when(value: int | Range) -> str:
    """'in 1983', 'in the 1980s', 'in the 19th century', 'between 1975 and 1985'."""
    if isinstance(value, int):
        return f"in {value}"
    lo, hi = value.low, value.high
    if lo is not None and hi is not None:
        if lo % 10 == 0 and hi == lo + 9:
            return f"in the {lo}s"
        if lo % 100 == 0 and hi == lo + 99:
            return f"in the {ordinal(lo // 100 + 1)} century"
        return f"between {lo} and {hi}"
    if lo is not None:
        return f"in {lo} or later"
    return f"in {hi} or earlier"


def how_many(value: int | Range) -> str:
    if isinstance(value, int):
        return f"about {value:,}"
    lo, hi = value.low, value.high
    if lo is not None and hi is not None:
        return f"between {lo:,} and {hi:,}"
    return f"more than {lo:,}" if lo is not None else f"fewer than {hi:,}"


class Renderer:
    """Turns a pattern into one English question; determiners follow the exact candidate counts."""

    def __init__(self, graph: KnowledgeGraph, question: GraphQuestion, matcher: Matcher | None = None):
        self.g, self.q = graph, question
        self.m = matcher or Matcher(graph, question)

    def question(self) -> str:
        q = self.q
        root = q.nodes[0]
        if q.ask == "name":
            clauses = self._clauses(0)
            head = self._head(0)
            if root.type == "person" and head == "person":
                text = f"Who {join_clauses(clauses)}?"
            else:
                text = f"Which {head} {join_clauses(clauses)}?" if clauses else f"Which {head}?"
        else:
            key = (q.ask, root.type) if (q.ask, root.type) in _ASK else q.ask
            text = _ASK[key].format(x=self.noun_phrase(0, definite=True))
        return text[0].upper() + text[1:]

    def noun_phrase(self, node: int, *, definite: bool = False) -> str:
        """'Tavi Velmo', 'the Velmo Open', 'a chemist who works for X', 'the city that hosted Y'."""
        n = self.q.nodes[node]
        if n.named:
            return mention(self.g.get(n.entity))
        head = self._head(node)
        unique = definite or len(self.m.candidates(node)) == 1
        det = f"the {head}" if unique else article(head)
        clauses = self._clauses(node)
        if not clauses:
            return det
        rel = "who" if n.type == "person" else "that"
        return f"{det} {rel} {join_clauses(clauses)}"

    def _head(self, node: int) -> str:
        n = self.q.nodes[node]
        head_attr = HEAD_ATTRIBUTES.get(n.type)
        a = next((a for a in self.q.attrs_of(node) if a.name == head_attr), None)
        if a is None:
            return TYPE_NOUNS[n.type]
        if isinstance(a.value, frozenset):
            return a.label or TYPE_NOUNS[n.type]
        value = str(a.value)
        if n.type == "company":
            return _INDUSTRY_NOUNS.get(value, f"{value} company")
        if n.type in _WORK_NOUNS:
            return f"{value} {_WORK_NOUNS[n.type]}"
        return value  # occupation, event category

    def _clauses(self, node: int) -> list[str]:
        """Attribute clauses first, then relations ordered by how much they nest (the deepest last).

        Two merges keep the text natural: a birth year joins the birthplace ("was born in Velmo in
        1983", "was born in the 1980s in the city that ..."), and relations with the same verb to named
        entities share it ("wrote X and Y").
        """
        n = self.q.nodes[node]
        edges = sorted(self.q.children(node), key=lambda e: (self.q.depth(e.child), e.child))
        born_in = next((e for e in edges if e.relation == "born_in" and e.parent_is_subject), None)
        out: list[str] = []
        for a in self.q.attrs_of(node):
            if a.name == HEAD_ATTRIBUTES.get(n.type):
                continue
            if a.name == "population":
                out.append(_ATTR_CLAUSES["population"].format(n=how_many(a.value)))  # type: ignore[arg-type]
            elif a.name == "birth_year" and born_in is not None:
                city = self.noun_phrase(born_in.child)
                if self.q.nodes[born_in.child].named:
                    out.append(f"was born in {city} {when(a.value)}")  # type: ignore[arg-type]
                else:  # the year first: a clause after "the city that ..." would attach to the city
                    out.append(f"was born {when(a.value)} in {city}")  # type: ignore[arg-type]
                edges.remove(born_in)
            else:
                key = (a.name, n.type) if (a.name, n.type) in _ATTR_CLAUSES else a.name
                out.append(_ATTR_CLAUSES[key].format(y=when(a.value)))  # type: ignore[arg-type]
        shared: dict[str, list[str]] = {}  # template -> names, for relations to named entities
        order: list[str] = []  # templates and finished clauses, in order
        for e in edges:
            child = self.q.nodes[e.child]
            key = (e.relation, n.type) if e.parent_is_subject else (e.relation, child.type)
            table = _FORWARD if e.parent_is_subject else _INVERSE
            template = table.get(key, table.get(e.relation))
            assert template is not None, f"no phrase for {e}"
            if child.named:
                if template not in shared:
                    shared[template] = []
                    order.append(template)
                shared[template].append(self.noun_phrase(e.child))
            else:
                order.append(template.format(x=self.noun_phrase(e.child)))
        out += [t.format(x=join_names(shared[t])) if t in shared else t for t in order]
        return out


def join_clauses(clauses: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'; with a nested 'and' inside, commas separate the clauses ('a, b, and c')."""
    if len(clauses) <= 1:
        return "".join(clauses)
    nested = any(" and " in c or " who " in c or " that " in c for c in clauses[:-1])
    if nested:
        return ", ".join(clauses[:-1]) + ", and " + clauses[-1]
    return ", ".join(clauses[:-1]) + " and " + clauses[-1]
