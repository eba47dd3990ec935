"""Render each entity of a world as a short encyclopedia page, remembering which sentence states which fact.

Sentences come from several templates per fact, picked by a seeded rng. Each page records, for every
attribute and relation of its entity, the exact sentence that states it (the evidence a question cites),
and the entities it mentions (its links). Pages also mention related entities (a city lists people
born there), so keyword search returns near-miss passages as well as the right one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from asearch.corpus.world.graph import Entity, KnowledgeGraph


@dataclass(frozen=True, slots=True)
class RenderedPage:
    """One entity's page: its text, the ids it mentions, and relation/attribute -> the sentence stating it."""

    entity_id: str
    title: str
    text: str
    links: tuple[str, ...]
    statements: Mapping[str, str]
    snippet: str | None = None  # what search shows and indexes, when not the whole text ("long" pages)


@dataclass(slots=True)
class _PageBuilder:
    entity: Entity
    sentences: list[str] = field(default_factory=list)
    statements: dict[str, str] = field(default_factory=dict)
    mentions: dict[str, None] = field(default_factory=dict)  # ordered set of linked ids

    def say(self, sentence: str, facts: Sequence[str] = (), mentions: Sequence[str] = ()) -> None:
        self.sentences.append(sentence)
        for fact in facts:
            self.statements.setdefault(fact, sentence)
        for m in mentions:
            if m != self.entity.id:
                self.mentions.setdefault(m)

    def build(self) -> RenderedPage:
        return RenderedPage(
            self.entity.id, self.entity.name, " ".join(self.sentences), tuple(self.mentions), self.statements
        )


def article(noun_phrase: str) -> str:
    """'an engineer', 'a painter', 'a university' (a vowel letter with a 'y' sound takes 'a')."""
    vowel_sound = noun_phrase[:1].lower() in "aeiou" and not noun_phrase.lower().startswith(
        ("uni", "use", "eu")
    )
    return ("an " if vowel_sound else "a ") + noun_phrase


