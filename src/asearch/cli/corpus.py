"""`asearch corpus info|export|show`: inspect a corpus, write it out as jsonl, print one page."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from asearch.cli.console import CORPUS_OPTION_HELP, console, corpus_spec, from_options, make_console, progress
from asearch.corpus import CORPUS_SPEC_HELP, ChunkConfig, ChunkStats, iter_passages, open_corpus, write_jsonl
from asearch.corpus.types import CorpusSource, Document, Page
from asearch.errors import AsearchError, ConfigError
from asearch.retrieval.store import key_hash

app = typer.Typer(
    help="Inspect, export and browse corpora. The corpus is the first argument or --corpus SPEC, as in "
    "`asearch index build --corpus SPEC` and `asearch ask --corpus SPEC`.",
    no_args_is_help=True,
)

stdout = make_console(stderr=False)
T = TypeVar("T")

SpecArg = Annotated[
    str | None,
    typer.Argument(help=CORPUS_SPEC_HELP[0].upper() + CORPUS_SPEC_HELP[1:] + " (or --corpus SPEC).", show_default=False),
]
CorpusOpt = Annotated[str | None, typer.Option("--corpus", help=CORPUS_OPTION_HELP, show_default=False)]
WordsOpt = Annotated[int, typer.Option("--words", help="Words per passage.")]
OverlapOpt = Annotated[int, typer.Option("--overlap", help="Words repeated from the previous passage.")]


def _chunk_config(words: int, overlap: int) -> ChunkConfig:
    return from_options(ChunkConfig, {"words": words, "overlap": overlap})


def _counted(items: Iterable[T], description: str, total: int | None) -> Iterator[T]:
    """Yield `items` while a progress bar counts them (on stderr)."""
    with progress(transient=True) as bar:
        task = bar.add_task(description, total=total, rate="")
        n = 0
        for n, item in enumerate(items, start=1):  # noqa: B007 (n is read after the loop)
            yield item
            if n % 512 == 0:
                bar.update(task, completed=n)
        bar.update(task, completed=n, total=n)


def _size_hint(source: CorpusSource) -> int | None:
    return len(source) if hasattr(source, "__len__") else None  # type: ignore[arg-type]


def corpus_info(source: CorpusSource, cfg: ChunkConfig) -> dict[str, Any]:
    """Counts over one pass of documents (+ chunking) and one pass of pages; a second pass over the documents
    only when two share an id, to name examples (`index build` refuses such a corpus)."""
    stats = ChunkStats()
    id_hashes = array("Q")
    for _ in _counted(iter_passages(_hashing_ids(source.documents(), id_hashes), cfg, stats), "documents -> passages", None):
        pass
    pages = page_chars = 0
    for page in _counted(source.pages(), "pages", _size_hint(source)):
        pages += 1
        page_chars += len(page.contents)
    info: dict[str, Any] = {
        "corpus": source.name,
        "documents": stats.documents,
        "passages": stats.passages,
        "chunking": cfg.model_dump(),
        "words": stats.words,
        "empty_documents": stats.empty_documents,
        "pages": pages,
        "page_chars": page_chars,
        "fingerprint": source.fingerprint(),
    }
    for key in ("license", "attribution"):
        if getattr(source, key, None):
            info[key] = getattr(source, key)
    info.update(_duplicate_ids(source, id_hashes))
    return info


def _hashing_ids(documents: Iterable[Document], into: array[int]) -> Iterator[Document]:
    """Yield `documents`, appending a 64-bit hash of each id to `into` (8 bytes a document, not a set of ids)."""
    for doc in documents:
        into.append(key_hash(doc.id))
        yield doc


def _duplicate_ids(source: CorpusSource, id_hashes: array[int], examples: int = 3) -> dict[str, Any]:
    """{"duplicate_ids": documents whose id an earlier one has, "duplicate_id_examples": "id (n times), ..."}
    or {} when every id is unique. Hash matches are confirmed on the ids themselves in a second pass."""
    hashes = np.frombuffer(id_hashes, dtype=np.uint64)
    values, counts = np.unique(hashes, return_counts=True)
    shared = set(values[counts > 1].tolist())
    if not shared:
        return {}
    seen: Counter[str] = Counter(doc.id for doc in source.documents() if key_hash(doc.id) in shared)
    repeated = {doc_id: n for doc_id, n in seen.items() if n > 1}
    if not repeated:
        return {}  # 64-bit hash collisions between distinct ids only
    shown = ", ".join(f"{doc_id!r} ({n} times)" for doc_id, n in list(repeated.items())[:examples])
    return {
        "duplicate_ids": sum(n - 1 for n in repeated.values()),
        "duplicate_id_examples": shown + (", ..." if len(repeated) > examples else ""),
    }


@app.command()
def info(
    spec: SpecArg = None,
    corpus: CorpusOpt = None,
    words: WordsOpt = ChunkConfig().words,
    overlap: OverlapOpt = ChunkConfig().overlap,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
) -> None:
    """Count documents, passages (at the given chunking), words and pages; print the fingerprint and licence."""
    cfg = _chunk_config(words, overlap)
    result = corpus_info(open_corpus(corpus_spec(spec, corpus, usage="asearch corpus info SPEC")), cfg)
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
        return
    table = Table(show_header=False, box=None)
    for key, value in result.items():
        shown = f"{value:,}" if isinstance(value, int) else str(value)
        table.add_row(f"[bold]{key}[/bold]", escape(shown))
    stdout.print(table)
    if result.get("duplicate_ids"):
        console.print(
            f"[yellow]{result['duplicate_ids']:,} documents repeat an earlier id; `asearch index build` refuses "
            "this corpus: give every document its own id.[/yellow]"
        )


def _records(source: CorpusSource, what: str, cfg: ChunkConfig) -> Iterator[dict[str, Any]]:
    if what == "passages":
        for p in iter_passages(source, cfg):
            yield {"id": p.id, "contents": p.contents, "url": p.url, "title": p.title}
    elif what == "pages":
        for page in source.pages():
            yield {"url": page.url, "title": page.title, "contents": page.contents}
    else:
        for d in source.documents():
            yield {"id": d.id, "title": d.title, "text": d.text, "url": d.url}


@app.command()
def export(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output jsonl file (written atomically).", dir_okay=False)
    ],
    spec: SpecArg = None,
    corpus: CorpusOpt = None,
    what: Annotated[
        Literal["passages", "pages", "documents"],
        typer.Option(
            "--what",
            help='passages: {"id","contents","url","title"} (wiki-18 shape); pages: {"url","title","contents"}; '
            'documents: {"id","title","text","url"}.',
        ),
    ] = "passages",
    words: WordsOpt = ChunkConfig().words,
    overlap: OverlapOpt = ChunkConfig().overlap,
) -> None:
    """Write a corpus as jsonl (passages, pages or documents) and print how many records were written."""
    cfg = _chunk_config(words, overlap)
    source = open_corpus(corpus_spec(spec, corpus, usage="asearch corpus export SPEC --out FILE"))
    total = _size_hint(source) if what != "passages" else None
    n = write_jsonl(out, _counted(_records(source, what, cfg), f"export {what}", total))
    stdout.print(f"wrote {n:,} {what} of {escape(source.name)} to {escape(str(out))}")
    if getattr(source, "attribution", None):
        console.print(f"[dim]{escape(source.attribution)}[/dim]")  # type: ignore[attr-defined]


def find_page(source: CorpusSource, query: str) -> Page:
    """The page whose url equals `query`, else whose title equals it, else the one whose title equals it ignoring case."""
    from asearch.corpus.wiki10k import title_from_wiki_url

    query = query.strip()
    wanted_title = title_from_wiki_url(query) or query
    folded = wanted_title.casefold()
    caseless: Page | None = None
    near: list[str] = []
    for page in source.pages():
        if page.url == query or page.title == wanted_title:
            return page
        title = page.title.casefold()
        if caseless is None and title == folded:
            caseless = page
        elif len(near) < 8 and folded in title:
            near.append(page.title)
    if caseless is not None:
        return caseless
    hint = f"; titles containing it: {', '.join(near)}" if near else ""
    raise AsearchError(f"no page of {source.name!r} has url or title {query!r}{hint}")


@app.command()
def show(
    spec: SpecArg = None,
    query: Annotated[
        str | None,
        typer.Argument(help="A page url or title (exact, else case-insensitive).", show_default=False),
    ] = None,
    corpus: CorpusOpt = None,
) -> None:
    """Print the page whose url or title matches QUERY (`asearch corpus show SPEC QUERY` or
    `asearch corpus show --corpus SPEC QUERY`)."""
    if corpus is not None and query is None:  # `show --corpus SPEC QUERY`: the one argument is the query
        spec, query = None, spec
    if not query:
        raise ConfigError("give a page url or title: `asearch corpus show SPEC QUERY`")
    page = find_page(open_corpus(corpus_spec(spec, corpus, usage="asearch corpus show SPEC QUERY")), query)
    stdout.print(f"[bold]{escape(page.title)}[/bold]  [dim]{escape(page.url)}[/dim]\n")
    print(page.contents)
