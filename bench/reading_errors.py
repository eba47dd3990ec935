"""Where a long-preset policy fails on held-out questions: each reading turn classified against the page.

For a demo run directory of `--preset long` (its `config.yaml`, `data/heldout.jsonl`), runs the policy
(`model-sft/` by default, or `--model DIR`, e.g. `RUN/rl/policy`) on the first `--per-hop` held-out questions
of each hop count, greedy or at `--temperature`, and classifies every reading turn by whether the chunk it
read holds the line the current hop asks for (`key value`) and what the summary said:

    found                the line is there and the summary is that line
    missed line          the line is there and the summary says `key none`
    wrong value on line  the line is there and the summary names another value
    no line: said no     the line is not there and the summary says so (right)
    no line: invented    the line is not there and the summary names a value (a distractor or a guess)

plus, per failed episode, its first mistake (or why it ended: `repeated`, `max_turns`, answered early).
CPU only, one thread; about a minute for 120 questions.

    .venv/bin/python bench/reading_errors.py runs/demo-long-seed0
    .venv/bin/python bench/reading_errors.py runs/demo-long-seed0 --model runs/demo-long-seed0/rl/policy --temperature 0.7
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml

from asearch.agent.expert import reading_plan_from_record, summary_found
from asearch.agent.workflow import SearchAgentWorkflow
from asearch.demo.pipeline import DemoConfig
from asearch.engine.local.inprocess import InProcessEngine
from asearch.eval.datasets import load_dataset
from asearch.eval.runner import evaluate_workflow
from asearch.models.loading import load_model, load_tokenizer
from asearch.tools import build_tools


def classify(summary: str, chunk: str, key: str, value: str) -> str:
    """One reading turn: does `chunk` hold `key value`, and what did the summary make of it."""
    has_line = any(line.strip() == f"{key} {value}" for line in chunk.splitlines())
    said_no = not summary_found(summary)
    if has_line:
        return "found" if summary == f"{key} {value}" else "missed line" if said_no else "wrong value on line"
    return "no line: said no" if said_no else "no line: invented"


def episode_reads(traj, record: Mapping[str, Any]) -> tuple[list[tuple[int, str]], str | None]:
    """(hop, class) of each reading turn, and the episode's first mistake (None: none found)."""
    evidence, keys = record["metadata"]["evidence"], reading_plan_from_record(record).keys
    hop, chunk, first, reads = 0, "", None, []
    for turn in traj.turns:
        if turn.kind == "act":
            chunk = turn.observation or ""
            if turn.action == "answer" and hop < len(keys) and first is None:
                first = f"answered at hop {hop + 1} of {len(keys)}"
            continue
        h = min(hop, len(keys) - 1)
        summary = turn.output_text.replace("</summary>", "").strip()
        kind = classify(summary, chunk, keys[h], str(evidence[h]["value"]))
        reads.append((h + 1, kind))
        if first is None and kind in ("missed line", "wrong value on line", "no line: invented"):
            first = f"{kind} (hop {h + 1})"
        hop += summary_found(summary)
    return reads, first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a `asearch demo --preset long` run directory")
    p.add_argument("--model", type=Path, help="policy directory (default RUN/model-sft)")
    p.add_argument("--per-hop", type=int, default=20, help="held-out questions per hop count")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as the demo evaluates")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = DemoConfig.model_validate(yaml.safe_load((args.run / "config.yaml").read_text()))
    model_dir = args.model or args.run / "model-sft"
    model, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    model.set_attn_implementation(cfg.attention)
    by_hops = defaultdict(list)
    for r in load_dataset(str(args.run / "data" / "heldout.jsonl")):
        by_hops[r.metadata["hops"]].append(r)
    records = [r for h in sorted(by_hops) for r in by_hops[h][: args.per_hop]]
    tools, _ = build_tools(cfg.rl.heldout.tools, progress=False)
    agent = cfg.rl.agent.model_copy(update={"temperature": args.temperature})
    workflow = SearchAgentWorkflow(tokenizer, tools, agent, cfg.rl.reward)

    async def run():
        engine = InProcessEngine(model, tokenizer, cfg=cfg.rl.engine.options.model_copy(update={"threads": 1}))
        try:
            return await evaluate_workflow(workflow, engine, records, concurrency=128)
        finally:
            await engine.close()

    episodes = asyncio.run(run())
    reads: Counter[tuple[int, str]] = Counter()
    firsts: Counter[tuple[int, str]] = Counter()
    right: Counter[int] = Counter()
    for traj, record in zip(episodes.trajectories, records, strict=True):
        if traj is None:
            continue
        hops = record.metadata["hops"]
        kinds, first = episode_reads(traj, record.model_dump())
        reads.update(kinds)
        right[hops] += bool(traj.score)
        if not traj.score:
            firsts[(hops, first or traj.finish)] += 1
    print(f"{model_dir}, temperature {args.temperature}: accuracy {episodes.mean_score:.3f} on {len(records)} questions")
    print("by hops: " + ", ".join(f"{h}: {right[h] / len(by_hops[h][: args.per_hop]):.2f}" for h in sorted(by_hops)))
    kinds = ["found", "missed line", "wrong value on line", "no line: said no", "no line: invented"]
    print("\n| hop | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
    for h in sorted({h for h, _ in reads}):
        print(f"| {h} | " + " | ".join(str(reads[(h, k)]) for k in kinds) + " |")
    print("\nfirst mistake of each failed episode (hops, mistake): count")
    for (h, what), n in sorted(firsts.items()):
        print(f"  {h} hops, {what}: {n}")


if __name__ == "__main__":
    main()
