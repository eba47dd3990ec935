"""`asearch index build | info | search`: build a versioned index dir from a corpus, inspect it, query it."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from asearch.cli.console import (
    CORPUS_OPTION_HELP,
    ConfigOption,
    console,
    corpus_spec,
    overrides_argument,
    split_corpus_from_overrides,
)

if TYPE_CHECKING:
    from asearch.retrieval.importer import ImportResult

app = typer.Typer(help="Build, inspect and query retrieval indexes.", no_args_is_help=True)


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:,.1f} MB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:,.1f} KB"


@app.command()
def build(
    out: Annotated[Path, typer.Option("--out", help="Index directory to create.", file_okay=False)],
    corpus: Annotated[str | None, typer.Option("--corpus", help=CORPUS_OPTION_HELP, show_default=False)] = None,
    dense: Annotated[bool, typer.Option("--dense", help="Also build a dense (faiss) index.")] = False,
    dense_model: Annotated[
        str | None,
        typer.Option("--dense-model", help="sentence-transformers name or path (implies --dense)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing index at --out.")] = False,
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Build an index of a corpus without passages (else an error).")
    ] = False,
    config: ConfigOption = None,
    overrides: Annotated[list[str] | None, overrides_argument("chunk.words=80 bm25.stemmer=null", corpus=True)] = None,
) -> None:
    """Stream a corpus into passages + BM25 (+ dense) and write the index directory atomically.

    The corpus is --corpus SPEC or the first argument that is not an override, as in `asearch corpus info`:
    `asearch index build --corpus world --out DIR` = `asearch index build world --out DIR`.
    """
    from asearch.config import load_config
    from asearch.corpus import open_corpus
    from asearch.retrieval.dense import DenseConfig
    from asearch.retrieval.index import IndexConfig, build_index, index_size_bytes, read_manifest

    positional, overrides = split_corpus_from_overrides(overrides or [])
    spec = corpus_spec(positional, corpus, usage="asearch index build --corpus SPEC --out DIR")
    cfg = load_config(IndexConfig, config, overrides)
    if (dense or dense_model) and cfg.dense is None:
        cfg.dense = DenseConfig()
    if dense_model and cfg.dense is not None:
        cfg.dense.model = dense_model
    source = open_corpus(spec, allow_empty=allow_empty)
    command = (
        shlex.join(["asearch", "index", *sys.argv[sys.argv.index("build") :]])
        if "build" in sys.argv
        else None
    )
    dense_desc = "off" if cfg.dense is None else f"{cfg.dense.model} ({cfg.dense.index_type})"
    console.print(
        f"[bold]corpus[/bold] {escape(source.name)}  [bold]chunk[/bold] {cfg.chunk.words} words, overlap "
        f"{cfg.chunk.overlap}  [bold]bm25[/bold] tantivy, stemmer={cfg.bm25.stemmer}, "
        f"stopwords={cfg.bm25.stopwords if isinstance(cfg.bm25.stopwords, str | None) else 'custom'}  "
        f"[bold]dense[/bold] {escape(dense_desc)}"
    )
    t0 = time.perf_counter()
    path = build_index(
        source, out, cfg, progress=True, overwrite=force, build_command=command, allow_empty=allow_empty
    )
    seconds = time.perf_counter() - t0
    m = read_manifest(path)
    c = m["counts"]
    console.print(
        f"[green]built[/green] {escape(str(path))}: {c['passages']:,} passages from {c['documents']:,} documents, "
        f"{c['pages']:,} pages; {seconds:.1f}s ({c['passages'] / max(seconds, 1e-9):,.0f} passages/s); "
        f"{_mb(index_size_bytes(m))} on disk"
    )
    skipped = {k: v for k, v in c.items() if k.startswith(("duplicate", "empty", "passage_urls")) and v}
    if skipped:
        console.print(f"[yellow]note[/yellow]: {skipped}")
    for note in (m.get("dense") or {}).get("notes", []):
        console.print(f"[yellow]dense[/yellow]: {escape(note)}")


@app.command()
def info(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Show an index's corpus, settings, counts, sizes, versions and load time."""
    from asearch.retrieval.index import index_size_bytes, open_index

    t0 = time.perf_counter()
    index = open_index(path)
    load_s = time.perf_counter() - t0
    m = index.manifest
    t = Table(show_header=False, box=None)
    t.add_row("path", escape(str(index.path)))
    t.add_row("format", f"{m['format']} v{m['format_version']}, created {m['created']}")
    t.add_row(
        "corpus", f"{escape(m['corpus']['name'])}  fingerprint {escape(str(m['corpus']['fingerprint']))}"
    )
    for k, v in m["counts"].items():
        t.add_row(k, f"{v:,}")
    t.add_row("size on disk", _mb(index_size_bytes(m)))
    t.add_row("build time", f"{m['build_seconds']:.1f}s")
    s = m["settings"]
    t.add_row("chunk", str(s["chunk"]))
    t.add_row("bm25", f"{m['bm25']}  {s['bm25']}")
    dense = m.get("dense")
    t.add_row(
        "dense", "off" if dense is None else escape(str({k: v for k, v in dense.items() if k != "notes"}))
    )
    t.add_row("versions", escape(str(m["versions"])))
    t.add_row("build command", escape(m.get("build_command", "")))
    t.add_row("open time", f"{load_s * 1000:.1f} ms (stores memory-mapped; engines load on first search)")
    console.print(t)
    index.close()


