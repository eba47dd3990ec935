"""BM25 engine benchmark: build time, QPS, latency and peak RSS of tantivy, bm25s and rank-bm25 on synthetic passages.

One run prints one table (also written to bench/results/retrieval.md). Every engine phase runs in its own
subprocess so peak RSS is per engine and per phase (build, then serve from disk). The `asearch` row is the
production path end to end: `build_index` over a CorpusSource, then `open_index(...).retriever("bm25")`
returning SearchHits with passages read from the store.

    .venv/bin/python bench/retrieval.py --sizes 20000            # quick look, < 1 min
    .venv/bin/python bench/retrieval.py                          # full run: 100k and 1M passages

The same run ends with the retrieval server's end-to-end QPS: 32 concurrent HTTP clients against `asearch serve`
(micro-batching on and off) beside in-process search on the same index (bench/server.py; `--server-passages 0`
skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from synthetic import synth_passages  # bench/synthetic.py, beside this file

ENGINES = ("asearch", "tantivy", "bm25s", "rank-bm25")
TOPK = 10

# --------------------------------------------------------------------------- synthetic data


def synth_queries(passages_file: Path, n: int, seed: int) -> list[str]:
    """Queries of 3-6 words picked from random passages (a mix of common and rare words, like real queries)."""
    rng = np.random.default_rng(seed + 1)
    n_lines = sum(1 for _ in _lines(passages_file))
    wanted = np.sort(rng.integers(0, n_lines, size=n))
    picked: list[str] = []
    j = 0
    for i, line in enumerate(
        _lines(passages_file)
    ):  # stream: the driver stays small, so workers' RSS is theirs
        while j < n and wanted[j] == i:
            picked.append(line)
            j += 1
    order = rng.permutation(n)
    out = []
    for line in (picked[i] for i in order):
        words = line.split()
        k = int(rng.integers(3, 7))
        out.append(" ".join(words[j] for j in sorted(rng.choice(len(words), size=k, replace=False))))
    return out


# --------------------------------------------------------------------------- engines (run in a worker process)


def _peak_rss_mb() -> float:
    """Peak RSS of this process image. VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so a
    worker spawned by a big driver would report the driver's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def _tantivy_analyzer():
    import tantivy

    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stopword("english"))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


class TantivyEngine:
    """Raw tantivy: analyse with the same analyzer as the index, OR the terms, read the pid fast field."""

    def build(self, corpus: Path, index: Path, threads: int) -> None:
        import tantivy

        index.mkdir(parents=True)
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("contents", stored=False, tokenizer_name="en", index_option="freq")
        sb.add_unsigned_field("pid", stored=False, indexed=False, fast=True)
        idx = tantivy.Index(sb.build(), path=str(index))
        idx.register_tokenizer("en", _tantivy_analyzer())
        writer = idx.writer(heap_size=128_000_000 * threads, num_threads=threads)
        for i, text in enumerate(_lines(corpus)):
            doc = tantivy.Document()
            doc.add_text("contents", text)
            doc.add_unsigned("pid", i)
            writer.add_document(doc)
        writer.commit()
        writer.wait_merging_threads()

    def load(self, index: Path) -> None:
        import tantivy

        self._t = tantivy
        idx = tantivy.Index.open(str(index))
        self.schema = idx.schema
        self.searcher = idx.searcher()
        self.analyzer = _tantivy_analyzer()

    def search(self, queries: list[str], k: int) -> list[list[int]]:
        t = self._t
        out = []
        for q in queries:
            terms = self.analyzer.analyze(q)
            if not terms:
                out.append([])
                continue
            query = t.Query.boolean_query(
                [
                    (t.Occur.Should, t.Query.term_query(self.schema, "contents", w, index_option="freq"))
                    for w in terms
                ]
            )
            hits = self.searcher.search(query, k, count=False).hits
            out.append(self.searcher.fast_field_values("pid", [a for _, a in hits]))
        return out


