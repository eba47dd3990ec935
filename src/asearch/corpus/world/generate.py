"""Build a seeded world's knowledge graph: countries, cities, people, organisations, works and events.

Everything comes from one `random.Random` stream per seed (no global state), so a seed always
yields the same graph. Years are kept plausible (founders are adults when they found, creators when
they publish), and every functional relation gets at most one value.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from asearch.corpus.world.graph import Entity, KnowledgeGraph
from asearch.corpus.world.names import (
    COMPANY_FORMS,
    EVENT_KINDS,
    UNIVERSITY_FORMS,
    WORK_FORMS,
    given_names,
    owned_roots,
)
from asearch.errors import ConfigError

GENERATOR_VERSION = 1
"""Bump whenever the generated graph, page text, urls or questions change: indexes record it to detect staleness."""

MIN_ENTITIES = 100  # below this some types get too few members for multi-hop questions

# --------------------------------------------------------------------------- vocabularies
MEDIA_INDUSTRIES = ("publishing", "film", "music")  # publishers of books, films and albums
OTHER_INDUSTRIES = (
    "shipping", "banking", "mining", "textiles", "software", "food", "aviation", "steel",
    "insurance", "retail", "energy", "chemicals", "railways", "glass", "timber", "tea",
)  # fmt: skip
GENRES = {
    "book": ("mystery", "historical", "fantasy", "romance", "crime", "adventure", "science fiction", "comic"),
    "film": ("comedy", "drama", "thriller", "western", "horror", "musical", "war", "documentary"),
    "album": ("jazz", "folk", "rock", "blues", "pop", "soul", "country", "reggae"),
}
CREATOR_OCCUPATIONS = {
    "book": ("novelist", "poet", "writer"),
    "film": ("film director", "filmmaker"),
    "album": ("singer", "composer", "musician"),
}
WINNER_OCCUPATIONS = {
    "chess tournament": "chess player",
    "marathon": "runner",
    "poetry prize": "poet",
    "horse race": "jockey",
    "sailing regatta": "sailor",
    "cycling race": "cyclist",
    "golf tournament": "golfer",
    "tennis tournament": "tennis player",
}
OCCUPATIONS = (
    "engineer", "chemist", "teacher", "architect", "lawyer", "physician", "banker", "journalist",
    "painter", "photographer", "historian", "economist", "pilot", "farmer", "carpenter", "nurse",
    "geologist", "mathematician", "botanist", "chef", "sculptor", "diplomat", "astronomer",
    "librarian", "translator", "surveyor", "pharmacist", "biologist", "physicist", "tailor",
)  # fmt: skip

FIRST_BIRTH_YEAR, LAST_BIRTH_YEAR = 1900, 1990
LAST_YEAR = 2020  # nothing happens after this year


@dataclass(frozen=True, slots=True)
class WorldSizes:
    """How many entities of each type a world of `total` entities gets (fractions chosen for 2-3k totals)."""

    countries: int
    cities: int
    people: int
    companies: int
    universities: int
    books: int
    films: int
    albums: int
    events: int

    @classmethod
    def for_total(cls, total: int) -> WorldSizes:
        countries = max(4, round(0.02 * total))
        # >= 100 cities from 1,250 entities on: guessing a city earns ~1%
        cities = max(2 * countries, round(0.08 * total))
        companies = max(9, round(0.05 * total))  # >= 9 so each media industry has a publisher
        universities = max(3, round(0.02 * total))
        works = max(6, round(0.16 * total))
        books, films = round(0.45 * works), round(0.3 * works)
        events = max(3, round(0.05 * total))
        others = countries + cities + companies + universities + works + events
        return cls(
            countries,
            cities,
            total - others,
            companies,
            universities,
            books,
            films,
            works - books - films,
            events,
        )

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


def slug(name: str) -> str:
    """The url path segment and entity id of a name: spaces become underscores (names are letters and spaces)."""
    return name.replace(" ", "_")


def check_world_size(seed: int, n_entities: int, names: int | None = None) -> None:
    """ConfigError unless world `seed` (names from seed `names`'s roots) can have `n_entities` entities
    (cheap: generates nothing)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"world: seed must be an integer, got {seed!r}")
    if not isinstance(n_entities, int) or isinstance(n_entities, bool) or n_entities < MIN_ENTITIES:
        raise ConfigError(f"world: n_entities must be an integer >= {MIN_ENTITIES}, got {n_entities!r}")
    if names is not None and (not isinstance(names, int) or isinstance(names, bool)):
        raise ConfigError(f"world: names must be an integer seed, got {names!r}")
    roots = len(owned_roots(seed if names is None else names))
    if not _fits(n_entities, roots):
        limit = max(n for n in range(MIN_ENTITIES, 100_000, 100) if _fits(n, roots))
        raise ConfigError(
            f"world: {n_entities} entities need more names than a seed's {roots} name roots give; use n_entities <= {limit}"
        )


