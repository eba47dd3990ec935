"""k-hop questions over a world: a random walk along functional relations, phrased in English, graph-checked.

"In which country is the headquarters of the company founded by the spouse of Tavi Velmo?" is the
walk spouse > ~founder:company > headquarters > country from Tavi Velmo. Each step has exactly one
result (functional relations; inverse steps only where the graph has one match of the named type),
so every answer is unique, and each hop cites the page sentence that states its fact.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asearch.corpus.world.graph import RELATIONS, KnowledgeGraph
from asearch.corpus.world.names import form_words
from asearch.corpus.world.render import article, mention
from asearch.corpus.world.source import WorldCorpus
from asearch.errors import DataFormatError
from asearch.files import atomic_write_text, iter_jsonl


@dataclass(frozen=True, slots=True)
class Evidence:
    """One hop's fact: `entity`'s `relation` is `value`, stated by `statement` on the page at `url`."""

    url: str
    entity: str
    relation: str
    value: str
    statement: str


@dataclass(slots=True)
class WorldQuestion:
    """A question with a unique answer and its evidence chain (ordered as the hops are followed)."""

    id: str
    question: str
    answer: str
    answers: list[str]
    hops: int
    evidence: list[Evidence]
    template: str  # the relation path, e.g. "spouse>~founder:company>headquarters>country"
    subject: str = ""  # the entity the question names
    path: list[str] = field(default_factory=list)  # the same steps as a list
    world: str = ""  # the corpus name (world:seed=...,entities=...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_asearcher(self) -> dict[str, Any]:
        """ASearcher's eval/training line: `answer` is the list of acceptable answers, canonical first."""
        d = self.to_dict()
        d["answer"] = list(self.answers)
        d.pop("answers")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: tuple[str | Path, int] | None = None) -> WorldQuestion:
        """Read either shape (`to_dict` or `to_asearcher`); a missing field raises DataFormatError at `where`."""
        path, line = where if where else ("<dict>", None)
        try:
            answers = d["answers"] if "answers" in d else d["answer"]
            if isinstance(answers, str):
                answers = [answers]
            answer = d["answer"] if isinstance(d.get("answer"), str) else answers[0]
            return cls(
                id=str(d["id"]),
                question=str(d["question"]),
                answer=answer,
                answers=list(answers),
                hops=int(d["hops"]),
                evidence=[Evidence(**e) for e in d["evidence"]],
                template=str(d.get("template", "")),
                subject=str(d.get("subject", "")),
                path=list(d.get("path", [])),
                world=str(d.get("world", "")),
            )
        except KeyError as e:
            raise DataFormatError(path, line, str(e.args[0]), "missing field") from None
        except (TypeError, IndexError, ValueError) as e:
            raise DataFormatError(path, line, None, f"not a world question ({e})") from None


# --------------------------------------------------------------------------- steps
# Inverse steps that can single out an entity: "the company founded by X", "the book written by X",
# "the country whose capital is X", "the marathon won by X". They are typed by their result
# ("~creator:book"), and taken only when exactly one entity of that type matches.
INVERSE_RELATIONS = ("founder", "creator", "capital", "winner")
# Attributes a question may ask for (its answer), per type of the entity asked about.
FINAL_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "person": ("birth_year", "occupation"),
    "city": ("founded",),
    "company": ("founded",),
    "university": ("founded",),
    "book": ("year",),
    "film": ("year",),
    "album": ("year",),
    "event": ("year",),
}

