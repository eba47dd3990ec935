"""Retrieval server benchmark: QPS of 32 concurrent HTTP clients with micro-batching vs without, vs in-process.

Builds a synthetic BM25 index (bench/retrieval.py's Zipf passages), then serves it with `asearch serve` in a
subprocess twice: batching on (the default) and off (`max_batch=1`, one query per retriever call: the
behaviour of a server that serialises requests behind one lock). Prints one table with the ratio.

    .venv/bin/python bench/server.py                      # 20k passages, 1,024 queries, 32 clients
    .venv/bin/python bench/server.py --passages 100000 --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import synth_passages  # noqa: E402  (the engine bench's corpus generator)

TOPK = 5


def build(tmp: Path, n: int, method: str) -> Path:
    from asearch.corpus.sources import open_corpus
    from asearch.retrieval.dense import DenseConfig
    from asearch.retrieval.index import IndexConfig, build_index

    corpus = tmp / "synth.jsonl"
    with corpus.open("w") as f:
        for i, text in enumerate(synth_passages(n, seed=0)):
            f.write(
                json.dumps({"id": str(i), "title": f"P{i}", "text": text, "url": f"https://s.test/{i}"})
                + "\n"
            )
    cfg = IndexConfig(dense=DenseConfig() if method != "bm25" else None)
    return build_index(open_corpus(str(corpus)), tmp / "idx", cfg, progress=False)


def queries_for(n: int) -> list[str]:
    texts = list(synth_passages(n, seed=1))
    return [" ".join(t.split()[3:7]) for t in texts]


def in_process(index_dir: Path, queries: list[str], method: str) -> tuple[float, float]:
    from asearch.retrieval.index import open_index

    r = open_index(index_dir).retriever(method)
    r.search(queries[:8], TOPK)  # warm up
    t0 = time.perf_counter()
    for q in queries:
        r.search([q], TOPK)
    one_by_one = len(queries) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    r.search(queries, TOPK)
    one_batch = len(queries) / (time.perf_counter() - t0)
    return one_by_one, one_batch


async def hammer(url: str, queries: list[str], clients: int) -> tuple[float, dict]:
    todo = list(queries)
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=clients)
    ) as c:
        await c.post("/retrieve", json={"queries": queries[:8], "topk": TOPK})  # warm up

        async def client() -> None:
            while todo:
                q = todo.pop()
                r = await c.post("/retrieve", json={"query": q, "topk": TOPK})
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        qps = len(queries) / (time.perf_counter() - t0)
        stats = (await c.get("/stats")).json()
    return qps, stats


def start_serve(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """`asearch serve ... --port 0` started, and the url it prints once it has picked its port."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    url = None
    while url is None:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            raise SystemExit("asearch serve exited before printing its url")
        m = re.search(r"server at (http://[\d.]+:\d+)", line)
        url = m.group(1) if m else None
    return proc, url


def served(
    index_dir: Path, queries: list[str], clients: int, method: str, overrides: list[str]
) -> tuple[float, dict]:
    cmd = [
        sys.executable,
        "-m",
        "asearch",
        "serve",
        "--index",
        str(index_dir),
        "--method",
        method,
        "--port",
        "0",
    ]
    cmd.append("log_level=warning")
    proc, url = start_serve([*cmd, *overrides])
    try:
        for _ in range(600):
            try:
                httpx.get(url + "/health")
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        return asyncio.run(hammer(url, queries, clients))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run(passages: int, queries_n: int, clients: int, method: str = "bm25") -> str:
    """The whole measurement; returns the table (markdown) and the ratio lines."""
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = build(Path(tmp), passages, method)
        queries = queries_for(queries_n)
        seq_qps, batch_qps = in_process(index_dir, queries, method)
        off_qps, off_stats = served(index_dir, queries, clients, method, ["max_batch=1"])
        on_qps, on_stats = served(index_dir, queries, clients, method, [])
        zero_qps, zero_stats = served(index_dir, queries, clients, method, ["batch_window_ms=0"])
    p = lambda s: s["endpoints"]["/retrieve"]["latency_ms"]  # noqa: E731
    lines = [
        f"{method}: {passages:,} passages, {queries_n:,} queries, {clients} clients, topk {TOPK}",
        "",
        "| mode | QPS | p50 ms | p99 ms | mean batch |",
        "|---|---|---|---|---|",
        f"| in-process, one query per call | {seq_qps:,.0f} | | | 1 |",
        f"| in-process, one call for all | {batch_qps:,.0f} | | | {queries_n} |",
    ]
    rows = (
        ("HTTP, batching off (max_batch=1)", off_qps, off_stats),
        ("HTTP, batching on (default window)", on_qps, on_stats),
        ("HTTP, batching on, window 0 ms", zero_qps, zero_stats),
    )
    for name, qps, st in rows:
        b = st["batching"]
        lines.append(
            f"| {name} | {qps:,.0f} | {p(st)['p50']} | {p(st)['p99']} | {b['queries'] / max(1, b['batches']):.1f} |"
        )
    lines += [
        "",
        f"- server (batching on, {clients} clients) / in-process one query per call: {on_qps / seq_qps:.2f}x",
        f"- batching on / off: {on_qps / off_qps:.2f}x; window 0 / off: {zero_qps / off_qps:.2f}x",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=1_024)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument(
        "--method", choices=("bm25", "dense"), default="bm25", help="dense: bundled MiniLM, 1 thread"
    )
    args = ap.parse_args()
    print(run(args.passages, args.queries, args.clients, args.method))


if __name__ == "__main__":
    main()