class Bm25sEngine:
    """bm25s with its own tokenizer (PyStemmer english, english stopwords), numpy backend, saved + mmap-loaded."""

    def build(self, corpus: Path, index: Path, threads: int) -> None:
        import bm25s
        import Stemmer
        from bm25s.tokenization import Tokenized, Tokenizer

        tok = Tokenizer(stemmer=Stemmer.Stemmer("english"), stopwords="en")
        ids = list(tok.streaming_tokenize(_lines(corpus)))  # bm25s indexes from all token ids held in memory
        model = bm25s.BM25(k1=1.2, b=0.75)
        model.index(Tokenized(ids=ids, vocab=tok.get_vocab_dict()), show_progress=False)
        del ids
        model.save(str(index), show_progress=False)
        tok.save_vocab(str(index))
        tok.save_stopwords(str(index))

    def load(self, index: Path) -> None:
        import bm25s
        import Stemmer
        from bm25s.tokenization import Tokenizer

        self.model = bm25s.BM25.load(str(index), mmap=True, show_progress=False)
        self.tok = Tokenizer(stemmer=Stemmer.Stemmer("english"), stopwords="en")
        self.tok.load_vocab(str(index))
        self.tok.load_stopwords(str(index))

    def search(self, queries: list[str], k: int) -> list[list[int]]:
        toks = self.tok.tokenize(queries, update_vocab=False, return_as="string", show_progress=False)
        docs, _ = self.model.retrieve(toks, k=k, show_progress=False, n_threads=0)
        return [list(map(int, row)) for row in docs]


class RankBm25Engine:
    """rank-bm25 BM25Okapi (the baseline). Tokens: same regex, stopwords and stemmer as bm25s, fed as a stream."""

    def build(self, corpus: Path, index: Path, threads: int) -> None:
        import re

        import Stemmer
        from bm25s.stopwords import STOPWORDS_EN
        from rank_bm25 import BM25Okapi

        stemmer, stop, pat = Stemmer.Stemmer("english"), set(STOPWORDS_EN), re.compile(r"(?u)\b\w\w+\b")
        interned: dict[str, str] = {}  # share one str object per token type, or 80M strings blow the RAM up

        def tokens(text: str) -> list[str]:
            ws = [w for w in pat.findall(text.lower()) if w not in stop]
            return [interned.setdefault(w, w) for w in stemmer.stemWords(ws)]

        self._tokens = tokens
        self.model = BM25Okapi(tokens(t) for t in _lines(corpus))

    def load(self, index: Path) -> None:  # rank-bm25 has no on-disk format: it serves from the build process
        pass

    def search(self, queries: list[str], k: int) -> list[list[int]]:
        out = []
        for q in queries:
            scores = self.model.get_scores(self._tokens(q))
            top = np.argpartition(-scores, k)[:k]
            out.append([int(i) for i in top[np.argsort(-scores[top], kind="stable")]])
        return out


class AsearchEngine:
    """The production path: build_index over a CorpusSource, open_index, BM25Retriever returning SearchHits."""

    def build(self, corpus: Path, index: Path, threads: int) -> None:
        from asearch.retrieval.index import IndexConfig, build_index

        cfg = IndexConfig.model_validate({"bm25": {"threads": threads}})
        shutil.rmtree(index, ignore_errors=True)
        build_index(_FileSource(corpus), index, cfg, progress=False)

    def load(self, index: Path) -> None:
        from asearch.retrieval.index import open_index

        self.index = open_index(index)
        self.retriever = self.index.retriever("bm25")

    def search(self, queries: list[str], k: int) -> list[list[int]]:
        return [
            [int(h.passage.id[1:].split("#")[0]) for h in hits] for hits in self.retriever.search(queries, k)
        ]

    def page_lookups(self, n_lookups: int = 2000) -> dict[str, float]:
        """url -> page: the on-disk sorted-hash index vs a {url: offset} dict built at load, same lookups."""
        import psutil

        from asearch.retrieval.store import PageStoreFile

        n = len(self.index.pages)
        urls = [f"https://synthetic.example/{i}" for i in np.random.default_rng(0).integers(0, n, n_lookups)]
        t0 = time.perf_counter()
        store = PageStoreFile(self.index.path, expected=n)
        open_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        assert all(store.get(u) is not None for u in urls)
        hash_us = (time.perf_counter() - t0) / n_lookups * 1e6
        rss0 = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        offsets: dict[str, int] = {}
        with open(self.index.path / "pages.jsonl", "rb") as f:
            pos = 0
            for line in f:
                offsets.setdefault(json.loads(line)["url"], pos)
                pos += len(line)
        dict_s = time.perf_counter() - t0
        dict_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
        with open(self.index.path / "pages.jsonl", "rb") as f:
            t0 = time.perf_counter()
            for u in urls:
                f.seek(offsets[u])
                json.loads(f.readline())
            dict_us = (time.perf_counter() - t0) / n_lookups * 1e6
        return {"page_open_ms": open_ms, "page_hash_us": hash_us, "page_dict_build_s": dict_s,
                "page_dict_mb": dict_mb, "page_dict_us": dict_us}  # fmt: skip


