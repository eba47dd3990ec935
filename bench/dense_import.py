"""Recall@10 against flat and memory of the compressed dense indexes `asearch index import` builds, on real
embeddings: the bundled MiniLM (384 dims, 128 tokens) over the first N wiki10k passages, written as Search-R1 ships its
index (wiki-18.jsonl + a faiss IndexFlatIP file), queried with wiki10k's built-in questions embedded by the
same model. Flat is the baseline of every row (recall 1 by definition; its bytes are the memory ratio's base);
`ivfpq` without the OPQ rotation is the baseline of the OPQ rows.

    .venv/bin/python bench/dense_import.py --passages 2000 --queries 100          # a minute
    flock /tmp/asearch-heavy.lock .venv/bin/python bench/dense_import.py          # 4,000 passages, ~5 minutes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SETTINGS = [("flat", 0), ("ivfsq8", 0), ("opq_ivfpq", 96), ("ivfpq", 48), ("opq_ivfpq", 48), ("opq_ivfpq", 24)]


def embed_corpus(work: Path, n: int) -> Path:
    """wiki-18.jsonl and e5_Flat.index (MiniLM vectors) of the first n wiki10k passages; cached in `work`."""
    from asearch.corpus import open_corpus
    from asearch.corpus.chunking import iter_passages
    from asearch.retrieval.dense import DenseConfig, Encoder
    from asearch.retrieval.importer import write_flat_file

    flat = work / "e5_Flat.index"
    if flat.exists():
        return flat
    passages = []
    for p in iter_passages(open_corpus("wiki10k")):
        passages.append(p)
        if len(passages) == n:
            break
    with (work / "wiki-18.jsonl").open("w") as f:
        for i, p in enumerate(passages):
            f.write(json.dumps({"id": str(i), "contents": p.contents}) + "\n")
    t0 = time.perf_counter()
    vectors = Encoder(DenseConfig(batch_size=64, max_seq_length=128)).passages([p.contents for p in passages])
    print(f"embedded {n:,} passages in {time.perf_counter() - t0:.0f}s", flush=True)
    write_flat_file(flat, vectors.shape[1], len(vectors), [vectors])
    return flat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=4_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dense_import"))
    args = ap.parse_args()

    import faiss

    from asearch.eval.datasets import load_dataset
    from asearch.retrieval.dense import IVF_KINDS, DenseConfig, Encoder
    from asearch.retrieval.importer import (
        CompressionPlan,
        build_compressed,
        default_nlist,
        index_bytes,
        read_flat_header,
        recall_against_flat,
    )

    faiss.omp_set_num_threads(1)
    work = args.workdir / str(args.passages)
    work.mkdir(parents=True, exist_ok=True)
    flat = read_flat_header(embed_corpus(work, args.passages))
    questions = [r.question for r in load_dataset(f"wiki10k:n={args.queries}")]
    queries = Encoder(DenseConfig()).queries(questions)
    nlist = default_nlist(flat.ntotal, 100_000)
    rows = []
    for kind, m in SETTINGS:
        plan = CompressionPlan(kind, 0 if kind == "flat" else nlist, m, index_bytes(kind, flat.ntotal, flat.dim, nlist, m))
        t0 = time.perf_counter()
        index, timings = build_compressed(flat, plan, train_size=100_000)
        if kind in IVF_KINDS:
            faiss.extract_index_ivf(index).nprobe = args.nprobe
        build_s = time.perf_counter() - t0
        recall = recall_against_flat(flat, index, queries, 10)
        reranked = recall_against_flat(flat, index, queries, 10, rerank_candidates=100) if kind != "flat" else 1.0
        t1 = time.perf_counter()
        index.search(queries, 10)
        qps = len(queries) / (time.perf_counter() - t1)
        size = faiss.serialize_index(index).nbytes
        rows.append((plan.label(), recall, reranked, size, build_s, qps))
        print(rows[-1], flush=True)
    print(
        f"\nMiniLM-L6 (384-d) over the first {flat.ntotal:,} wiki10k passages, {len(questions)} wiki10k questions, "
        f"nprobe {args.nprobe}, 1 thread\n"
    )
    print("| index | recall@10 vs flat | re-scored top 100 (--rerank) | bytes in memory | / flat | build s | QPS (batch) |")
    print("|---|---|---|---|---|---|---|")
    base = rows[0][3]
    for label, recall, reranked, size, seconds, qps in rows:
        print(f"| {label} | {recall:.3f} | {reranked:.3f} | {size:,} | {size / base:.3f} | {seconds:.1f} | {qps:,.0f} |")


if __name__ == "__main__":
    main()
