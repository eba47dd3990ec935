"""What recording the tools' answers costs (`tools.record`, docs/replay.md): the same searches over a local
BM25 index with recording off, recording, and replayed from the record; wall time, entries and bytes, and
whether the three runs showed the agent the same text.

Queries: the world's page titles, then the same titles with a word added, cycled up to `--searches`, so
most are distinct (each distinct one is one new entry, written and fsynced before it is answered).

    .venv/bin/python bench/tool_record.py --searches 1000 --in-flight 16
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from asearch.corpus.world import WorldCorpus
from asearch.tools import ToolsConfig, open_tools, record_metrics, run_tool

CORPUS = "world:seed=1000,entities=300"


async def searches(cfg: dict[str, Any], record_dir: Path | None, queries: list[str], in_flight: int):
    """(seconds, the record counters, the observations' text) of `queries` through the search tool."""
    gate = asyncio.Semaphore(in_flight)
    async with open_tools(ToolsConfig.model_validate(cfg), progress=False, record_dir=record_dir) as tools:

        async def one(query: str) -> str:
            async with gate:
                return (await run_tool(tools["search"], query)).text

        start = time.perf_counter()
        texts = await asyncio.gather(*(one(q) for q in queries))
        seconds = time.perf_counter() - start
        return seconds, record_metrics(tools), texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    titles = [d.title for d in WorldCorpus(1000, 300).documents()]
    queries = [titles[i % len(titles)] + (" x" * (i // len(titles))) for i in range(args.searches)]
    local = {"corpus": CORPUS}
    asyncio.run(searches({**local, "record": False}, None, queries[:10], 1))  # index built and warm
    root = Path(tempfile.mkdtemp(prefix="tool-record-bench-"))
    try:
        for _ in range(args.repeats):
            shutil.rmtree(root / "rec", ignore_errors=True)
            off, _, shown = asyncio.run(searches({**local, "record": False}, None, queries, args.in_flight))
            on, rec, recorded = asyncio.run(searches(local, root / "rec", queries, args.in_flight))
            replay = {"record": {"replay": str(root / "rec")}}
            again, rep, replayed = asyncio.run(searches(replay, None, queries, args.in_flight))
            size = sum(f.stat().st_size for f in (root / "rec").glob("search/*/*.json"))
            print(
                f"{len(queries)} searches, {args.in_flight} in flight: off {off:.2f} s, recording {on:.2f} s "
                f"({int(rec['record/new'])} new entries, {size:,} bytes), replay {again:.2f} s "
                f"({int(rep['replay/hits'])} hits, {int(rep['replay/misses'])} misses); "
                f"same text: {shown == recorded == replayed}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