class _FileSource:
    """A CorpusSource over the synthetic passage file: one document (and one page) per line."""

    def __init__(self, path: Path):
        self.path, self.name = path, f"synthetic:{path.name}"

    def documents(self):
        from asearch.corpus.types import Document

        for i, text in enumerate(_lines(self.path)):
            yield Document(id=f"p{i}", title=text[:24], text=text, url=f"https://synthetic.example/{i}")

    def pages(self):
        from asearch.corpus.types import Page

        for d in self.documents():
            yield Page(url=d.url, title=d.title, contents=d.text)

    def fingerprint(self) -> str:
        st = self.path.stat()
        return f"{st.st_size}-{int(st.st_mtime)}"


def make_engine(name: str):
    return {
        "asearch": AsearchEngine,
        "tantivy": TantivyEngine,
        "bm25s": Bm25sEngine,
        "rank-bm25": RankBm25Engine,
    }[name]()


def _time_queries(engine, queries: list[str], k: int) -> dict[str, float]:
    engine.search(
        queries[: min(20, len(queries))], k
    )  # warm caches / mmap pages the same way for all engines
    t0 = time.perf_counter()
    batched = engine.search(queries, k)
    batched_s = time.perf_counter() - t0
    lat = []
    for q in queries:
        t = time.perf_counter()
        engine.search([q], k)
        lat.append(time.perf_counter() - t)
    lat_ms = np.array(lat) * 1000
    return {
        "qps_batched": len(queries) / batched_s,
        "qps_single": len(queries) / (lat_ms.sum() / 1000),
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "n_queries": len(queries),
        "nonempty": sum(1 for r in batched if r),
    }


def worker(args: argparse.Namespace) -> None:
    """One engine, one phase, one process: prints a JSON line with its measurements."""
    engine = make_engine(args.engine)
    queries = json.loads(Path(args.queries_file).read_text())[: args.n] if args.queries_file else []
    out: dict[str, float] = {}
    if args.phase in ("build", "both"):
        t0 = time.perf_counter()
        engine.build(Path(args.corpus), Path(args.index), args.threads)
        out["build_s"] = time.perf_counter() - t0
        out["build_rss_mb"] = _peak_rss_mb()
        if Path(args.index).exists():
            out["size_mb"] = _dir_mb(Path(args.index))
    if args.phase in ("query", "both"):
        rss_before = _peak_rss_mb()
        t0 = time.perf_counter()
        engine.load(Path(args.index))
        out["load_s"] = time.perf_counter() - t0
        out.update(_time_queries(engine, queries, TOPK))
        out["serve_rss_mb"] = _peak_rss_mb() if args.phase == "query" else max(rss_before, _peak_rss_mb())
        if hasattr(engine, "page_lookups"):  # after serve_rss_mb: the dict alternative must not inflate it
            out.update(engine.page_lookups())
    print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------- driver