def join_names(names: Sequence[str]) -> str:
    """'A', 'A and B', 'A, B and C'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def mention(entity: Entity) -> str:
    """How running text names an entity: events take 'the' ('won the Velmo Open')."""
    return f"the {entity.name}" if entity.type == "event" else entity.name


PAGE_STYLES = ("prose", "facts", "long")


def render_pages(graph: KnowledgeGraph, seed: int, style: str = "prose") -> dict[str, RenderedPage]:
    """Every entity's page, keyed by entity id, in graph order. `style`: "prose" (templated encyclopedia
    sentences), "facts" (one `key value` field per fact, fixed wording and order; see `facts_page`) or
    "long" (the facts among distractor fields, one per line, behind a snippet; see `long_page`)."""
    if style == "facts":
        return {e.id: facts_page(graph, e) for e in graph.entities()}
    if style == "long":
        rng = random.Random(f"asearch-world/{seed}/long")
        names = [e.name for e in graph.entities()]
        return {e.id: long_page(graph, e, rng, names) for e in graph.entities()}
    if style != "prose":
        raise ValueError(f"page style must be one of {PAGE_STYLES}, got {style!r}")
    renderer = _Renderer(graph, random.Random(f"asearch-world/{seed}/render"))
    return {e.id: renderer.page(e) for e in graph.entities()}


# The "facts" style: (attribute or relation, the key word printed before its value), per entity type.
# Keys reuse the questions' words where they can ("Who is the spouse of X?" -> `spouse`), so a tiny
# model can find the asked fact by matching words instead of learning paraphrases.
_FACT_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "person": (("occupation", "occupation"), ("birth_year", "birth year"), ("born_in", "birthplace"),
               ("alma_mater", "alma mater"), ("employer", "employer"), ("spouse", "spouse")),
    "city": (("country", "country"), ("founded", "founded"), ("population", "population")),
    "country": (("capital", "capital"),),
    "company": (("industry", "industry"), ("headquarters", "headquarters"), ("founded", "founded"),
                ("founder", "founder")),
    "university": (("headquarters", "headquarters"), ("founded", "founded"), ("founder", "founder")),
    "book": (("genre", "genre"), ("creator", "author"), ("publisher", "publisher"), ("year", "year")),
    "film": (("genre", "genre"), ("creator", "director"), ("publisher", "studio"), ("year", "year")),
    "album": (("genre", "genre"), ("creator", "artist"), ("publisher", "label"), ("year", "year")),
    "event": (("category", "category"), ("location", "host city"), ("year", "year"),
              ("organiser", "organiser"), ("winner", "winner")),
}  # fmt: skip


def facts_page(graph: KnowledgeGraph, entity: Entity) -> RenderedPage:
    """`Name : type ; key value ; ... .` with the entity's own facts only, always in the same order.

    Other entities' pages still name this one (a spouse's page says `spouse <this>`), so a keyword
    search for a name returns those pages as distractors next to the right one.
    """
    fields, statements, mentions = [entity.type], {}, []
    for key, word in _FACT_KEYS[entity.type]:
        if key in entity.attrs:
            value = entity.attrs[key]
            text = f"{int(value):,}" if key == "population" else str(value)
        elif (obj := graph.one(entity.id, key)) is not None:
            text = graph.get(obj).name
            mentions.append(obj)
        else:
            continue
        field_text = f"{word} {text}"
        fields.append(field_text)
        statements[key] = field_text
    return RenderedPage(entity.id, entity.name, f"{entity.name} : " + " ; ".join(fields) + " .", tuple(mentions), statements)


# Keys of the "long" style's distractor fields: relations no question asks about, so only the asked key
# tells the fact apart; their values are names of the world, so copying the wrong line is a real mistake.
DISTRACTOR_KEYS = ("friend", "rival", "neighbour", "mentor", "critic", "patron", "guest", "biographer")
LONG_PAGE_FIELDS = 16  # lines of a long page below its header: its own facts, then distractors up to this


def long_page(graph: KnowledgeGraph, entity: Entity, rng: random.Random, names: Sequence[str]) -> RenderedPage:
    """A page to read chunk by chunk: the header `Name : type`, then `LONG_PAGE_FIELDS` lines of
    `key value`, the entity's own facts (as `facts_page` words them) shuffled among distractor fields.

    Search shows and indexes only the header (`snippet`), so no search result states a fact: the agent
    has to open the page and find the line whose key the question asks for."""
    facts = facts_page(graph, entity)
    own = list(facts.statements.values())
    others = [n for n in names if n != entity.name]
    distractors = [f"{rng.choice(DISTRACTOR_KEYS)} {rng.choice(others)}" for _ in range(LONG_PAGE_FIELDS - len(own))]
    lines = own + distractors
    rng.shuffle(lines)
    header = f"{entity.name} : {entity.type}"
    return RenderedPage(entity.id, entity.name, "\n".join([header, *lines]), facts.links, facts.statements, header)


class _Renderer:
    def __init__(self, graph: KnowledgeGraph, rng: random.Random):
        self.g, self.rng = graph, rng
        self.render = {
            "person": self._person,
            "city": self._city,
            "country": self._country,
            "company": self._company,
            "university": self._university,
            "book": self._work,
            "film": self._work,
            "album": self._work,
            "event": self._event,
        }

    def page(self, entity: Entity) -> RenderedPage:
        builder = _PageBuilder(entity)
        self.render[entity.type](builder, entity)
        return builder.build()

    # ---- helpers
    def e(self, entity_id: str) -> Entity:
        return self.g.get(entity_id)

    def obj(self, entity: Entity, relation: str) -> Entity | None:
        found = self.g.one(entity.id, relation)
        return None if found is None else self.g.get(found)

    def choose(self, options: Sequence[str], **values: object) -> str:
        return self.rng.choice(options).format(**values)

    def some(self, ids: Sequence[str], k: int) -> list[Entity]:
        """Up to k of `ids`, a seeded sample in graph order (pages list a few, never all)."""
        picked = sorted(self.rng.sample(range(len(ids)), k=min(k, len(ids))))
        return [self.e(ids[i]) for i in picked]

    # ---- people
    def _person(self, b: _PageBuilder, p: Entity) -> None:
        she, her = ("She", "Her") if p.attrs["gender"] == "female" else ("He", "His")
        name, year, occ = p.name, p.attrs["birth_year"], str(p.attrs["occupation"])
        city = self.obj(p, "born_in")
        assert city is not None, f"person {p.id} has no birthplace"
        who = self.rng.choice((she, name, she))  # later sentences mostly use the pronoun
        form = self.rng.randrange(4)
        if form < 2:
            intro = ("{n} (born {y}) is {o}.", "{n} is {o} born in {y}.")[form]
            b.say(intro.format(n=name, y=year, o=article(occ)), ("birth_year", "occupation"))
            born = ("{w} was born in {c}.", "{w} is a native of {c}.", "{h} birthplace is {c}.")
            b.say(self.choose(born, w=who, h=her, c=city.name), ("born_in",), (city.id,))
        else:
            intro = ("{n} (born {y} in {c}) is {o}.", "{n} is {o} who was born in {c} in {y}.")[form - 2]
            b.say(
                intro.format(n=name, y=year, o=article(occ), c=city.name),
                ("birth_year", "occupation", "born_in"),
                (city.id,),
            )
        if (uni := self.obj(p, "alma_mater")) is not None:
            studied = (
                "{w} studied at {u}.",
                "{w} graduated from {u}.",
                "{w} is a graduate of {u}.",
                "{w} was educated at {u}.",
            )
            b.say(
                self.choose(studied, w=self.rng.choice((she, name)), u=uni.name), ("alma_mater",), (uni.id,)
            )
        if (org := self.obj(p, "employer")) is not None:
            works = (
                "{w} works for {o}.",
                "{w} is employed by {o}.",
                "{w} works at {o}.",
                "{h} employer is {o}.",
            )
            b.say(
                self.choose(works, w=self.rng.choice((she, name)), h=her, o=org.name),
                ("employer",),
                (org.id,),
            )
        if (spouse := self.obj(p, "spouse")) is not None:
            married = (
                "{w} is married to {s}.",
                "{h} spouse is {s}.",
                "{w} married {s}.",
                "{n} and {s} are married.",
            )
            b.say(self.choose(married, w=she, h=her, n=name, s=spouse.name), ("spouse",), (spouse.id,))
        for org_id in self.g.subjects("founder", p.id):
            org = self.e(org_id)
            founded = ("{w} founded {o} in {y}.", "{w} is the founder of {o}.")
            b.say(self.choose(founded, w=she, o=org.name, y=org.attrs["founded"]), (), (org.id,))
        if works_made := self.g.subjects("creator", p.id):
            shown = [self.e(i) for i in works_made]  # all of them (~1.7 on average, rarely over 5)
            known = ("{w} is known for {t}.", "{h} works include {t}.")
            b.say(
                self.choose(known, w=she, h=her, t=join_names([w.name for w in shown])),
                (),
                [w.id for w in shown],
            )
        for event_id in self.g.subjects("winner", p.id):
            event = self.e(event_id)
            b.say(f"{she} won {mention(event)} in {event.attrs['year']}.", (), (event.id,))

    # ---- places
    def _city(self, b: _PageBuilder, c: Entity) -> None:
        country = self.obj(c, "country")
        assert country is not None, f"city {c.id} has no country"
        kind = "city" if int(c.attrs["population"]) >= 50_000 else "town"
        intro = ("{n} is {k} in {c}.", "{n} is {k} located in {c}.", "{n} is {k} of {c}.")
        b.say(self.choose(intro, n=c.name, k=article(kind), c=country.name), ("country",), (country.id,))
        if self.g.one(country.id, "capital") == c.id:
            b.say(
                self.choose(
                    ("It is the capital of {c}.", "{n} is the capital of {c}."), n=c.name, c=country.name
                )
            )
        founded = ("It was founded in {y}.", "The {k} was founded in {y}.", "{n} was founded in {y}.")
        b.say(self.choose(founded, y=c.attrs["founded"], k=kind, n=c.name), ("founded",))
        pop = f"{int(c.attrs['population']):,}"
        population = (
            "It has about {p} inhabitants.",
            "Its population is about {p}.",
            "About {p} people live there.",
        )
        b.say(self.choose(population, p=pop), ("population",))
        if natives := self.some(self.g.subjects("born_in", c.id), 3):
            listed = join_names([p.name for p in natives])
            born = ("Notable people born in {n} include {l}.", "{l} {v} born in {n}.")
            verb = "was" if len(natives) == 1 else "were"
            b.say(self.choose(born, n=c.name, l=listed, v=verb), (), [p.id for p in natives])
        if orgs := self.some(self.g.subjects("headquarters", c.id), 3):
            b.say(f"{c.name} is home to {join_names([o.name for o in orgs])}.", (), [o.id for o in orgs])
        for event in self.some(self.g.subjects("location", c.id), 2):
            b.say(f"It hosted {mention(event)} in {event.attrs['year']}.", (), (event.id,))

    def _country(self, b: _PageBuilder, c: Entity) -> None:
        capital = self.obj(c, "capital")
        assert capital is not None, f"country {c.id} has no capital"
        if self.rng.random() < 0.5:
            b.say(f"{c.name} is a country whose capital is {capital.name}.", ("capital",), (capital.id,))
        else:
            b.say(f"{c.name} is a country.")
            said = ("Its capital is {c}.", "The capital of {n} is {c}.", "Its capital city is {c}.")
            b.say(self.choose(said, n=c.name, c=capital.name), ("capital",), (capital.id,))
        others = [i for i in self.g.subjects("country", c.id) if i != capital.id]
        if shown := [self.e(i) for i in others]:  # all of them, so every place is linked from somewhere
            b.say(
                f"Other places in {c.name} include {join_names([x.name for x in shown])}.",
                (),
                [x.id for x in shown],
            )

    # ---- organisations
    def _company(self, b: _PageBuilder, o: Entity) -> None:
        industry = str(o.attrs["industry"])
        what = {"publishing": "publishing house", "film": "film studio", "music": "record label"}.get(
            industry, f"{industry} company"
        )
        self._organisation(b, o, what, ("industry",), "company")
        published = self.g.subjects("publisher", o.id)
        if shown := self.some(published, 3):
            verb = {"publishing": "published", "film": "produced"}.get(industry, "released")
            b.say(f"It {verb} {join_names([w.name for w in shown])}.", (), [w.id for w in shown])

    def _university(self, b: _PageBuilder, o: Entity) -> None:
        self._organisation(b, o, "university", (), "university")
        if alumni := self.some(self.g.subjects("alma_mater", o.id), 3):
            b.say(f"Its alumni include {join_names([p.name for p in alumni])}.", (), [p.id for p in alumni])

    def _organisation(
        self, b: _PageBuilder, o: Entity, what: str, what_facts: Sequence[str], noun: str
    ) -> None:
        city, founder = self.obj(o, "headquarters"), self.obj(o, "founder")
        assert city is not None and founder is not None, f"organisation {o.id} lacks headquarters or founder"
        if self.rng.random() < 0.5:
            b.say(
                f"{o.name} is {article(what)} based in {city.name}.",
                (*what_facts, "headquarters"),
                (city.id,),
            )
        else:
            b.say(f"{o.name} is {article(what)}.", what_facts)
            based = (
                "It is headquartered in {c}.",
                "The {k} is based in {c}.",
                "Its headquarters are in {c}.",
            )
            b.say(self.choose(based, c=city.name, k=noun), ("headquarters",), (city.id,))
        year = o.attrs["founded"]
        founded = (
            "It was founded in {y} by {f}.",
            "{f} founded the {k} in {y}.",
            "{n} was founded by {f} in {y}.",
        )
        b.say(
            self.choose(founded, y=year, f=founder.name, k=noun, n=o.name),
            ("founded", "founder"),
            (founder.id,),
        )
        if staff := self.some(self.g.subjects("employer", o.id), 3):
            b.say(
                f"Notable employees include {join_names([p.name for p in staff])}.", (), [p.id for p in staff]
            )

    # ---- works and events
    def _work(self, b: _PageBuilder, w: Entity) -> None:
        creator, publisher = self.obj(w, "creator"), self.obj(w, "publisher")
        assert creator is not None and publisher is not None, f"work {w.id} lacks creator or publisher"
        genre, year, t, c, p = str(w.attrs["genre"]), w.attrs["year"], w.name, creator.name, publisher.name
        if w.type == "book":
            intro = (
                "{t} is {g} novel by {c}.",
                "{t} is {g} novel written by {c}.",
                "{c} wrote the {genre} novel {t}.",
            )
            issued = ("It was published in {y} by {p}.", "{p} published it in {y}.")
        elif w.type == "film":
            intro = (
                "{t} is {g} film directed by {c}.",
                "{t} is {g} film by {c}.",
                "{c} directed the {genre} film {t}.",
            )
            issued = ("It was released in {y} by {p}.", "{p} produced the film, which came out in {y}.")
        else:
            intro = (
                "{t} is {g} album by {c}.",
                "{t} is {g} album recorded by {c}.",
                "{c} recorded the {genre} album {t}.",
            )
            issued = ("It was released in {y} by {p}.", "{p} released it in {y}.")
        b.say(
            self.choose(intro, t=t, g=article(genre), genre=genre, c=c), ("genre", "creator"), (creator.id,)
        )
        b.say(self.choose(issued, y=year, p=p), ("year", "publisher"), (publisher.id,))

    def _event(self, b: _PageBuilder, ev: Entity) -> None:
        city, organiser, winner = self.obj(ev, "location"), self.obj(ev, "organiser"), self.obj(ev, "winner")
        assert city and organiser and winner, f"event {ev.id} lacks location, organiser or winner"
        cat, year = str(ev.attrs["category"]), ev.attrs["year"]
        intro = ("The {n} was {k} held in {c} in {y}.", "The {n} was {k} that took place in {c} in {y}.")
        b.say(
            self.choose(intro, n=ev.name, k=article(cat), c=city.name, y=year),
            ("category", "location", "year"),
            (city.id,),
        )
        organised = ("It was organised by {o}.", "{o} organised it.", "The organiser was {o}.")
        b.say(self.choose(organised, o=organiser.name), ("organiser",), (organiser.id,))
        won = ("It was won by {w}.", "The winner was {w}.", "{w} won it.")
        b.say(self.choose(won, w=winner.name), ("winner",), (winner.id,))