# Phrase tables: key -> templates, or (key, type) -> templates where wording depends on the subject's
# type. {x} is the inner phrase, {rt} the result's type noun, {cat} an event's category.
_NP: dict[Any, tuple[str, ...]] = {
    "born_in": ("the birthplace of {x}",),
    "employer": ("the employer of {x}",),
    "alma_mater": ("the alma mater of {x}",),
    "spouse": ("the spouse of {x}",),
    "country": ("the country where {x} is located",),
    "capital": ("the capital of {x}",),
    "headquarters": ("the headquarters of {x}", "the home city of {x}"),
    "founder": ("the founder of {x}",),
    ("creator", "book"): ("the author of {x}", "the writer of {x}"),
    ("creator", "film"): ("the director of {x}",),
    ("creator", "album"): ("the artist who recorded {x}",),
    ("publisher", "book"): ("the publisher of {x}",),
    ("publisher", "film"): ("the studio that produced {x}",),
    ("publisher", "album"): ("the label that released {x}",),
    "location": ("the host city of {x}",),
    "organiser": ("the organiser of {x}",),
    "winner": ("the winner of {x}",),
    "~founder": ("the {rt} founded by {x}",),
    "~creator:book": ("the book written by {x}",),
    "~creator:film": ("the film directed by {x}",),
    "~creator:album": ("the album recorded by {x}",),
    "~capital": ("the country whose capital is {x}",),
    "~winner": ("the {cat} won by {x}",),
    ("born_in", "country"): ("the country where {x} was born",),
    ("headquarters", "country"): ("the country where {x} is headquartered",),
    ("location", "country"): ("the country where {x} was held",),
}
# Relative clauses read well around a name ("the city where Tavi Velmo was born") but not around a
# nested phrase ("the university the director of X attended"), so they are offered for names only.
_NP_AROUND_NAME: dict[Any, tuple[str, ...]] = {
    "born_in": ("the city where {x} was born",),
    "employer": ("the {rt} that {x} works for",),
    "alma_mater": ("the university {x} attended",),
    "spouse": ("the person married to {x}",),
    "country": ("the country that {x} is in",),
    "headquarters": ("the city where {x} is based",),
    "founder": ("the person who founded {x}",),
    "location": ("the city where {x} was held",),
}
_QUESTION: dict[Any, tuple[str, ...]] = {
    "born_in": ("Where was {x} born?", "In which city was {x} born?"),
    "birth_year": ("In what year was {x} born?", "When was {x} born?"),
    "occupation": ("What is the occupation of {x}?", "What does {x} do for a living?"),
    "employer": ("Who does {x} work for?", "Which organisation employs {x}?", "Where does {x} work?"),
    "alma_mater": ("Which university did {x} attend?", "Where did {x} study?"),
    "spouse": ("Who is {x} married to?", "Who is the spouse of {x}?"),
    "country": ("In which country is {x}?",),
    "capital": ("What is the capital of {x}?", "Which city is the capital of {x}?"),
    "headquarters": ("Where is {x} headquartered?", "In which city is {x} based?"),
    "founder": ("Who founded {x}?", "Who is the founder of {x}?"),
    "founded": ("In what year was {x} founded?", "When was {x} founded?"),
    ("creator", "book"): ("Who wrote {x}?", "Who is the author of {x}?"),
    ("creator", "film"): ("Who directed {x}?",),
    ("creator", "album"): ("Who recorded {x}?", "Which artist recorded {x}?"),
    ("publisher", "book"): ("Who published {x}?", "Which company published {x}?"),
    ("publisher", "film"): ("Which studio produced {x}?",),
    ("publisher", "album"): ("Which label released {x}?",),
    ("year", "book"): ("In what year was {x} published?", "When was {x} published?"),
    ("year", "film"): ("In what year was {x} released?", "When was {x} released?"),
    ("year", "album"): ("In what year was {x} released?", "When was {x} released?"),
    ("year", "event"): ("In what year was {x} held?", "When did {x} take place?"),
    "location": ("Where was {x} held?", "In which city did {x} take place?"),
    "organiser": ("Who organised {x}?", "Which organisation organised {x}?"),
    "winner": ("Who won {x}?",),
    "~founder": ("Which {rt} did {x} found?",),
    "~creator:book": ("Which book did {x} write?",),
    "~creator:film": ("Which film did {x} direct?",),
    "~creator:album": ("Which album did {x} record?",),
    "~capital": ("Which country has {x} as its capital?",),
    "~winner": ("Which {cat} did {x} win?",),
    ("born_in", "country"): ("In which country was {x} born?",),
    ("headquarters", "country"): ("In which country is {x} headquartered?",),
    ("location", "country"): ("In which country was {x} held?",),
}
CANDIDATES_PER_QUESTION = 4
PHRASINGS = ("natural", "keys")


def statement_key(statement: str, value: str | int) -> str:
    """The key of a facts or long page's `key value` statement (`alma mater` of `alma mater Lesarn Institute`)."""
    return statement[: -len(str(value))].strip()
# People are most of the world and the heart of the search task; other start types weigh 1.
START_WEIGHTS = {"person": 3.0}

# Questions whose words wrap around {x}: fine around a name, hard to parse around a long phrase.
_QUESTION_AROUND_NAME: dict[Any, tuple[str, ...]] = {
    "country": ("Which country is {x} in?",),
    "~capital": ("Of which country is {x} the capital?",),
}
_MERGEABLE = {("born_in", "country"), ("headquarters", "country"), ("location", "country")}


