"""Plain records that flow out of every corpus: documents, passages (search units) and pages (access units)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Document:
    """One source article before chunking."""

    id: str
    title: str
    text: str
    url: str


@dataclass(frozen=True, slots=True)
class Passage:
    """A search unit: a chunk of a document that keeps its title and url."""

    id: str
    title: str
    text: str
    url: str

    @property
    def contents(self) -> str:
        """wiki-18 style: the quoted title on the first line, then the text (what Search-R1 clients expect)."""
        return f'"{self.title}"\n{self.text}'

    def to_doc(self) -> dict[str, Any]:
        """The document shape of the /retrieve API: id, contents, url (+ title, text for convenience)."""
        return {"id": self.id, "contents": self.contents, "url": self.url, "title": self.title, "text": self.text}


@dataclass(frozen=True, slots=True)
class Page:
    """An access unit: the full text behind a url."""

    url: str
    title: str
    contents: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class CorpusSource(Protocol):
    """Anything that can stream a corpus. Iterators must stream: memory may not grow with corpus size."""

    name: str

    def documents(self) -> Iterator[Document]:
        """Source articles, in a stable order."""
        ...

    def pages(self) -> Iterator[Page]:
        """Full pages for the access tool (one per url)."""
        ...

    def fingerprint(self) -> str:
        """A stable hash of the content (and generator settings), recorded in index manifests."""
        ...
