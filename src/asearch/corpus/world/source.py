"""`WorldCorpus`: a seeded synthetic world as a CorpusSource (one page per entity) plus its knowledge graph."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import cached_property

from asearch.corpus.types import Document, Page
from asearch.corpus.world.generate import GENERATOR_VERSION, check_world_size, generate_graph
from asearch.corpus.world.graph import Entity, KnowledgeGraph
from asearch.corpus.world.render import PAGE_STYLES, RenderedPage, render_pages
from asearch.errors import ConfigError

DEFAULT_ENTITIES = 2000


class WorldCorpus:
    """World `seed` with `n_entities` entities: pages at `https://world{seed}.example/wiki/<Slug>`
    (`https://world.example/wiki/<Slug>` in every world with long pages).

    The world is generated on first use (~0.2 s per 1,000 entities) and is a pure function of
    (seed, n_entities, GENERATOR_VERSION), so `fingerprint()` needs no generation. `.example` is a
    reserved TLD, so no url is ever fetched.
    """

    def __init__(
        self, seed: int = 0, n_entities: int = DEFAULT_ENTITIES, names: int | None = None, pages: str = "prose"
    ):
        if pages not in PAGE_STYLES:
            raise ConfigError(f"world: pages must be one of {', '.join(PAGE_STYLES)}, got {pages!r}")
        self.seed, self.n_entities, self.names, self.page_style = seed, n_entities, names, pages
        # the spec `open_corpus` accepts
        self.name = f"world:seed={seed},entities={n_entities}" + ("" if names is None else f",names={names}")
        self.name += "" if pages == "prose" else f",pages={pages}"
        # long pages are opened by url, which an agent copies from a result: one host in every world, so a
        # held-out world changes the facts, not how a url is spelled
        self.base_url = "https://world.example/wiki/" if pages == "long" else f"https://world{seed}.example/wiki/"
        check_world_size(seed, n_entities, names)  # fail now, not at first use

    @cached_property
    def graph(self) -> KnowledgeGraph:
        """The world's knowledge graph (generated on first use)."""
        return generate_graph(self.seed, self.n_entities, self.names)

    @cached_property
    def _pages(self) -> dict[str, RenderedPage]:
        return render_pages(self.graph, self.seed, self.page_style)

    def __repr__(self) -> str:
        names = "" if self.names is None else f", names={self.names}"
        pages = "" if self.page_style == "prose" else f", pages={self.page_style!r}"
        return f"WorldCorpus(seed={self.seed}, n_entities={self.n_entities}{names}{pages})"

    def __len__(self) -> int:
        return self.n_entities

    # ---- urls and entities
    def url(self, entity: str | Entity) -> str:
        return self.base_url + self.graph.resolve(entity)  # entity ids are url slugs

    def entity_by_url(self, url: str) -> Entity:
        """The entity a page url shows; KeyError naming the url when it is not a page of this world."""
        slug = url.removeprefix(self.base_url)
        if slug == url or slug not in self.graph:
            raise KeyError(f"{url!r} is not a page of {self.name}")
        return self.graph.get(slug)

    def rendered(self, entity: str | Entity) -> RenderedPage:
        """The page of an entity with its per-fact statements and mentioned ids."""
        return self._pages[self.graph.resolve(entity)]

    def statement(self, entity: str | Entity, key: str) -> str:
        """The sentence on `entity`'s page that states its attribute or relation `key`."""
        page = self.rendered(entity)
        if key not in page.statements:
            raise KeyError(f"the page of {page.title!r} states no {key!r}")
        return page.statements[key]

    # ---- CorpusSource
    def documents(self) -> Iterator[Document]:
        """One document per entity, in graph order (countries, cities, people, orgs, works, events)."""
        for p in self._pages.values():
            yield Document(
                id=f"world{self.seed}:{p.entity_id}", title=p.title, text=p.snippet or p.text, url=self.url(p.entity_id)
            )

    def pages(self) -> Iterator[Page]:
        """Each document's text plus a `Links:` section naming the pages it mentions (title: url)."""
        for p in self._pages.values():
            yield self._page(p)

    def page(self, url: str) -> Page:
        return self._page(self._pages[self.entity_by_url(url).id])

    def _page(self, p: RenderedPage) -> Page:
        contents = p.text
        if p.links and p.snippet is None:  # a long page's lines already name what it links to
            lines = [f"- {self.graph.get(i).name}: {self.url(i)}" for i in p.links]
            contents += "\n\nLinks:\n" + "\n".join(lines)
        return Page(url=self.url(p.entity_id), title=p.title, contents=contents)

    def links(self) -> dict[str, list[str]]:
        """url -> urls of the entities its page mentions, for every page."""
        return {self.url(p.entity_id): [self.url(i) for i in p.links] for p in self._pages.values()}

    def fingerprint(self) -> str:
        """Identifies the content: it is a pure function of generator version, seed and size, so no hashing of text."""
        key = f"asearch-world|v{GENERATOR_VERSION}|seed={self.seed}|entities={self.n_entities}"
        key += "" if self.names is None else f"|names={self.names}"  # unchanged for own-name worlds
        key += "" if self.page_style == "prose" else f"|pages={self.page_style}"
        key += f"|urls={self.base_url}" if self.page_style == "long" else ""  # the url scheme is content too
        return f"{self.name}:v{GENERATOR_VERSION}:sha256:{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def content_digest(self) -> str:
        """sha256 over every page (url, title, contents): for checking that generation is reproducible."""
        h = hashlib.sha256()
        for page in self.pages():
            h.update(f"{page.url}\x00{page.title}\x00{page.contents}\x01".encode())
        return h.hexdigest()