@dataclass(frozen=True, slots=True)
class _Hop:
    key: str  # path step: "born_in", "~founder:company", "birth_year"
    subject: str  # entity id the step starts from
    value: str | int  # entity id reached, or an attribute value

    @property
    def relation(self) -> str:
        return self.key.removeprefix("~").split(":")[0]

    @property
    def inverse(self) -> bool:
        return self.key.startswith("~")


def step_options(graph: KnowledgeGraph, entity_id: str, final: bool) -> list[_Hop]:
    """Every step from `entity_id` with exactly one result (attribute steps only when `final`)."""
    e = graph.get(entity_id)
    out: list[_Hop] = []
    for r, spec in RELATIONS.items():
        if e.type in spec.subject_types:
            objs = graph.objects(entity_id, r)
            if len(objs) == 1:
                out.append(_Hop(r, entity_id, objs[0]))
    for r in INVERSE_RELATIONS:
        if e.type in RELATIONS[r].object_types:
            by_type: dict[str, list[str]] = {}
            for s in graph.subjects(r, entity_id):
                by_type.setdefault(graph.get(s).type, []).append(s)
            out += [_Hop(f"~{r}:{t}", entity_id, ids[0]) for t, ids in by_type.items() if len(ids) == 1]
    if final:
        for a in FINAL_ATTRIBUTES.get(e.type, ()):
            if (value := e.attrs.get(a)) is not None:
                out.append(_Hop(a, entity_id, value))
    return out


def follow_path(graph: KnowledgeGraph, start: str, path: Sequence[str]) -> list[str | int]:
    """All values reached from `start` along `path` keys, with typed inverse steps ("~creator:book")."""
    frontier: list[str | int] = [graph.resolve(start)]
    for key in path:
        nxt: dict[str | int, None] = {}
        for x in frontier:
            assert isinstance(x, str), f"path {path} continues past an attribute"
            if key.startswith("~"):
                relation, _, type_ = key[1:].partition(":")
                nxt.update(
                    dict.fromkeys(s for s in graph.subjects(relation, x) if graph.get(s).type == type_)
                )
            elif key in RELATIONS:
                nxt.update(dict.fromkeys(graph.objects(x, key)))
            elif (value := graph.get(x).attrs.get(key)) is not None:
                nxt[value] = None
        frontier = list(nxt)
    return frontier


# --------------------------------------------------------------------------- generation
def generate_questions(
    world: WorldCorpus,
    n: int,
    hops: Iterable[int] = (1, 2, 3),
    seed: int = 0,
    *,
    forward_only: bool = False,
    entity_answers: bool = False,
    phrasing: str = "natural",
) -> list[WorldQuestion]:
    """`n` questions split evenly over `hops` (earlier hop counts take the remainder), shuffled.

    `forward_only`: no inverse step (every hop reads a fact off the page of the entity it starts from);
    `entity_answers`: the answer is an entity (a name), not an attribute value such as a year. Walks that
    fail these are redrawn, so asking for them costs no more than asking for any question.
    `phrasing`: "natural" (several wordings per relation, step pairs merged into idioms such as "the country
    where X was born") or "keys" (every forward step worded with the key its page states the fact under:
    "What is the capital of the country of the birthplace of X?", for agents that look the key up on a page;
    pages=facts or long only, whose lines are `key value`).
    Raises ValueError when the world is too small to yield that many distinct questions.
    """
    if phrasing not in PHRASINGS:
        raise ValueError(f"phrasing must be one of {', '.join(PHRASINGS)}, got {phrasing!r}")
    if phrasing == "keys" and world.page_style == "prose":
        raise ValueError("phrasing 'keys' words questions with the keys of `key value` pages: use pages=facts or long")
    hop_counts = sorted(set(hops))
    if n < 0 or not hop_counts or any(h < 1 for h in hop_counts):
        raise ValueError(f"need n >= 0 and hop counts >= 1, got n={n}, hops={hop_counts}")
    rng = random.Random(f"asearch-world-questions/{world.seed}/{seed}")
    maker = _QuestionMaker(world, rng, forward_only=forward_only, entity_answers=entity_answers, phrasing=phrasing)
    made: list[WorldQuestion] = []
    for i, k in enumerate(hop_counts):
        want = n // len(hop_counts) + (1 if i < n % len(hop_counts) else 0)
        got = maker.make(k, want)
        if len(got) < want:
            raise ValueError(
                f"{world.name}: only {len(got)} distinct {k}-hop questions found for {want} wanted; "
                "use a bigger world or fewer questions"
            )
        made += got
    rng.shuffle(made)
    for i, q in enumerate(made):
        q.id = f"world{world.seed}-q{seed}-{i:05d}"
    return made


