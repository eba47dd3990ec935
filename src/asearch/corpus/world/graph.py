"""The world's knowledge graph: typed entities, attributes and relations, with lookups and constraint queries.

`find({"type": "person", "born_in.country": "Orvania", "birth_year": Range(1920, 1929)})` returns
every matching entity id, so a QA pipeline can check that a question's constraints single out its
answer (`count_matching(...) == 1`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- schema

ENTITY_TYPES = ("country", "city", "person", "company", "university", "book", "film", "album", "event")
TYPE_GROUPS: dict[str, tuple[str, ...]] = {
    "org": ("company", "university"),
    "work": ("book", "film", "album"),
}


@dataclass(frozen=True, slots=True)
class RelationSpec:
    """A relation between entities: allowed subject/object types; functional = at most one object per subject."""

    subject_types: tuple[str, ...]
    object_types: tuple[str, ...]
    functional: bool = True
    symmetric: bool = False


@dataclass(frozen=True, slots=True)
class AttributeSpec:
    """A literal-valued property of some entity types."""

    types: tuple[str, ...]
    kind: type  # int or str


ORG, WORK = TYPE_GROUPS["org"], TYPE_GROUPS["work"]
RELATIONS: dict[str, RelationSpec] = {
    "born_in": RelationSpec(("person",), ("city",)),
    "employer": RelationSpec(("person",), ORG),
    "alma_mater": RelationSpec(("person",), ("university",)),
    "spouse": RelationSpec(("person",), ("person",), symmetric=True),
    "country": RelationSpec(("city",), ("country",)),
    "capital": RelationSpec(("country",), ("city",)),
    "headquarters": RelationSpec(ORG, ("city",)),
    "founder": RelationSpec(ORG, ("person",)),
    "creator": RelationSpec(WORK, ("person",)),
    "publisher": RelationSpec(WORK, ("company",)),
    "location": RelationSpec(("event",), ("city",)),
    "organiser": RelationSpec(("event",), ORG),
    "winner": RelationSpec(("event",), ("person",)),
}
ATTRIBUTES: dict[str, AttributeSpec] = {
    "gender": AttributeSpec(("person",), str),
    "birth_year": AttributeSpec(("person",), int),
    "occupation": AttributeSpec(("person",), str),
    "founded": AttributeSpec(("city", "company", "university"), int),
    "population": AttributeSpec(("city",), int),
    "industry": AttributeSpec(("company",), str),
    "year": AttributeSpec((*WORK, "event"), int),
    "genre": AttributeSpec(WORK, str),
    "category": AttributeSpec(("event",), str),
}


def expand_types(type_or_group: str) -> tuple[str, ...]:
    """'org' -> ('company', 'university'); 'city' -> ('city',); anything else is an error."""
    if type_or_group in TYPE_GROUPS:
        return TYPE_GROUPS[type_or_group]
    if type_or_group in ENTITY_TYPES:
        return (type_or_group,)
    raise ValueError(
        f"unknown entity type {type_or_group!r}; valid: {', '.join([*ENTITY_TYPES, *TYPE_GROUPS])}"
    )


# --------------------------------------------------------------------------- records and constraint values


@dataclass(frozen=True, slots=True)
class Entity:
    """One node: a stable id (the url slug), its type, unique display name and literal attributes."""

    id: str
    type: str
    name: str
    attrs: Mapping[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Range:
    """An inclusive numeric range for fuzzy constraints; either end may be open (None)."""

    low: int | None = None
    high: int | None = None

    def __post_init__(self) -> None:
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Range low must be <= high, got low={self.low}, high={self.high}")

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    @classmethod
    def decade(cls, start: int) -> Range:
        """`Range.decade(1920)` = 1920..1929 ("in the 1920s")."""
        if start % 10:
            raise ValueError(f"a decade starts at a multiple of 10, got {start}")
        return cls(start, start + 9)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a constraint path: a relation (forward or `~inverse`) or a final attribute."""

    name: str
    inverse: bool = False

    @property
    def is_attribute(self) -> bool:
        return self.name in ATTRIBUTES

    def __str__(self) -> str:
        return ("~" if self.inverse else "") + self.name