@app.command()
def search(
    path: Annotated[Path, typer.Argument(help="Index directory.")],
    query: Annotated[str, typer.Argument(help="Query text.")],
    topk: Annotated[int, typer.Option("--topk", "-k", min=1, help="Hits to show.")] = 5,
    method: Annotated[
        str, typer.Option("--method", help="Search method: bm25 | dense | hybrid (or a registered one).")
    ] = "bm25",
) -> None:
    """Run one query and print the ranked passages (a quick look, not an API)."""
    from asearch.retrieval.index import open_index

    index = open_index(path)
    t0 = time.perf_counter()
    retriever = index.retriever(method)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    hits = retriever.search([query], topk)[0]
    search_ms = (time.perf_counter() - t1) * 1000
    t = Table("#", "score", "id", "title", "text", "url", show_lines=False)
    for i, h in enumerate(hits, start=1):
        p = h.passage
        text = p.text if len(p.text) <= 120 else p.text[:117] + "..."
        t.add_row(str(i), f"{h.score:.3f}", escape(p.id), escape(p.title), escape(text), escape(p.url))
    console.print(t)
    console.print(
        f"{len(hits)} hits, {method}, search {search_ms:.1f} ms (retriever load {load_s:.2f}s)"
        + ("" if hits else " - no indexable term, or nothing matched")
    )
    index.close()


