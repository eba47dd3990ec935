"""One trainer-sized /retrieve POST: B queries in one request to `asearch serve`, as a GRPO step sends them.

Builds a synthetic BM25 index (bench/synthetic.py's Zipf passages), serves it in a subprocess for each
`max_batch` given, posts one request of B queries (one of them 5,000 characters long, which the server cuts
to max_query_chars and counts), and prints the wall time, the retriever calls it took, the largest one,
the truncated count and the server's peak RSS.

    .venv/bin/python bench/retrieve_batch.py                                # 20k passages, 8,192 queries
    .venv/bin/python bench/retrieve_batch.py --queries 16384 --max-batch 256 16384
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server import build, queries_for  # noqa: E402  (the server bench's index and queries)

TOPK = 3  # Search-R1's default


def serve(index_dir: Path, max_batch: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "asearch", "serve", "--index", str(index_dir), "--port", "0",
           "log_level=warning", f"max_batch={max_batch}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"server at (http://127\.0\.0\.1:\d+)", line):
            url = m.group(1)
            break
    else:
        raise RuntimeError("asearch serve did not print its url")
    for _ in range(600):
        try:
            httpx.get(url + "/health", timeout=5)
            return proc, url
        except httpx.ConnectError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer /health")


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def one_post(index_dir: Path, queries: list[str], max_batch: int) -> dict[str, float]:
    proc, url = serve(index_dir, max_batch)
    try:
        httpx.post(url + "/retrieve", json={"queries": queries[:8], "topk": TOPK}, timeout=60)  # warm up
        t0 = time.perf_counter()
        r = httpx.post(url + "/retrieve", json={"queries": queries, "topk": TOPK}, timeout=600)
        wall = time.perf_counter() - t0
        r.raise_for_status()
        body = r.json()
        assert len(body["result"]) == len(queries)
        batching = httpx.get(url + "/stats", timeout=10).json()["batching"]
        return {
            "wall_s": wall,
            "calls": batching["batches"] - 1,  # less the warm-up's
            "largest_call": batching["max_size"],
            "truncated": body["truncated_queries"],
            "peak_rss_mb": peak_rss_mb(proc.pid),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=8192)
    ap.add_argument("--max-batch", type=int, nargs="+", default=[256, 8192])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = build(Path(tmp), args.passages, "bm25")
        queries = queries_for(args.queries)
        queries[0] = "x" * 5000  # ASearcher's client retried a 422 on such a query ten times
        print(f"{args.passages:,} passages, one POST of {len(queries):,} queries, topk {TOPK}")
        print(
            "| max_batch | wall s | queries/s | retriever calls | largest call | truncated | server peak RSS MB |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for max_batch in args.max_batch:
            m = one_post(index_dir, queries, max_batch)
            print(f"| {max_batch} | {m['wall_s']:.2f} | {len(queries) / m['wall_s']:,.0f} | {m['calls']:.0f} "
                  f"| {m['largest_call']:.0f} | {m['truncated']:.0f} | {m['peak_rss_mb']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
