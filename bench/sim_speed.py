"""Wall time of the cluster simulator on configs/sim-reference.yaml, this tree against `--baseline-rev`.

Both sides run the same measurement in a subprocess (the base on a git worktree of the revision, with its own
src/ and configs/), alternating, and report the median; the SimResults of the two sides must be equal, so
a refactor that changes what is simulated is caught here too.

    .venv/bin/python bench/sim_speed.py                          # against 1685d1a (the closures' simulator)
    .venv/bin/python bench/sim_speed.py --steps 4 --repeats 2    # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import ROOT, worktree  # noqa: E402


def run_worker(tree: Path, steps: int, eta: int) -> dict:
    """One simulation of `tree`'s sim-reference config: its seconds and its result."""
    import dataclasses

    from asearch.config import load_config
    from asearch.sim import SimConfig, simulate

    cfg = load_config(SimConfig, tree / "configs" / "sim-reference.yaml", [f"steps={steps}", "warmup_steps=2"])
    t0 = time.perf_counter()
    result = simulate(cfg, eta)
    return {"seconds": time.perf_counter() - t0, "result": dataclasses.asdict(result)}


def run_side(tree: Path, steps: int, eta: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--worker", str(tree), "--steps", str(steps), "--eta", str(eta)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-rev", default="1685d1a", help="commit to compare against")
    ap.add_argument("--steps", type=int, default=6, help="training steps simulated (2 of them warm-up)")
    ap.add_argument("--eta", type=int, default=4, help="max staleness")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_worker(Path(args.worker), args.steps, args.eta)))
        return
    sides = {"base": worktree(args.baseline_rev), "new": ROOT}
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    for rep in range(args.repeats):
        for side, tree in sides.items():
            runs[side].append(run_side(tree, args.steps, args.eta))
            print(f"{side} run {rep + 1}: {runs[side][-1]['seconds']:.2f}s", flush=True)
    same = all(r["result"] == runs["base"][0]["result"] for rs in runs.values() for r in rs)
    base, new = (statistics.median(r["seconds"] for r in runs[s]) for s in ("base", "new"))
    print(f"sim-reference, eta={args.eta}, {args.steps} steps: base {args.baseline_rev} {base:.2f}s, this tree "
          f"{new:.2f}s (median of {args.repeats}): {new / base:.2f}x the time; results identical: {same}")


if __name__ == "__main__":
    main()