@app.command("import")
def import_(
    flat: Annotated[Path, typer.Argument(help="The peer's flat faiss index (Search-R1/ASearcher e5_Flat.index).")],
    corpus: Annotated[
        Path, typer.Option("--corpus", help="Its corpus jsonl, line i = vector i (wiki-18.jsonl, wiki_corpus.jsonl).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Index directory to create.", file_okay=False)],
    memory_gb: Annotated[
        float, typer.Option("--memory-gb", min=0.0, help="RAM budget (GiB) of the dense index; picks its compression.")
    ],
    pages: Annotated[
        Path | None, typer.Option("--pages", help="Pages jsonl for /access (ASearcher's wiki_webpages.jsonl).")
    ] = None,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Force flat, ivfsq8, opq_ivfpq or ivfpq (default: best that fits).")
    ] = None,
    query_model: Annotated[str, typer.Option("--query-model", help="Query encoder the index was built with.")] = (
        "intfloat/e5-base-v2"
    ),
    query_prefix: Annotated[str, typer.Option("--query-prefix", help="Prepended to queries.")] = "query: ",
    passage_prefix: Annotated[str, typer.Option("--passage-prefix", help="Recorded: the passages' prefix.")] = (
        "passage: "
    ),
    nlist: Annotated[int | None, typer.Option("--nlist", min=1, help="IVF cells (default ~4 sqrt(n)).")] = None,
    nprobe: Annotated[int, typer.Option("--nprobe", min=1, help="IVF cells visited per query.")] = 32,
    train_size: Annotated[int, typer.Option("--train-size", min=256, help="Vectors sampled to train.")] = 100_000,
    queries: Annotated[
        str | None,
        typer.Option("--queries", help="Dataset whose questions measure recall (default: stored vectors)."),
    ] = None,
    recall_queries: Annotated[int, typer.Option("--recall-queries", min=1, help="Queries for recall@10.")] = 200,
    threads: Annotated[int, typer.Option("--threads", min=1, help="faiss and torch threads.")] = 1,
    device: Annotated[str, typer.Option("--device", help="Where the server runs the query encoder: cpu, cuda.")] = "cpu",
    rerank: Annotated[
        bool, typer.Option("--rerank", help="Serve re-scoring candidates with the flat file's exact vectors (kept on disk).")
    ] = False,
    rerank_candidates: Annotated[int, typer.Option("--rerank-candidates", min=1, help="Candidates re-scored.")] = 100,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing index at --out.")] = False,
) -> None:
    """Bring a peer's flat e5 index over, compressed to --memory-gb; prints recall@10 against the flat one.

    `asearch index import e5_Flat.index --corpus wiki-18.jsonl --out idx/wiki18 --memory-gb 4`
    """
    from asearch.retrieval.importer import ImportSettings, import_flat_index, read_flat_header

    questions = None
    if queries is not None:
        from asearch.eval.datasets import load_dataset

        questions = [r.question for r in load_dataset(queries, limit=recall_queries)]
    settings = ImportSettings(
        memory_gb=memory_gb, query_model=query_model, query_prefix=query_prefix, passage_prefix=passage_prefix,
        kind=kind, nlist=nlist, nprobe=nprobe, train_size=train_size, recall_queries=recall_queries,
        queries=questions, threads=threads, device=device, rerank=rerank, rerank_candidates=rerank_candidates,
    )  # fmt: skip
    head = read_flat_header(flat)
    console.print(
        f"[bold]flat[/bold] {escape(str(flat))}: {head.ntotal:,} vectors x {head.dim} ({_mb(head.nbytes)})  "
        f"[bold]corpus[/bold] {escape(str(corpus))}  [bold]budget[/bold] {memory_gb:g} GiB"
    )
    command = shlex.join(["asearch", "index", *sys.argv[sys.argv.index("import") :]]) if "import" in sys.argv else None
    t0 = time.perf_counter()
    result = import_flat_index(
        flat, corpus, out, settings, pages_path=pages, overwrite=force, progress=True, build_command=command,
        say=lambda line: console.print(escape(line)),
    )  # fmt: skip
    _print_import(result, flat, time.perf_counter() - t0, rerank_candidates)


def _print_import(result: ImportResult, flat: Path, seconds: float, rerank_candidates: int) -> None:
    """What `index import` made: passages, time, size on disk and against the flat file, recall@10."""
    from asearch.retrieval.index import index_size_bytes, read_manifest

    m = read_manifest(result.path)
    console.print(
        f"[green]imported[/green] {escape(str(result.path))}: {m['counts']['passages']:,} passages, "
        f"{seconds:.1f}s, {_mb(index_size_bytes(m))} on disk"
    )
    console.print(
        f"dense {escape(result.plan.label())}: {_mb(result.index_file_bytes)} against {_mb(result.flat_bytes)} flat "
        f"({result.index_file_bytes / max(1, result.flat_bytes):.3f}x)"
    )
    console.print(f"recall@10 against flat: {result.recall:.3f} ({escape(result.recall_on)})")
    if result.recall_reranked is not None:
        console.print(
            f"recall@10 with the top {rerank_candidates} re-scored from {escape(str(flat))}: {result.recall_reranked:.3f} "
            "(the server reads that file: keep it where it is)"
        )