def _run_worker(**kw: object) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker"]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker {kw} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def bench_size(n: int, args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    corpus = tmp / f"passages_{n}.txt"
    t0 = time.perf_counter()
    with open(corpus, "w", encoding="utf-8") as f:
        for text in synth_passages(n, args.seed):
            f.write(text + "\n")
    queries_file = tmp / f"queries_{n}.json"
    queries_file.write_text(json.dumps(synth_queries(corpus, args.queries, args.seed)))
    print(f"[{n:,} passages] generated in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    rows = []
    for engine in args.engines:
        index = tmp / f"{engine}_{n}"
        common = dict(
            engine=engine, corpus=corpus, index=index, queries_file=queries_file, threads=args.threads
        )
        if engine == "rank-bm25":  # no on-disk index: build and query in one process, on a query sample
            r = _run_worker(phase="both", n=args.baseline_queries, **common)
        else:
            r = _run_worker(phase="build", n=0, **common)
            r.update(_run_worker(phase="query", n=args.queries, **common))
            shutil.rmtree(index, ignore_errors=True)
        r.update(engine=engine, passages=n)
        rows.append(r)
        print(f"[{n:,} passages] {engine}: {json.dumps(r)}", file=sys.stderr, flush=True)
    corpus.unlink()
    return rows


def render(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    def f(v: object, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    head = (
        "| passages | engine | build s | index MB | build peak RSS MB | load s | serve peak RSS MB "
        "| QPS batched | QPS single | p50 ms | p99 ms | queries |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['passages']:,} | {r['engine']} | {f(r.get('build_s'), '.1f')} | {f(r.get('size_mb'), '.0f')} "
            f"| {f(r.get('build_rss_mb'), '.0f')} | {f(r.get('load_s'), '.2f')} | {f(r.get('serve_rss_mb'), '.0f')} "
            f"| {f(r.get('qps_batched'), '.1f')} | {f(r.get('qps_single'), '.1f')} | {f(r.get('p50_ms'), '.2f')} "
            f"| {f(r.get('p99_ms'), '.2f')} | {r.get('n_queries')} |"
        )
    lines.append("")
    for n in args.sizes:
        by = {r["engine"]: r for r in rows if r["passages"] == n}
        base = by.get("rank-bm25")
        for eng in ("asearch", "tantivy", "bm25s"):
            if base and eng in by:
                lines.append(
                    f"- {n:,} passages: {eng} / rank-bm25 QPS = "
                    f"{by[eng]['qps_batched'] / base['qps_batched']:.0f}x batched, "
                    f"{by[eng]['qps_single'] / base['qps_single']:.0f}x single"
                )
    pages = [r for r in rows if "page_hash_us" in r]
    if pages:
        lines += ["", "| passages | page lookup | open | per lookup | extra RSS |", "|---|---|---|---|---|"]
        for r in pages:
            lines.append(f"| {r['passages']:,} | sorted-hash index, mmap (asearch) | {r['page_open_ms']:.1f} ms "
                         f"| {r['page_hash_us']:.1f} µs | ~0 |")  # fmt: skip
            lines.append(f"| {r['passages']:,} | {{url: offset}} dict built at load | {r['page_dict_build_s']:.2f} s "
                         f"| {r['page_dict_us']:.1f} µs | {r['page_dict_mb']:.0f} MB |")  # fmt: skip
    lines.append(
        f"\nSynthetic Zipf(1.0) passages of 60-100 words, 100k-word vocabulary, seed {args.seed}; queries of "
        f"3-6 words from random passages; top-{TOPK}; {args.threads} thread(s) per engine; rank-bm25 QPS from "
        f"{args.baseline_queries} queries. asearch = production BM25Retriever (tantivy) incl. passage fetch. "
        f"Peak RSS = VmHWM of the build process and of a fresh serving process (includes mmap-ed pages touched)."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100000,1000000", help="comma-separated passage counts")
    p.add_argument("--queries", type=int, default=1000, help="queries timed per fast engine")
    p.add_argument("--baseline-queries", type=int, default=20, help="queries timed for rank-bm25 (slow)")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/retrieval.md")
    p.add_argument("--tmp", default=None, help="scratch dir (default: a temp dir)")
    p.add_argument("--server-passages", type=int, default=100_000, help="index size of the server part (0: skip)")
    p.add_argument("--server-clients", type=int, default=32)
    # worker-only flags
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--index", help=argparse.SUPPRESS)
    p.add_argument("--queries-file", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"unknown engine(s) {sorted(unknown)}; choose from {ENGINES}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix="asearch-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        rows = [r for n in args.sizes for r in bench_size(n, args, tmp)]
    finally:
        if not args.tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    table = render(rows, args)
    if args.server_passages:
        from server import run as server_run  # bench/server.py, beside this file

        print(f"[server] {args.server_passages:,} passages, {args.server_clients} clients", file=sys.stderr, flush=True)
        table += "\n\n## Retrieval server, end to end\n\n" + server_run(
            args.server_passages, args.queries, args.server_clients
        )
    table += f"\nTotal bench wall time {time.perf_counter() - t0:.0f}s."
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Retrieval benchmark (bench/retrieval.py)\n\n" + table + "\n")


if __name__ == "__main__":
    main()
