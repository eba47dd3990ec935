"""Wikipedia-scale retrieval on one machine: BM25 build, memory-mapped serving under 32 and 200 clients, and the
dense IVF-PQ mechanics over deterministic e5-sized vectors, at 1M / 5M / 21M passages.

The corpus is generated (deterministic, `wiki_passages`): articles of 1-20 passages (geometric, mean ~3.3), each
passage 100 words except an article's last (10-100), words from a Zipf(1.07) vocabulary of 2M entries whose top
ranks are English function words: the shape of wiki-18 (100-word chunks of articles) with a heavy-tailed
vocabulary. Lines are {"id","title","text","url"}, one url per article, so pages are articles as in ASearcher.

Every phase runs in its own process (peak RSS = that process's VmHWM). The server is `asearch serve` itself:
start-up = spawn until /health answers; RSS read from /proc after the load (anonymous and file-backed apart:
file-backed pages are the memory-mapped index, shared with the page cache and reclaimable).

    .venv/bin/python bench/wiki_scale.py --passages 20000 --requests 600          # a minute: the mechanics
    flock /tmp/asearch-heavy.lock .venv/bin/python bench/wiki_scale.py --passages 1000000
    flock /tmp/asearch-heavy.lock .venv/bin/python bench/wiki_scale.py --passages 5000000 --no-dense
    flock /tmp/asearch-heavy.lock .venv/bin/python bench/wiki_scale.py --passages 21000000 --no-bm25 \
        --dense-source generated --dense-memory-gb 2 --dense-threads 2   # no 64.5 GB flat file, no corpus

The dense mechanics take the vectors from Search-R1's flat file format through the import (`--dense-source flat`,
the default), or regenerate the same vectors by block and compress them as the import does (`generated`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from server import start_serve  # noqa: E402  (bench/server.py)
from synthetic import FUNCTION_WORDS  # noqa: E402

HERE = Path(__file__).resolve()
VOCAB = 2_000_000
ZIPF_S = 1.07
DIM = 768  # e5-base-v2


# --------------------------------------------------------------------------- the corpus


def _vocab(size: int, rng: np.random.Generator) -> np.ndarray:
    """Function words first, then distinct pronounceable tokens (vectorised: 2M words in seconds)."""
    syll = np.array([o + v for o in "b c d f g h j k l m n p r s t v w z br cl dr fl gr pl st tr sh ch".split()
                     for v in "a e i o u ai ea io ou".split()])  # fmt: skip
    words = list(dict.fromkeys(FUNCTION_WORDS))
    seen = set(words)
    while len(words) < size:
        k = min(200_000, 2 * (size - len(words)))  # in chunks: a list per candidate costs ~100 bytes
        n_syll = rng.integers(1, 5, size=k)
        parts = syll[rng.integers(len(syll), size=(k, 4))]
        for row, n in zip(parts.tolist(), n_syll.tolist(), strict=True):
            w = "".join(row[:n])
            if w not in seen:
                seen.add(w)
                words.append(w)
                if len(words) == size:
                    break
    return np.array(words, dtype=object)


def wiki_passages(n: int, seed: int = 0, vocab_size: int = VOCAB):
    """(article, title, text) for `n` passages; same seed -> same passages, generated in blocks."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(vocab_size, rng)
    cdf = np.cumsum(1.0 / np.arange(1, vocab_size + 1) ** ZIPF_S)
    cdf /= cdf[-1]
    article, left, done = -1, 0, 0
    while done < n:
        m = 20_000  # whole blocks even at the end: the first n passages of a larger corpus are this corpus
        lengths = np.full(m, 100)
        ends_article = []
        for i in range(m):
            if left == 0:
                article += 1
                left = min(20, int(rng.geometric(0.3)))
            left -= 1
            ends_article.append(article)
            if left == 0:
                lengths[i] = int(rng.integers(10, 101))
        ids = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), vocab_size - 1)
        words = vocab[ids]
        ends = np.cumsum(lengths)
        for a, e, length in zip(ends_article[: n - done], ends.tolist(), lengths.tolist(), strict=False):
            picks = [(a * 7919) % 50_000 + 200, (a * 104729) % 200_000 + 200]
            title = " ".join(vocab[[p % vocab_size for p in picks]]).title()
            yield a, title, " ".join(words[e - length : e])
        done += m


