"""Name -> corpus: `open_corpus("wiki10k" | "world[:...]" | path.jsonl)`, and the jsonl-file corpus."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from asearch.corpus.formats import corpus_name_for, document_lines, read_documents, read_pages
from asearch.corpus.types import CorpusSource, Document, Page
from asearch.errors import AsearchError, ConfigError, DataFormatError

CORPUS_SPEC_HELP = (
    "a corpus is 'wiki10k', 'world' (options: 'world:7' for seed 7, or 'world:seed=7,entities=3000', 'names=N' to draw names from world N's pool, 'pages=facts' for `key value` pages, 'pages=long' for long pages behind a snippet), "
    "or the path of a .jsonl file"
)

# `world:key=value` keys -> WorldCorpus keyword arguments
_WORLD_OPTIONS = {"seed": "seed", "entities": "n_entities", "names": "names", "pages": "pages"}
_WORLD_TEXT_OPTIONS = {"pages"}  # the others are integers


class JsonlCorpus:
    """A corpus stored as one jsonl file in any format `read_documents` accepts.

    A file without a single document (empty, or blank lines only) is refused unless `allow_empty`.
    """

    def __init__(self, path: str | Path, *, allow_empty: bool = False):
        self.path = Path(path)
        if not self.path.is_file():
            raise AsearchError(f"{self.path}: no such corpus file")
        if not allow_empty and _is_blank(self.path):
            raise DataFormatError(
                self.path, None, None, "no documents in it (empty, or blank lines only); "
                "`asearch index build` takes such a corpus with --allow-empty",
            )
        self.name = corpus_name_for(self.path)
        self._fingerprint: tuple[tuple[int, int], str] | None = None  # ((size, mtime_ns), fingerprint)

    def __repr__(self) -> str:
        return f"JsonlCorpus({str(self.path)!r})"

    def documents(self) -> Iterator[Document]:
        return read_documents(self.path)

    def pages(self) -> Iterator[Page]:
        """Pages lines as they are; each document line (or run of same-url lines) as one page."""
        return read_pages(self.path)

    def document_lines(self, doc_id: str) -> list[int]:
        """The first two lines holding document `doc_id`: how a duplicate id is named (a second pass)."""
        return document_lines(self.path, doc_id)

    def fingerprint(self) -> str:
        """`<name>:sha256:<hex>:<size>`. The name is included because synthesised urls are built from it."""
        st = self.path.stat()
        stamp = (st.st_size, st.st_mtime_ns)
        if self._fingerprint is None or self._fingerprint[0] != stamp:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            self._fingerprint = (stamp, f"{self.name}:sha256:{h.hexdigest()}:{st.st_size}")
        return self._fingerprint[1]


def _is_blank(path: Path, block: int = 1 << 16) -> bool:
    """True when the file holds only whitespace; reads no further than its first other byte."""
    with open(path, "rb") as f:
        while chunk := f.read(block):
            if chunk.strip():
                return False
    return True


def parse_world_spec(spec: str) -> dict[str, int | str]:
    """`world` -> {}, `world:7` -> {seed: 7}, `world:seed=7,entities=3000` -> {seed: 7, n_entities: 3000}."""
    _, _, options = spec.partition(":")
    options = options.strip()
    if not options:
        return {}
    if "=" not in options:
        return {"seed": _int_option(spec, "seed", options)}
    kwargs: dict[str, int | str] = {}
    for item in options.split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or key not in _WORLD_OPTIONS:
            raise ConfigError(
                f"corpus {spec!r}: unknown option {item.strip()!r}; valid: {', '.join(f'{k}=' + ('TEXT' if k in _WORLD_TEXT_OPTIONS else 'N') for k in _WORLD_OPTIONS)}"
            )
        kwargs[_WORLD_OPTIONS[key]] = value if key in _WORLD_TEXT_OPTIONS else _int_option(spec, key, value)
    return kwargs


def _int_option(spec: str, key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"corpus {spec!r}: {key} must be an integer, got {value!r}") from None


def open_corpus(spec: str, *, allow_empty: bool = False) -> CorpusSource:
    """Open a corpus by name or path (see CORPUS_SPEC_HELP). Names win over same-named files: use `./wiki10k`.

    `allow_empty` accepts a jsonl file without documents (refused otherwise: it is almost always a mistake).
    """
    spec = spec.strip()
    if spec == "wiki10k":
        from asearch.corpus.wiki10k import Wiki10kCorpus

        return Wiki10kCorpus()
    if spec == "world" or spec.startswith("world:"):
        kwargs = parse_world_spec(spec)
        try:
            from asearch.corpus.world import WorldCorpus
        except ImportError as e:
            raise AsearchError(f"corpus {spec!r}: the world generator is not available ({e})") from None
        return WorldCorpus(**kwargs)
    path = Path(spec).expanduser()
    if path.is_dir():
        raise AsearchError(f"corpus {spec!r} is a directory; {CORPUS_SPEC_HELP}")
    if not path.is_file():
        raise AsearchError(f"corpus {spec!r}: no such name or file; {CORPUS_SPEC_HELP}")
    return JsonlCorpus(path, allow_empty=allow_empty)