class _QuestionMaker:
    def __init__(
        self, world: WorldCorpus, rng: random.Random, *, forward_only: bool = False, entity_answers: bool = False,
        phrasing: str = "natural",
    ):  # fmt: skip
        self.world, self.graph, self.rng = world, world.graph, rng
        self.forward_only, self.entity_answers, self.phrasing = forward_only, entity_answers, phrasing
        self.seen: set[tuple[str, tuple[str, ...]]] = set()  # (subject name, path) already asked
        self.final_counts: Counter[tuple[str, str]] = Counter()
        self.start_types = [t for t in (*FINAL_ATTRIBUTES, "country") if self.graph.entities(t)]
        self.start_weights = [START_WEIGHTS.get(t, 1.0) for t in self.start_types]
        self.stop_words = {w.lower() for w in form_words()} | {"the", "of", "a", "in", "to"}

    def make(self, hops: int, want: int) -> list[WorldQuestion]:
        """Up to `want` new questions; each is the least-used final relation among a few valid walks.

        Picking the rarest of several candidates flattens the mix: without it, "when was X founded"
        questions (reachable from every city and organisation) would crowd out the rest.
        """
        out: list[WorldQuestion] = []
        misses = 0
        # a miss: a dead end, a repeat or a give-away; 3000 in a row means the world is exhausted
        while len(out) < want and misses < 3000:
            candidates = [q for q in (self._candidate(hops) for _ in range(CANDIDATES_PER_QUESTION)) if q]
            if not candidates:
                misses += 1
                continue
            misses = 0
            question = min(candidates, key=lambda q: self.final_counts[self._final_kind(q)])
            self.final_counts[self._final_kind(question)] += 1
            self.seen.add((question.subject, tuple(question.path)))
            out.append(question)
        return out

    def _candidate(self, hops: int) -> WorldQuestion | None:
        start_type = self.rng.choices(self.start_types, weights=self.start_weights)[0]
        start = self.rng.choice(self.graph.entities(start_type)).id
        chain = self._walk(start, hops)
        if chain is None or (self.graph.get(start).name, tuple(h.key for h in chain)) in self.seen:
            return None
        if self.forward_only and any(h.key.startswith("~") for h in chain):
            return None
        if self.entity_answers and chain[-1].key not in RELATIONS:
            return None
        return self._question(start, chain)

    def _final_kind(self, q: WorldQuestion) -> tuple[str, str]:
        """The last relation and the type it starts from ('founded' of a city differs from an org's)."""
        return q.path[-1], self.world.entity_by_url(q.evidence[-1].url).type

    def _walk(self, start: str, hops: int) -> list[_Hop] | None:
        chain: list[_Hop] = []
        visited = {start}
        x = start
        for i in range(hops):
            final = i == hops - 1
            options = [h for h in step_options(self.graph, x, final) if h.value not in visited]  # no cycles
            if not options:
                return None
            hop = self.rng.choice(options)  # one option per relation: relations are equally likely
            chain.append(hop)
            if final:
                break
            assert isinstance(hop.value, str)
            visited.add(hop.value)
            x = hop.value
        return chain

    def _question(self, start: str, chain: list[_Hop]) -> WorldQuestion | None:
        g, rng = self.graph, self.rng
        final = chain[-1]
        if (
            final.key == "occupation"
            and len(chain) > 1
            and chain[-2].key in ("creator", "~winner:event", "winner")
        ):
            return None  # "what does the director of X do?" answers itself
        is_entity = final.key not in FINAL_ATTRIBUTES.get(g.get(final.subject).type, ())
        answer_entity = g.get(str(final.value)) if is_entity else None
        answer = answer_entity.name if answer_entity else str(final.value)
        # phrase units: single steps, or a step pair merged into one idiom ("born in which country")
        units: list[tuple[int, int]] = []
        i = 0
        while i < len(chain):
            pair = (chain[i].key, chain[i + 1].key) if i + 1 < len(chain) else None
            if self.phrasing == "natural" and pair in _MERGEABLE and rng.random() < 0.5:
                units.append((i, 2))
                i += 2
            else:
                units.append((i, 1))
                i += 1
        phrase = mention(g.get(start))
        for j, (i, width) in enumerate(units):
            if j == len(units) - 1:
                templates = self._templates(_QUESTION, chain[i : i + width])
                if j == 0:
                    templates += self._templates(_QUESTION_AROUND_NAME, chain[i : i + width])
            else:
                templates = self._templates(_NP, chain[i : i + width])
                if j == 0:
                    templates += self._templates(_NP_AROUND_NAME, chain[i : i + width])
                # "when was the headquarters of X founded" would read as the organisation's founding
                if chain[i + width].key == "founded":
                    templates = [t for t in templates if not t.startswith("the headquarters")]
            if self.phrasing == "keys" and not chain[i].inverse:
                key = self._page_key(chain[i])
                templates = [f"What is the {key} of {{x}}?" if j == len(units) - 1 else f"the {key} of {{x}}"]
            phrase = self._fill(self.rng.choice(templates), chain[i + width - 1], phrase)
        text = phrase[0].upper() + phrase[1:]
        if self._leaks(answer, text):
            return None
        path = [h.key for h in chain]
        answers = [answer]
        if answer_entity is not None and answer_entity.name.startswith("The "):
            answers.append(answer_entity.name[4:])
        if answer_entity is not None and answer_entity.type == "event":
            answers.append(mention(answer_entity))
        if final.key == "occupation":
            answers.append(article(answer))
        return WorldQuestion(
            id="",
            question=text,
            answer=answer,
            answers=answers,
            hops=len(chain),
            evidence=[self._evidence(h) for h in chain],
            template=">".join(path),
            subject=g.get(start).name,
            path=path,
            world=self.world.name,
        )

    def _templates(self, table: dict[Any, tuple[str, ...]], hops: list[_Hop]) -> list[str]:
        """The table's templates for this step (or merged step pair); wording may depend on the subject's type."""
        subject_type = self.graph.get(hops[0].subject).type
        key = hops[-1].key
        if len(hops) == 2:
            return list(table.get((hops[0].key, key), ()))
        if key.startswith(("~founder", "~capital", "~winner")):
            key = key.split(":")[0]
        return list(table.get((key, subject_type), table.get(key, ())))

    def _page_key(self, hop: _Hop) -> str:
        """The key a page states this forward step's fact under (`birthplace` for born_in)."""
        evidence = self._evidence(hop)
        return statement_key(evidence.statement, evidence.value)

    def _fill(self, template: str, hop: _Hop, inner: str) -> str:
        result = self.graph.get(hop.value) if isinstance(hop.value, str) and hop.value in self.graph else None
        return template.format(
            x=inner,
            rt=result.type if result else "",
            cat=result.attrs.get("category", "event") if result else "",
        )

    def _leaks(self, answer: str, question: str) -> bool:
        """True when a distinctive word of the answer is in the question (a shared root gives it away)."""
        words = set(re.findall(r"[a-z0-9]+", question.lower()))
        return any(w in words for w in re.findall(r"[a-z0-9]+", answer.lower()) if w not in self.stop_words)

    def _evidence(self, hop: _Hop) -> Evidence:
        g, w = self.graph, self.world
        if hop.inverse:  # "the company founded by X": the company's page states its founder
            fact_subject, value = str(hop.value), g.get(hop.subject).name
        else:
            fact_subject = hop.subject
            value = (
                g.get(hop.value).name
                if isinstance(hop.value, str) and hop.key in RELATIONS
                else str(hop.value)
            )
        return Evidence(
            url=w.url(fact_subject),
            entity=g.get(fact_subject).name,
            relation=hop.relation,
            value=value,
            statement=w.statement(fact_subject, hop.relation),
        )


# --------------------------------------------------------------------------- files
def write_questions_jsonl(path: str | Path, questions: Iterable[WorldQuestion]) -> int:
    """Write questions atomically, one ASearcher-shaped JSON object per line; returns the count."""
    lines = [json.dumps(q.to_asearcher(), ensure_ascii=False) for q in questions]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_questions_jsonl(path: str | Path) -> list[WorldQuestion]:
    """Read a file written by `write_questions_jsonl` (or `to_dict` lines); bad lines name file and line."""
    return [WorldQuestion.from_dict(obj, (path, line)) for line, obj in iter_jsonl(path)]
