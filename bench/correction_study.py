"""The staleness x off-policy correction study (issue 20 §4): the demo's RL stage at each eta and `loss.correction`.

Each cell is one `asearch train configs/train-world-tiny.yaml` run from the same supervised start (a demo
run's `model-sft` and `data/`), for a fixed number of steps (the cosine schedule runs over the steps, not a
time budget, so a slow machine changes the wall time and not the result), with held-out accuracy on the
demo's 100-question held-out subset every `--eval-every` steps and after the last one. Each run keeps
B x (eta + 1) groups in flight, so the generator can run as far ahead as eta allows (`--demo-concurrency`:
the demo's 16 at every eta). Runs go `--parallel` at a time, each on one trainer and one engine thread;
`--set KEY=VALUE` passes an override to every run (e.g. a higher `trainer.optim.lr`).

    .venv/bin/python bench/correction_study.py --start runs/demo-seed0 --out runs/study             # 16 runs
    .venv/bin/python bench/correction_study.py --start runs/demo-seed0 --out runs/study --quick     # 2 runs, 2 steps

Prints a markdown table, one row per (eta, correction): held-out accuracy at the start, the best during RL
and after the last step, whether the run collapsed (the last held-out accuracy more than `--collapse-drop`
below the run's best, or below the start), the rollout accuracy of the last steps, the tokens the correction
masked and the tokens' mean staleness. Writes OUT/study.json and OUT/study.md; rerunning resumes each
unfinished run from its checkpoint and re-reads the finished ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ETAS = (1, 2, 4, 8)
CORRECTIONS = ("decoupled", "tis", "token_mask", "seq_mask")


def cell_command(args: argparse.Namespace, eta: int, correction: str, out: Path) -> list[str]:
    start = args.start.resolve()
    return [
        sys.executable, "-c", "from asearch.cli.app import main; main()", "train", "train-world-tiny",
        f"out={out}", f"seed={args.seed}",
        f"model={start / 'model-sft'}", f"data={start / 'data' / 'rl.jsonl'}",
        f"heldout.dataset={start / 'data' / 'heldout_small.jsonl'}",
        f"rollout.max_staleness={eta}", f"trainer.loss.correction={correction}",
        # the demo keeps 16 groups in flight, which caps staleness near 2; a window of B x (eta + 1) lets eta bite
        f"rollout.max_concurrent={8 * (eta + 1) if args.window else 16}",
        f"steps={args.steps}", "max_rl_seconds=1000000",  # the schedule follows the steps
        "heldout.every_s=1000000", f"heldout.every_steps={args.eval_every}",
        f"checkpoint_every={args.eval_every}",
        f"trainer.device={args.device}", f"engine.device={args.device}",  # not `auto`: a GPU box would share one GPU
        *args.set,
    ]


def run_cell(args: argparse.Namespace, eta: int, correction: str) -> dict[str, Any]:
    out = args.out / f"eta{eta}-{correction}"
    if not (out / "summary.json").exists() or _summary_steps(out) < args.steps:
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        t0 = time.monotonic()
        with open(out / "train.log", "a") as log:
            cmd = cell_command(args, eta, correction, out)
            if args.nice:
                cmd = ["nice", "-n", str(args.nice), *cmd]
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        print(f"  eta={eta} {correction}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
    return {"eta": eta, "correction": correction, **read_cell(out, args.collapse_drop)}


def _summary_steps(out: Path) -> int:
    try:
        return int(json.loads((out / "summary.json").read_text()).get("steps", 0))
    except (OSError, ValueError):
        return 0


def read_cell(out: Path, collapse_drop: float) -> dict[str, Any]:
    """The cell's figures from its metrics.jsonl: held-out trajectory, last steps' rollout, lab means."""
    rows = []
    if (out / "metrics.jsonl").exists():
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["step"], r["eval/heldout_acc"]) for r in rows if "eval/heldout_acc" in r]
    steps = [r for r in rows if "loss/policy" in r]
    if not evals or not steps:
        return {"status": "no result", "steps": len(steps)}
    start, last = evals[0][1], evals[-1][1]
    best = max(acc for _, acc in evals)
    tail = steps[-5:]

    def mean(key: str, rows_: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in rows_ if key in r]
        return sum(vals) / len(vals) if vals else None

    return {
        "status": "ok",
        "steps": steps[-1]["step"],
        "heldout_start": start,
        "heldout_best": best,
        "heldout_last": last,
        "heldout_curve": evals,
        "collapsed": last < best - collapse_drop or last < start,
        "rollout_acc_last5": mean("rollout/accuracy", tail),
        "masked_frac": mean("is/masked_frac", steps),
        "staleness_mean": mean("rollout/staleness_mean", steps),
        "wall_s": steps[-1].get("wall_s"),
    }


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def table(cells: list[dict[str, Any]]) -> str:
    lines = [
        "| eta | correction | steps | held-out start | best | last | collapsed | rollout acc (last 5) | masked tokens | staleness mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if c["status"] != "ok":
            lines.append(f"| {c['eta']} | {c['correction']} | {c['steps']} | {c['status']} | | | | | | |")
            continue
        lines.append(
            f"| {c['eta']} | {c['correction']} | {c['steps']} | {_fmt(c['heldout_start'])} | {_fmt(c['heldout_best'])} | "
            f"{_fmt(c['heldout_last'])} | {'yes' if c['collapsed'] else 'no'} | {_fmt(c['rollout_acc_last5'])} | "
            f"{_fmt(c['masked_frac'])} | {_fmt(c['staleness_mean'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", type=Path, required=True, help="a demo run directory (its model-sft/ and data/)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--etas", type=int, nargs="+", default=list(ETAS))
    ap.add_argument("--corrections", nargs="+", default=list(CORRECTIONS), choices=CORRECTIONS)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="trainer and engine device of every run")
    ap.add_argument("--set", action="append", default=[], help="a train override for every run, e.g. trainer.optim.lr=2e-3")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (each uses two threads)")
    ap.add_argument("--nice", type=int, default=0, help="run the cells at this niceness (leave room for other work)")
    ap.add_argument("--collapse-drop", type=float, default=0.10)
    ap.add_argument("--demo-concurrency", dest="window", action="store_false",
                    help="keep the demo's 16 groups in flight at every eta (default: B x (eta + 1), so eta is reached)")
    ap.add_argument("--report-only", action="store_true", help="read the runs under --out, start none")
    ap.add_argument("--quick", action="store_true", help="eta 2 with two corrections, 2 steps (the smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.etas, args.corrections, args.steps, args.eval_every = [2], ["decoupled", "seq_mask"], 2, 2
    for sub in () if args.report_only else ("model-sft", "data/rl.jsonl", "data/heldout_small.jsonl"):
        if not (args.start / sub).exists():
            ap.error(f"--start {args.start}: no {sub} (run `asearch demo --out {args.start}` first)")
    args.out.mkdir(parents=True, exist_ok=True)
    grid = [(eta, c) for eta in args.etas for c in args.corrections]
    print(f"{len(grid)} runs of {args.steps} steps, {args.parallel} at a time, into {args.out}", flush=True)
    if args.report_only:
        cells = [{"eta": e, "correction": c, **read_cell(args.out / f"eta{e}-{c}", args.collapse_drop)} for e, c in grid]
    else:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            cells = list(pool.map(lambda cell: run_cell(args, *cell), grid))
    text = table(cells)
    print(text)
    (args.out / "study.json").write_text(json.dumps(cells, indent=1))
    (args.out / "study.md").write_text(text + "\n")
    return cells


if __name__ == "__main__":
    main()
