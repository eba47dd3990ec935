"""Both agents' held-out accuracy by hop count, on the demo's 300 held-out questions, before and after RL.

    python examples/openai_agent/heldout_by_hops.py runs/openai-compare-seed0 [--suffix -demotok]

`--suffix` reads the example agent's models from RUN/openai-sft{suffix} and RUN/openai-rl{suffix}/policy.

The built-in agent's rows are the demo's own evaluations (RUN/demo/heldout_before.jsonl, heldout_after.jsonl);
the example agent's are `asearch eval` of its warm-up model and its RL policy on the same questions with the
held-out tools of the RL config (RUN/openai-eval-*, resumable).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

AGENT = "examples/openai_agent/search_agent.py:agent"


def by_hops(rows: list[tuple[int, float]]) -> dict[int, float]:
    acc: dict[int, list[float]] = defaultdict(list)
    for hops, score in rows:
        acc[hops].append(score)
    return {h: sum(v) / len(v) for h, v in sorted(acc.items())}


def example_rows(run: Path, model: Path, name: str) -> list[tuple[int, float]]:
    """`asearch eval` of the example agent with `model` on the demo's held-out questions (greedy, as the demo's)."""
    import yaml

    heldout = run / "demo" / "data" / "heldout.jsonl"
    tools = yaml.safe_load((run / "demo" / "rl" / "config.yaml").read_text())["heldout"]["tools"]
    search = tools["search"]
    out = run / f"openai-eval-{name}"
    subprocess.run(
        [sys.executable, "-m", "asearch", "eval", "-d", str(heldout), "--out", str(out), "--no-progress",
         f"engine.model={model}", f"tools.corpus={tools['corpus']}", "tools.access=null",
         *(f"tools.search.{k}={search[k]}" for k in ("topk", "max_doc_chars", "show_urls", "compact")),
         "workflow.kind=openai_agent", f"workflow.agent={AGENT}", "agent.max_new_tokens=64"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    hops = {r["id"]: r["metadata"]["hops"] for r in map(json.loads, heldout.open())}
    return [(hops[r["id"]], r["em"]) for r in map(json.loads, (out / "results.jsonl").open())]


def builtin_rows(path: Path) -> list[tuple[int, float]]:
    return [(r["hops"], float(r["correct"])) for r in map(json.loads, path.open())]


def main(run: Path, suffix: str = "") -> None:
    table = {
        "built-in, after SFT": builtin_rows(run / "demo" / "heldout_before.jsonl"),
        "built-in, after RL": builtin_rows(run / "demo" / "heldout_after.jsonl"),
        "example, after warm-up": example_rows(run, run / f"openai-sft{suffix}", f"sft{suffix}"),
        "example, after RL": example_rows(run, run / f"openai-rl{suffix}" / "policy", f"rl{suffix}"),
    }
    per_hop = {name: by_hops(rows) for name, rows in table.items()}
    hops = sorted({h for v in per_hop.values() for h in v})
    print(f"| {run.name}, {len(table['built-in, after SFT'])} held-out questions | all | " + " | ".join(f"{h} hops" for h in hops) + " |")
    print("|---|---:|" + "---:|" * len(hops))
    for name, rows in table.items():
        mean = sum(s for _, s in rows) / len(rows)
        print(f"| {name} | {mean:.3f} | " + " | ".join(f"{per_hop[name].get(h, float('nan')):.2f}" for h in hops) + " |")


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a compare.sh output directory (RUN/demo, RUN/openai-sft, RUN/openai-rl)")
    p.add_argument("--suffix", default="", help="models from RUN/openai-sft{suffix} and RUN/openai-rl{suffix}/policy")
    args = p.parse_args()
    main(args.run, args.suffix)