def write_corpus(path: Path, n: int, vocab_size: int = VOCAB) -> dict:
    t0 = time.perf_counter()
    with path.open("w") as f:
        for i, (a, title, text) in enumerate(wiki_passages(n, vocab_size=vocab_size)):
            f.write(json.dumps({"id": str(i), "title": title, "text": text, "url": f"https://wiki.test/{a}"}) + "\n")
    return {"seconds": round(time.perf_counter() - t0, 1), "bytes": path.stat().st_size}


# --------------------------------------------------------------------------- phases (each its own process)


class PeakAnon:
    """The process's peak anonymous memory (RssAnon, sampled every 50 ms): VmHWM also counts the pages of files
    it maps, which the kernel can drop."""

    def __enter__(self) -> PeakAnon:
        self.peak_mb, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, _proc_rss(os.getpid())["anon_mb"])
            if self._stop.wait(0.05):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def phase_build(corpus: Path, out: Path) -> dict:
    from asearch.corpus.sources import open_corpus
    from asearch.retrieval.index import IndexConfig, build_index, index_size_bytes, read_manifest

    t0 = time.perf_counter()
    # one passage per line, as wiki-18: the generator already cut 100-word passages
    cfg = IndexConfig.model_validate({"chunk": {"words": 1000}})
    with PeakAnon() as anon:
        build_index(open_corpus(str(corpus)), out, cfg, progress=False)
    m = read_manifest(out)
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": _proc_rss(os.getpid())["hwm_mb"],  # VmHWM: ru_maxrss survives exec from the parent
        "peak_anon_mb": anon.peak_mb,
        "index_bytes": index_size_bytes(m),
        "bm25_bytes": sum(v for k, v in m["files"].items() if k.startswith("bm25/")),
        "passages": m["counts"]["passages"],
        "pages": m["counts"]["pages"],
    }