def generate_graph(seed: int, n_entities: int, names: int | None = None) -> KnowledgeGraph:
    """The knowledge graph of world `seed` with exactly `n_entities` entities. Names come from the roots
    of seed `names` (default: `seed` itself, so worlds share no name); worlds given the same `names`
    draw from one pool of names but assign them, and every fact, by their own seed."""
    check_world_size(seed, n_entities, names)
    return _Builder(seed, WorldSizes.for_total(n_entities), names).build()


class _Builder:
    """One pass of generation; holds the rng, the growing entity/triple lists and the name registry."""

    def __init__(self, seed: int, sizes: WorldSizes, names: int | None = None):
        # string seeds are hashed with sha512, so the stream is the same in every process
        self.rng = random.Random(f"asearch-world/{seed}/graph")
        self.sizes = sizes
        roots = owned_roots(seed if names is None else names)
        self.rng.shuffle(roots)
        bare = sizes.countries + sizes.cities
        self.bare_roots, self.pool = roots[:bare], roots[bare:]  # place names never share a root
        self.pool_next = 0
        self.names: set[str] = set()
        self.entities: dict[str, Entity] = {}
        self.attrs: dict[str, dict[str, int | str]] = {}
        self.triples: list[tuple[str, str, str]] = []
        self.one: dict[tuple[str, str], str] = {}  # (subject, relation) -> object

    # ---- helpers
    def add(self, type_: str, name: str, **attrs: int | str) -> str:
        entity_id = slug(name)
        self.names.add(name)
        self.attrs[entity_id] = dict(attrs)
        self.entities[entity_id] = Entity(entity_id, type_, name, self.attrs[entity_id])
        return entity_id

    def relate(self, s: str, r: str, o: str) -> None:
        self.triples.append((s, r, o))
        self.one[(s, r)] = o

    def next_root(self) -> str:
        """Roots from the shared pool in order; cycling means a root is reused only once all are taken."""
        root = self.pool[self.pool_next % len(self.pool)]
        self.pool_next += 1
        return root

    def new_name(self, forms: Sequence[str]) -> str:
        """An unused name: the next root in a random one of `forms`, trying every root and form before giving up."""
        for _ in range(len(self.pool)):
            root = self.next_root()
            for form in self.rng.sample(forms, len(forms)):
                if (name := form.format(r=root)) not in self.names:
                    return name
        # check_world_size leaves room for every name, so this is a bug if it happens
        raise ConfigError(f"world: ran out of names for forms {forms}; use fewer entities")

    def pick(self, ids: Sequence[str], ok: Callable[[str], bool], tries: int = 30) -> str | None:
        """A random id satisfying `ok` (rejection sampling), else None."""
        for _ in range(tries):
            candidate = self.rng.choice(ids)
            if ok(candidate):
                return candidate
        return None

    def year(self, entity_id: str, key: str) -> int:
        value = self.attrs[entity_id][key]
        assert isinstance(value, int), f"{entity_id}.{key} should be a year, got {value!r}"
        return value

    # ---- the world, in dependency order
    def build(self) -> KnowledgeGraph:
        rng, sz = self.rng, self.sizes
        countries = [self.add("country", r) for r in self.bare_roots[: sz.countries]]
        cities = self._cities(countries)
        city_weights = [float(self.attrs[c]["population"]) ** 0.5 for c in cities]  # big cities get more

        def a_city() -> str:
            return rng.choices(cities, weights=city_weights)[0]

        people = self._people(a_city)
        occupation: dict[str, str] = {}  # creators get one fitting their works, then event winners
        companies = self._organisations("company", sz.companies, people, a_city)
        universities = self._organisations("university", sz.universities, people, a_city)
        self._careers(people, companies, universities)
        self._marriages(people)
        for kind, count in (("book", sz.books), ("film", sz.films), ("album", sz.albums)):
            self._works(kind, count, people, companies, occupation)
        self._events(people, companies + universities, a_city, occupation)
        for p in people:
            self.attrs[p]["occupation"] = occupation.get(p) or rng.choice(OCCUPATIONS)
        return KnowledgeGraph(self.entities.values(), self.triples)

    def _cities(self, countries: list[str]) -> list[str]:
        rng = self.rng
        cities = []
        for i, root in enumerate(self.bare_roots[len(countries) :]):
            capital = i < len(countries)
            low, high = (5.3, 6.5) if capital else (3.5, 6.2)  # log10 population; capitals are big
            population = int(float(f"{10 ** rng.uniform(low, high):.2g}"))  # two significant digits
            city = self.add("city", root, founded=rng.randint(800, 1900), population=population)
            country = countries[i] if capital else rng.choice(countries)
            self.relate(city, "country", country)
            if capital:
                self.relate(country, "capital", city)
            cities.append(city)
        return cities

    def _people(self, a_city: Callable[[], str]) -> list[str]:
        rng, n = self.rng, self.sizes.people
        surnames = [self.next_root() for _ in range(max(1, round(n / 3)))]  # families of ~3 share a surname
        people = []
        while len(people) < n:
            gender = rng.choice(("female", "male"))
            name = f"{rng.choice(given_names(gender))} {rng.choice(surnames)}"
            if name in self.names:
                continue
            person = self.add(
                "person", name, gender=gender, birth_year=rng.randint(FIRST_BIRTH_YEAR, LAST_BIRTH_YEAR)
            )
            self.relate(person, "born_in", a_city())
            people.append(person)
        return people

    def _organisations(
        self, type_: str, count: int, people: list[str], a_city: Callable[[], str]
    ) -> list[str]:
        rng = self.rng
        founders = {self.one[(o, "founder")] for o in self.entities if (o, "founder") in self.one}
        orgs = []
        for i in range(count):
            if type_ == "company":
                # the first companies are the publishers, studios and labels the works need
                if i < 3:
                    industry = MEDIA_INDUSTRIES[i]
                else:
                    industry = rng.choice(MEDIA_INDUSTRIES if rng.random() < 0.4 else OTHER_INDUSTRIES)
                forms = COMPANY_FORMS.get(industry, COMPANY_FORMS["other"])
                attrs: dict[str, int | str] = {"industry": industry}
            else:
                forms, attrs = UNIVERSITY_FORMS, {}
            founded = rng.randint(1925, 2010)
            founder = self.pick(
                people,
                lambda p, y=founded: y - 60 <= self.year(p, "birth_year") <= y - 25 and p not in founders,
                tries=200,
            ) or self.pick(people, lambda p, y=founded: self.year(p, "birth_year") <= y - 25, tries=1000)
            if founder is None:  # only possible in tiny worlds: make the founder's birth fit instead
                founder = rng.choice(people)
                founded = max(founded, self.year(founder, "birth_year") + 25)
            org = self.add(type_, self.new_name(forms), founded=founded, **attrs)
            self.relate(org, "headquarters", a_city())
            self.relate(org, "founder", founder)
            founders.add(founder)
            orgs.append(org)
        return orgs

    def _careers(self, people: list[str], companies: list[str], universities: list[str]) -> None:
        rng = self.rng
        orgs = companies + universities
        weights = [3.0] * len(companies) + [2.0] * len(universities)
        founded_by = {self.one[(o, "founder")]: o for o in orgs}
        for p in people:
            born = self.year(p, "birth_year")
            if rng.random() < 0.7:
                uni = self.pick(universities, lambda u, b=born: self.year(u, "founded") <= b + 18, tries=10)
                if uni is not None:
                    self.relate(p, "alma_mater", uni)
            if p in founded_by and rng.random() < 0.5:
                self.relate(p, "employer", founded_by[p])
            elif rng.random() < 0.8:
                for _ in range(10):
                    org = rng.choices(orgs, weights=weights)[0]
                    if self.year(org, "founded") <= born + 60:
                        self.relate(p, "employer", org)
                        break

    def _marriages(self, people: list[str]) -> None:
        """About 40% of people marry someone born within a few years (pairs of neighbours by birth year)."""
        married = self.rng.sample(people, k=2 * int(0.2 * len(people)))
        married.sort(key=lambda p: self.year(p, "birth_year"))
        for a, b in zip(married[::2], married[1::2], strict=True):
            self.relate(a, "spouse", b)
            self.relate(b, "spouse", a)

    def _works(
        self, kind: str, count: int, people: list[str], companies: list[str], occupation: dict[str, str]
    ) -> None:
        rng = self.rng
        industry = {"book": "publishing", "film": "film", "album": "music"}[kind]
        publishers = [c for c in companies if self.attrs[c]["industry"] == industry]
        free = [p for p in people if p not in occupation and self.year(p, "birth_year") <= LAST_YEAR - 25]
        pool = rng.sample(free, k=min(len(free), max(1, round(0.6 * count))))  # ~1.7 works per creator
        for p in pool:
            occupation[p] = rng.choice(CREATOR_OCCUPATIONS[kind])
        for _ in range(count):
            creator = rng.choice(pool)
            born = self.year(creator, "birth_year")
            year = rng.randint(born + 20, min(LAST_YEAR, born + 75))
            publisher = self.pick(publishers, lambda c, y=year: self.year(c, "founded") <= y, tries=20)
            if publisher is None:  # no label old enough: release it once the oldest one exists
                publisher = min(publishers, key=lambda c: self.year(c, "founded"))
                year = max(year, self.year(publisher, "founded"))
            work = self.add(kind, self.new_name(WORK_FORMS[kind]), year=year, genre=rng.choice(GENRES[kind]))
            self.relate(work, "creator", creator)
            self.relate(work, "publisher", publisher)

    def _events(
        self, people: list[str], orgs: list[str], a_city: Callable[[], str], occupation: dict[str, str]
    ) -> None:
        rng = self.rng
        winners: set[str] = set()
        for _ in range(self.sizes.events):
            name = self.new_name([f"{{r}} {k}" for k in EVENT_KINDS])
            kind = name.rsplit(" ", 1)[1]
            year = rng.randint(1950, LAST_YEAR)
            organiser = self.pick(orgs, lambda o, y=year: self.year(o, "founded") <= y) or min(
                orgs, key=lambda o: self.year(o, "founded")
            )
            year = max(year, self.year(organiser, "founded"))

            def fits(p: str, y: int = year) -> bool:
                return y - 45 <= self.year(p, "birth_year") <= y - 18

            winner = self.pick(people, lambda p: fits(p) and p not in winners, tries=100) or self.pick(
                people, fits, tries=1000
            )
            if winner is None:
                winner = rng.choice(people)
                year = max(year, self.year(winner, "birth_year") + 18)
            event = self.add("event", name, year=year, category=EVENT_KINDS[kind])
            self.relate(event, "location", a_city())
            self.relate(event, "organiser", organiser)
            self.relate(event, "winner", winner)
            winners.add(winner)
            occupation.setdefault(winner, WINNER_OCCUPATIONS[EVENT_KINDS[kind]])


def _fits(total: int, roots: int) -> bool:
    """Whether a seed's roots can name a world of `total` entities, with room to spare for uniqueness retries."""
    sz = WorldSizes.for_total(total)
    pool = roots - sz.countries - sz.cities  # places take a root each; the rest share the remaining pool
    if pool < 50:
        return False
    typed = [(sz.universities, len(UNIVERSITY_FORMS)), (sz.events, len(EVENT_KINDS)), (sz.companies, 3)]
    typed += [
        (count, len(WORK_FORMS[kind]))
        for kind, count in (("book", sz.books), ("film", sz.films), ("album", sz.albums))
    ]
    return all(count <= pool * forms // 2 for count, forms in typed)