def parse_path(key: str) -> tuple[Step, ...]:
    """'employer.headquarters' -> (Step('employer'), Step('headquarters')); '~founder' is the inverse of founder."""
    steps: list[Step] = []
    parts = key.split(".")
    for i, part in enumerate(parts):
        inverse = part.startswith("~")
        name = part.removeprefix("~")
        if name in ATTRIBUTES:
            if inverse or i != len(parts) - 1:
                raise ValueError(
                    f"constraint {key!r}: attribute {name!r} can only be the last step, and not inverted"
                )
        elif name not in RELATIONS:
            valid = ", ".join([*RELATIONS, *ATTRIBUTES])
            raise ValueError(f"constraint {key!r}: unknown relation or attribute {name!r}; valid: {valid}")
        steps.append(Step(name, inverse))
    return tuple(steps)


# --------------------------------------------------------------------------- the graph


class KnowledgeGraph:
    """Entities plus (subject, relation, object) triples, indexed both ways; validated on construction.

    Relation values are entity ids. Queries take entity ids or names wherever an entity is meant.
    Iteration orders follow insertion order, so every answer is deterministic.
    """

    def __init__(self, entities: Iterable[Entity], triples: Iterable[tuple[str, str, str]]):
        self._entities: dict[str, Entity] = {}
        self._by_name: dict[str, str] = {}
        self._by_type: dict[str, list[str]] = defaultdict(list)
        problems: list[str] = []
        for e in entities:
            if e.id in self._entities:
                problems.append(f"duplicate entity id {e.id!r}")
                continue
            if e.name in self._by_name:
                problems.append(f"duplicate entity name {e.name!r} ({self._by_name[e.name]!r} and {e.id!r})")
            problems += _attribute_problems(e)
            self._entities[e.id] = e
            self._by_name[e.name] = e.id
            self._by_type[e.type].append(e.id)
        self._forward: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._reverse: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._triples: list[tuple[str, str, str]] = []
        for s, r, o in triples:
            problems += self._triple_problems(s, r, o)
            if (s, r) in self._forward and o in self._forward[(s, r)]:
                continue  # a duplicate triple adds nothing
            self._forward[(s, r)].append(o)
            self._reverse[(r, o)].append(s)
            self._triples.append((s, r, o))
        problems += self._structure_problems()
        if problems:
            more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
            raise ValueError("inconsistent knowledge graph: " + "; ".join(problems[:10]) + more)
        self._attr_index: dict[tuple[str, int | str], list[str]] | None = None

    # ---- validation
    def _triple_problems(self, s: str, r: str, o: str) -> list[str]:
        spec = RELATIONS.get(r)
        if spec is None:
            return [f"unknown relation {r!r} in ({s}, {r}, {o})"]
        problems = [f"({s}, {r}, {o}): {x!r} is not an entity" for x in (s, o) if x not in self._entities]
        if problems:
            return problems
        if self._entities[s].type not in spec.subject_types:
            problems.append(
                f"({s}, {r}, {o}): subject type {self._entities[s].type} not in {spec.subject_types}"
            )
        if self._entities[o].type not in spec.object_types:
            problems.append(
                f"({s}, {r}, {o}): object type {self._entities[o].type} not in {spec.object_types}"
            )
        if s == o:
            problems.append(f"({s}, {r}, {o}): an entity cannot relate to itself")
        return problems

    def _structure_problems(self) -> list[str]:
        problems: list[str] = []
        for (s, r), objs in self._forward.items():
            spec = RELATIONS[r]
            if spec.functional and len(objs) > 1:
                problems.append(f"{s!r} has {len(objs)} values for functional relation {r!r}: {objs}")
            if spec.symmetric:
                problems += [
                    f"({s}, {r}, {o}) lacks its mirror ({o}, {r}, {s})"
                    for o in objs
                    if s not in self._forward.get((o, r), ())
                ]
        # domain rule: a country's capital lies in that country
        for (country, r), cities in self._forward.items():
            if r == "capital":
                for city in cities:
                    if self._forward.get((city, "country")) != [country]:
                        problems.append(f"capital {city!r} of {country!r} is not located in {country!r}")
        return problems

    # ---- lookups
    def __len__(self) -> int:
        return len(self._entities)

    def __contains__(self, entity_id: object) -> bool:
        return entity_id in self._entities

    def entities(self, type: str | None = None) -> list[Entity]:
        """All entities, or those of one type or group ('org', 'work'), in insertion order."""
        if type is None:
            return list(self._entities.values())
        return [self._entities[i] for t in expand_types(type) for i in self._by_type.get(t, ())]

    def get(self, ref: str | Entity) -> Entity:
        """The entity with this id or (failing that) this name."""
        return self._entities[self.resolve(ref)]

    def resolve(self, ref: str | Entity) -> str:
        """Entity id for an id, a name or an Entity; KeyError naming the reference when there is none."""
        if isinstance(ref, Entity):
            ref = ref.id
        if ref in self._entities:
            return ref
        if ref in self._by_name:
            return self._by_name[ref]
        raise KeyError(f"no entity with id or name {ref!r}")

    def by_name(self, name: str) -> Entity | None:
        entity_id = self._by_name.get(name)
        return None if entity_id is None else self._entities[entity_id]

    def objects(self, subject: str | Entity, relation: str) -> list[str]:
        """Ids x with (subject, relation, x)."""
        _check_relation(relation)
        return list(self._forward.get((self.resolve(subject), relation), ()))

    def subjects(self, relation: str, obj: str | Entity) -> list[str]:
        """Ids x with (x, relation, obj)."""
        _check_relation(relation)
        return list(self._reverse.get((relation, self.resolve(obj)), ()))

    def one(self, subject: str | Entity, relation: str) -> str | None:
        """The object of a functional relation, or None."""
        objs = self.objects(subject, relation)
        return objs[0] if objs else None

    def attr(self, entity: str | Entity, name: str) -> int | str | None:
        if name not in ATTRIBUTES:
            raise ValueError(f"unknown attribute {name!r}; valid: {', '.join(ATTRIBUTES)}")
        return self.get(entity).attrs.get(name)

    def triples(self, relation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """(subject, relation, object) in insertion order, optionally for one relation."""
        if relation is not None:
            _check_relation(relation)
        return (t for t in self._triples if relation is None or t[1] == relation)

    def facts(self, entity: str | Entity) -> list[tuple[str, int | str]]:
        """(attribute or relation, value) for everything stated about `entity` as subject."""
        e = self.get(entity)
        out: list[tuple[str, int | str]] = list(e.attrs.items())
        out += [(r, o) for r in RELATIONS for o in self._forward.get((e.id, r), ())]
        return out

    def follow(self, entity: str | Entity, path: str | Iterable[Step]) -> list[int | str]:
        """Values reached from `entity` along a path ('spouse.employer.founded'): ids, or attribute values at the end."""
        steps = parse_path(path) if isinstance(path, str) else tuple(path)
        frontier: list[Any] = [self.resolve(entity)]
        for step in steps:
            nxt: dict[Any, None] = {}  # an ordered set
            for x in frontier:
                if step.is_attribute:
                    value = self._entities[x].attrs.get(step.name)
                    got = [] if value is None else [value]
                elif step.inverse:
                    got = self._reverse.get((step.name, x), [])
                else:
                    got = self._forward.get((x, step.name), [])
                nxt.update(dict.fromkeys(got))
            frontier = list(nxt)
        return frontier

    # ---- constraint queries
    def find(self, constraints: Mapping[str, Any]) -> list[str]:
        """Ids of every entity satisfying all constraints (a conjunction), in insertion order.

        Keys: 'type' (a type, group or collection of them), an attribute ('birth_year'), a relation
        ('born_in'), or a dotted path through relations ('employer.headquarters.country',
        '~founder.industry' = "founded an org whose industry is ..."). A path matches when any value it
        reaches matches. Values: an entity id or name (for relation paths), a literal (for attribute
        paths), a `Range` (numeric, inclusive), or a set/list/tuple meaning "any of these".
        """
        candidates: set[str] | None = None
        checks: list[tuple[tuple[Step, ...], Any]] = []
        for key, value in constraints.items():
            if key == "type":
                types = [value] if isinstance(value, str) else list(value)
                ids = {e.id for t in types for e in self.entities(t)}
            else:
                steps = parse_path(key)
                wanted = self._normalise_value(key, steps, value)
                if isinstance(wanted, Range):
                    checks.append((steps, wanted))
                    continue
                ids = self._backward(steps, wanted)
            candidates = ids if candidates is None else candidates & ids
        pool = self._entities if candidates is None else candidates
        return [i for i in self._entities if i in pool and all(self._reaches(i, s, r) for s, r in checks)]

    def count_matching(self, constraints: Mapping[str, Any]) -> int:
        """How many entities satisfy the constraints; 1 means they single out an entity."""
        return len(self.find(constraints))

    def unique_match(self, constraints: Mapping[str, Any]) -> str | None:
        """The one entity id satisfying the constraints, or None if zero or several do."""
        found = self.find(constraints)
        return found[0] if len(found) == 1 else None

    def _normalise_value(self, key: str, steps: tuple[Step, ...], value: Any) -> Range | set[Any]:
        """Range stays a Range; everything else becomes the set of acceptable values (entity refs resolved)."""
        if isinstance(value, Range):
            if not steps[-1].is_attribute:
                raise ValueError(f"constraint {key!r}: a Range needs a path ending in an attribute")
            return value
        values = list(value) if isinstance(value, set | frozenset | list | tuple) else [value]
        if steps[-1].is_attribute:
            return set(values)
        out: set[Any] = set()
        for v in values:
            try:
                out.add(self.resolve(v))
            except KeyError:
                raise ValueError(f"constraint {key!r}: no entity with id or name {v!r}") from None
        return out

    def _backward(self, steps: tuple[Step, ...], wanted: set[Any]) -> set[str]:
        """Entities from which `steps` reach a value in `wanted`, walking the indexes from the end."""
        frontier = set(wanted)
        for step in reversed(steps):
            if step.is_attribute:
                index = self._attribute_index()
                frontier = {i for v in frontier for i in index.get((step.name, v), ())}
            elif step.inverse:  # x ~r y  <=>  (y, r, x): from y, x is an object
                frontier = {x for y in frontier for x in self._forward.get((y, step.name), ())}
            else:
                frontier = {x for y in frontier for x in self._reverse.get((step.name, y), ())}
        return frontier

    def _reaches(self, entity_id: str, steps: tuple[Step, ...], wanted: Range) -> bool:
        return any(v in wanted for v in self.follow(entity_id, steps))

    def _attribute_index(self) -> dict[tuple[str, int | str], list[str]]:
        if self._attr_index is None:
            index: dict[tuple[str, int | str], list[str]] = defaultdict(list)
            for e in self._entities.values():
                for k, v in e.attrs.items():
                    index[(k, v)].append(e.id)
            self._attr_index = dict(index)
        return self._attr_index


def _check_relation(relation: str) -> None:
    if relation not in RELATIONS:
        raise ValueError(f"unknown relation {relation!r}; valid: {', '.join(RELATIONS)}")


def _attribute_problems(e: Entity) -> list[str]:
    problems = []
    if e.type not in ENTITY_TYPES:
        problems.append(f"entity {e.id!r} has unknown type {e.type!r}")
    for k, v in e.attrs.items():
        spec = ATTRIBUTES.get(k)
        if spec is None:
            problems.append(f"entity {e.id!r} has unknown attribute {k!r}")
        elif e.type not in spec.types:
            problems.append(f"entity {e.id!r} ({e.type}) cannot have attribute {k!r}")
        elif not isinstance(v, spec.kind) or isinstance(v, bool):
            problems.append(f"entity {e.id!r}: attribute {k!r} must be {spec.kind.__name__}, got {v!r}")
    return problems