class GeneratedVectors:
    """Deterministic unit vectors of e5's dimension around 4096 centres, read like a flat file (FlatVectors' reads).

    Every block of BLOCK rows is regenerated from its own seed, so the vectors need no disk: the 21M flat file
    would be 64.5 GB. `phase_flat` writes the same vectors in Search-R1's format for the import path."""

    BLOCK = 50_000

    def __init__(self, n: int):
        self.path = Path(f"<{n:,} generated vectors>")
        self.dim, self.ntotal = DIM, n
        self.centres = np.random.default_rng(7).standard_normal((4096, DIM), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return self.ntotal * self.dim * 4

    def block(self, b: int) -> np.ndarray:
        start = b * self.BLOCK
        m = min(self.BLOCK, self.ntotal - start)
        r = np.random.default_rng(start)
        x = r.standard_normal((m, DIM), dtype=np.float32)
        x *= 0.8
        x += self.centres[r.integers(4096, size=m)]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def rows(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.ntotal)
        return self.take(np.arange(start, stop))

    def take(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), DIM), dtype=np.float32)
        block_of = rows // self.BLOCK
        for b in np.unique(block_of).tolist():
            mask = block_of == b
            out[mask] = self.block(b)[rows[mask] - b * self.BLOCK]
        return out

    def blocks(self, batch: int):
        for b in range(-(-self.ntotal // self.BLOCK)):
            x = self.block(b)
            for i in range(0, len(x), batch):
                yield b * self.BLOCK + i, x[i : i + batch]


def phase_flat(path: Path, n: int) -> dict:
    """GeneratedVectors(n) written in Search-R1's flat file format."""
    from asearch.retrieval.importer import write_flat_file

    t0 = time.perf_counter()
    vectors = GeneratedVectors(n)
    write_flat_file(path, DIM, n, (block for _, block in vectors.blocks(vectors.BLOCK)))
    return {"seconds": round(time.perf_counter() - t0, 1), "bytes": path.stat().st_size}


def phase_dense_build(n: int, out: Path, memory_gb: float, threads: int) -> dict:
    """What the import does to the flat file's vectors (plan, train, add, recall against exact, write), read from
    GeneratedVectors instead of a file: the dense mechanics at a size whose flat file does not fit the disk."""
    from asearch.retrieval.importer import ImportSettings, dense_importer

    t0 = time.perf_counter()
    vectors = GeneratedVectors(n)
    settings = ImportSettings(memory_gb=memory_gb, threads=threads)
    build, report = dense_importer(vectors, settings, say=lambda line: print(line, file=sys.stderr, flush=True))
    with PeakAnon() as anon:
        dense = build(out, n)
    index_bytes = (out / "index.faiss").stat().st_size
    return _dense_result(t0, anon, report["plan"], settings, report["recall"], index_bytes, vectors.nbytes, dense)


def phase_import(flat: Path, corpus: Path, out: Path, memory_gb: float, threads: int) -> dict:
    from asearch.retrieval.importer import ImportSettings, import_flat_index

    t0 = time.perf_counter()
    settings = ImportSettings(memory_gb=memory_gb, query_model="intfloat/e5-base-v2", threads=threads)
    with PeakAnon() as anon:
        r = import_flat_index(flat, corpus, out, settings)
    dense = json.loads((out / "manifest.json").read_text())["dense"]
    return _dense_result(t0, anon, r.plan, settings, r.recall, r.index_file_bytes, r.flat_bytes, dense)


def _dense_result(t0: float, anon: PeakAnon, plan, settings, recall: float, index_bytes: int, flat_bytes: int,
                  dense: dict) -> dict:  # fmt: skip
    """A dense phase's row: its time and memory, the plan it chose, and the build's timings (`dense` record)."""
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": _proc_rss(os.getpid())["hwm_mb"],
        "peak_anon_mb": anon.peak_mb,
        "kind": plan.label(),
        "index_type": plan.kind,
        "nprobe": settings.nprobe,
        "recall": round(recall, 3),
        "index_bytes": index_bytes,
        "flat_bytes": flat_bytes,
        "train_s": dense["train_seconds"],
        "add_s": dense["add_seconds"],
        "recall_s": dense["recall_seconds"],
    }


def phase_dense_search(index_file: Path, kind: str, nprobe: int, queries: int) -> dict:
    """The written index memory-mapped as the server loads it, searched with stored-vector-like queries."""
    import faiss

    from asearch.retrieval.dense import IVF_KINDS

    faiss.omp_set_num_threads(1)
    t0 = time.perf_counter()
    index = faiss.read_index(str(index_file), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    if kind in IVF_KINDS:
        faiss.extract_index_ivf(index).nprobe = nprobe
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(3)
    q = rng.standard_normal((queries, DIM)).astype("f4")
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    lat = []
    t1 = time.perf_counter()
    for row in q:
        s = time.perf_counter()
        index.search(row[None], 5)
        lat.append(time.perf_counter() - s)
    qps = queries / (time.perf_counter() - t1)
    rss = _proc_rss(os.getpid())
    return {"load_s": round(load_s, 2), "qps": round(qps, 1), "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), **rss}


def _pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return round(s[max(0, int(np.ceil(p / 100 * len(s))) - 1)] * 1000, 2) if s else float("nan")


def _proc_rss(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) // 1024
    return {"rss_mb": fields["VmRSS"], "anon_mb": fields["RssAnon"], "file_mb": fields["RssFile"], "hwm_mb": fields["VmHWM"]}


# --------------------------------------------------------------------------- serving under load


async def _load(url: str, queries: list[str], urls: list[str], clients: int, requests: int) -> dict:
    import httpx

    todo = list(range(requests))
    lat: dict[str, list[float]] = {"/retrieve": [], "/access": []}
    counts = {"ok": 0, "shed": 0, "errors": 0}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:

        async def client() -> None:
            while todo:
                i = todo.pop()
                path = "/access" if i % 4 == 3 else "/retrieve"  # one page read per three searches
                body = {"urls": [urls[i % len(urls)]]} if path == "/access" else {"query": queries[i % len(queries)], "topk": 5}
                for _ in range(20):
                    s = time.perf_counter()
                    try:
                        r = await c.post(path, json=body)
                    except httpx.HTTPError:
                        counts["errors"] += 1  # a dropped or refused connection
                        break
                    if r.status_code in (429, 503) and "retry-after" in r.headers:
                        counts["shed"] += 1
                        await asyncio.sleep(float(r.headers["retry-after"]))
                        continue
                    if r.status_code == 200:
                        counts["ok"] += 1
                        lat[path].append(time.perf_counter() - s)
                    else:
                        counts["errors"] += 1
                    break

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        seconds = time.perf_counter() - t0
    return {
        "clients": clients,
        "qps": round(requests / seconds, 1),
        "retrieve_p50_ms": _pct(lat["/retrieve"], 50),
        "retrieve_p99_ms": _pct(lat["/retrieve"], 99),
        "access_p50_ms": _pct(lat["/access"], 50),
        "access_p99_ms": _pct(lat["/access"], 99),
        **counts,
    }


def serve_and_load(index_dir: Path, corpus: Path, clients: list[int], requests: int) -> dict:
    import httpx

    queries, urls = _queries_and_urls(corpus, 2000)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "asearch", "serve", "--index", str(index_dir), "--port", "0", "log_level=warning"]
    proc, url = start_serve(cmd)
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        startup = time.perf_counter() - t0
        idle = _proc_rss(proc.pid)
        rows = [asyncio.run(_load(url, queries, urls, n, requests)) for n in clients]
        return {"startup_s": round(startup, 2), "idle": idle, "loaded": _proc_rss(proc.pid), "rows": rows}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _queries_and_urls(corpus: Path, n: int) -> tuple[list[str], list[str]]:
    """3-6 words of passages spread over the file (read by seeking, not by reading it all)."""
    rnd = random.Random(1)
    size = corpus.stat().st_size
    queries, urls = [], []
    with corpus.open("rb") as f:
        for _ in range(n):
            f.seek(rnd.randrange(size))
            f.readline()
            line = f.readline() or (f.seek(0) or f.readline())
            rec = json.loads(line)
            words = rec["text"].split()
            k = rnd.randint(3, 6)
            start = rnd.randrange(max(1, len(words) - k))
            queries.append(" ".join(words[start : start + k]))
            urls.append(rec["url"])
    return queries, urls


# --------------------------------------------------------------------------- driver


def run_phase(name: str, **kw: str) -> dict:
    args = [sys.executable, str(HERE), "--phase", name] + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    out = subprocess.run(args, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--clients", default="32,200")
    ap.add_argument("--requests", type=int, default=4000, help="requests per client level (3 searches : 1 access)")
    ap.add_argument("--dense-memory-gb", type=float, default=0.1, help="budget of the imported dense index")
    ap.add_argument("--dense-queries", type=int, default=2000)
    ap.add_argument("--dense-threads", type=int, default=1, help="faiss threads of the import (train, add)")
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument(
        "--dense-source",
        choices=("flat", "generated"),
        default="flat",
        help="flat: write the vectors in Search-R1's flat format and run the import on it; generated: the same "
        "vectors, regenerated by block, compressed as the import does (no flat file: 21M needs 64.5 GB of disk)",
    )
    ap.add_argument("--no-bm25", action="store_true", help="only the dense mechanics (their import builds BM25 too)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary size (smaller only for quick runs)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/wiki_scale"))
    ap.add_argument("--keep", action="store_true", help="keep the corpus and indexes")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--flat", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--nprobe", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        result = {
            "build": lambda: phase_build(args.corpus, args.out),
            "flat": lambda: phase_flat(args.flat, args.passages),
            "import": lambda: phase_import(args.flat, args.corpus, args.out, args.dense_memory_gb, args.dense_threads),
            "dense_build": lambda: phase_dense_build(args.passages, args.out, args.dense_memory_gb, args.dense_threads),
            "dense_search": lambda: phase_dense_search(args.out, args.kind, args.nprobe, args.dense_queries),
        }[args.phase]()
        print(json.dumps(result))
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    n = args.passages
    work = args.workdir / str(n)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res: dict = {"passages": n}
    t0 = time.perf_counter()
    try:
        corpus = work / "wiki.jsonl"
        if not (args.no_bm25 and args.dense_source == "generated"):  # the generated vectors need no corpus
            res["corpus"] = write_corpus(corpus, n, args.vocab)
            print("corpus", res["corpus"], flush=True)
        if not args.no_bm25:
            res["build"] = run_phase("build", corpus=str(corpus), out=str(work / "idx"))
            print("build", res["build"], flush=True)
            clients = [int(c) for c in args.clients.split(",")]
            res["serve"] = serve_and_load(work / "idx", corpus, clients, args.requests)
            print("serve", res["serve"], flush=True)
            shutil.rmtree(work / "idx")  # disk: the dense import writes its own stores next
        if not args.no_dense:
            res.update(dense_phases(args, work, corpus))
    finally:
        res["total_s"] = round(time.perf_counter() - t0, 1)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(res, indent=1) + "\n")
    print(render(res))


def dense_phases(args: argparse.Namespace, work: Path, corpus: Path) -> dict:
    """The flat file imported (or, --dense-source generated, the same vectors compressed), then searched."""
    n, res = args.passages, {}
    if args.dense_source == "flat":
        flat = work / "e5_Flat.index"
        res["flat"] = run_phase("flat", flat=str(flat), passages=str(n))
        print("flat", res["flat"], flush=True)
        res["import"] = run_phase("import", flat=str(flat), corpus=str(corpus), out=str(work / "dense_idx"),
                                  dense_memory_gb=str(args.dense_memory_gb), dense_threads=str(args.dense_threads))  # fmt: skip
        index_file = work / "dense_idx" / "dense" / "index.faiss"
    else:
        res["import"] = run_phase("dense_build", passages=str(n), out=str(work / "dense"),
                                  dense_memory_gb=str(args.dense_memory_gb), dense_threads=str(args.dense_threads))  # fmt: skip
        index_file = work / "dense" / "index.faiss"
    print("import", res["import"], flush=True)
    i = res["import"]
    res["dense_search"] = run_phase("dense_search", out=str(index_file), kind=i["index_type"], nprobe=str(i["nprobe"]),
                                    dense_queries=str(args.dense_queries))  # fmt: skip
    print("dense_search", res["dense_search"], flush=True)
    return res


def render(res: dict) -> str:
    lines: list[str] = []
    if "serve" in res:
        lines += _render_bm25(res)
    if "import" in res:
        lines += _render_dense(res)
    lines.append(f"\ntotal {res['total_s']} s")
    return "\n".join(lines)


def _render_bm25(res: dict) -> list[str]:
    n, b, s = res["passages"], res["build"], res["serve"]
    lines = [
        f"BM25, {n:,} generated passages ({res['corpus']['bytes'] / 2**20:,.0f} MB jsonl, {b['pages']:,} pages), "
        f"asearch serve, one query or url per request",
        "",
        "| passages | build s | build peak RSS MB (anon) | index MB (bm25 MB) | start-up s | serving RSS MB (anon + file) "
        "| clients | req/s | /retrieve p50 / p99 ms | /access p50 / p99 ms | shed (503) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in s["rows"]:
        rss = s["loaded"]
        lines.append(
            f"| {n:,} | {b['seconds']} | {b['peak_rss_mb']} ({b.get('peak_anon_mb', '-')}) | {b['index_bytes'] / 2**20:,.0f} ({b['bm25_bytes'] / 2**20:,.0f}) "
            f"| {s['startup_s']} | {rss['rss_mb']} ({rss['anon_mb']} + {rss['file_mb']}) | {row['clients']} | {row['qps']} "
            f"| {row['retrieve_p50_ms']} / {row['retrieve_p99_ms']} | {row['access_p50_ms']} / {row['access_p99_ms']} "
            f"| {row['shed']} | {row['errors']} |"
        )
    return lines


def _render_dense(res: dict) -> list[str]:
    n, i, d = res["passages"], res["import"], res["dense_search"]
    if "flat" in res:
        source = f"in Search-R1's flat format ({res['flat']['bytes'] / 2**20:,.0f} MB), `asearch index import` at a budget"
    else:
        source = (f"regenerated by block (no flat file; it would be {i['flat_bytes'] / 2**20:,.0f} MB), compressed "
                  "at a budget as `asearch index import` does")  # fmt: skip
    return [
        "",
        f"Dense mechanics, {n:,} deterministic {DIM}-d unit vectors {source}, then the index memory-mapped:",
        "",
        "| passages | kind | import s (train / add) | import peak RSS MB (anon) | index MB | / flat | recall@10 vs flat "
        "| load s | QPS (1 thread) | p50 / p99 ms | search RSS MB (anon + file) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {n:,} | {i['kind']} | {i['seconds']} ({i['train_s']} / {i['add_s']}) | {i['peak_rss_mb']} ({i.get('peak_anon_mb', '-')}) "
        f"| {i['index_bytes'] / 2**20:,.0f} | {i['index_bytes'] / i['flat_bytes']:.3f} | {i['recall']} | {d['load_s']} "
        f"| {d['qps']} | {d['p50_ms']} / {d['p99_ms']} | {d['rss_mb']} ({d['anon_mb']} + {d['file_mb']}) |",
    ]


if __name__ == "__main__":
    main()
