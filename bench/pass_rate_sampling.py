"""Pass-rate-aware sampling on the CPU demo: RL from one supervised start with the sampler off, then on.

For each demo run directory given (one per seed, holding a finished supervised start: `data/` and
`model-sft/` with `sft.json`), the RL stage runs once per `--variants` entry from that start (off: no
sampler; on: per-question pass rates; prior: those plus the hop-count prior for unseen questions; probe: two
samples of each group first, the rest only when they disagree), each in a
copy of the directory (`asearch demo` resumes a copy from its supervised start). Per run: held-out
accuracy before and after, the RL wall time at which the held-out curve first reached `--target`,
groups generated per group kept, episodes generated per episode kept (a probe-settled group costs two),
and rejections by cause. RL is budgeted in wall time: run it on quiet
cores. Table to stdout and bench/results/pass_rate_sampling.md.

    .venv/bin/python bench/pass_rate_sampling.py runs/demo-seed0 runs/demo-seed1 runs/demo-seed2
    .venv/bin/python bench/pass_rate_sampling.py runs/demo-seed{0,1,2} --variants prior
    .venv/bin/python bench/pass_rate_sampling.py runs/demo-seed{0,1,2} --variants off,prior,probe --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from asearch.files import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "pass_rate_sampling.md"
VARIANTS = {
    "off": ["rl.rollout.sampling.pass_rate=false"],
    "on": ["rl.rollout.sampling.pass_rate=true"],
    # unseen questions admitted by their hop count's share of groups with variance (docs/rl.md)
    "prior": ["rl.rollout.sampling.pass_rate=true", "rl.rollout.sampling.prior_key=metadata.hops"],
    # two samples first; a group whose two agree is dropped before the other six. A group in its probe holds
    # 2 engine rows instead of 8, so more groups may be in flight (the staleness rule caps them at (eta+1) x B)
    "probe": ["rl.rollout.sampling.probe=2", "rl.rollout.max_concurrent=24"],
}


def rl_only_copy(start: Path, out: Path) -> None:
    """A run directory holding only `start`'s supervised start, so `asearch demo --out` resumes into RL."""
    if not (start / "model-sft" / "sft.json").exists():
        sys.exit(f"{start}: no supervised start (model-sft/sft.json); run `asearch demo --out {start}` first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for part in ("data", "model-sft"):
        shutil.copytree(start / part, out / part)


def run_rl(seed: int, out: Path, overrides: list[str]) -> None:
    cmd = [sys.executable, "-m", "asearch", "demo", "--seed", str(seed), "--out", str(out), *overrides]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=os.environ)


def measure(out: Path, target: float) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(r["perf/rl_wall_s"], r["eval/heldout_acc"]) for r in rows if "eval/heldout_acc" in r]
    reached = next((t for t, acc in curve if acc >= target), None)
    steps = [r for r in rows if "rollout/groups_per_kept" in r]
    rejected = summary.get("rejected_groups", {})
    skipped = {k.split("/")[-1]: v for k, v in (steps[-1] if steps else {}).items() if k.startswith("rollout/skipped/")}
    return {
        "before": summary["heldout_acc_before"], "after": summary["heldout_acc_after"], "steps": summary["rl_steps"],
        "reached_s": reached, "curve": curve, "rejected": rejected, "skipped": skipped,
        "per_kept": steps[-1]["rollout/groups_per_kept"] if steps else None,
        "wasted": 1 - 1 / steps[-1]["rollout/groups_per_kept"] if steps else None,
        # runs from before the episode counters: every group was whole, so episodes waste as groups do
        "episodes_per_kept": steps[-1].get("rollout/episodes_per_kept", steps[-1]["rollout/groups_per_kept"]) if steps else None,
    }  # fmt: skip


def table(results: dict[tuple[int, str], dict], target: float) -> str:
    lines = [
        f"| seed | sampler | before | after | steps | RL s to {target:.2f} | groups generated / kept | wasted | "
        "episodes generated / kept | episodes wasted | skipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (seed, variant), m in sorted(results.items()):
        reached = f"{m['reached_s']:.0f}" if m["reached_s"] is not None else "not reached"
        per_kept = f"{m['per_kept']:.2f}" if m["per_kept"] is not None else "-"
        ep = m.get("episodes_per_kept")
        episodes = f"{ep:.2f} | {1 - 1 / ep:.0%}" if ep else "- | -"
        lines.append(f"| {seed} | {variant} | {m['before']:.3f} | {m['after']:.3f} | {m['steps']} | {reached} | "
                     f"{per_kept} | {m['wasted'] or 0:.0%} | {episodes} | {sum(m['skipped'].values()):.0f} |")  # fmt: skip
    for seed in sorted({s for s, _ in results}):
        off = results.get((seed, "off"))
        for variant in [v for v in VARIANTS if v != "off"]:
            on = results.get((seed, variant))
            if off and on and off["reached_s"] and on["reached_s"]:
                lines.append(f"\n- seed {seed}: time to {target:.2f} {variant}/off = {on['reached_s'] / off['reached_s']:.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("starts", nargs="+", type=Path, help="demo run directories holding a supervised start")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-pass-rate"), help="where the RL runs go")
    ap.add_argument("--target", type=float, default=0.85, help="held-out accuracy whose arrival time is compared")
    ap.add_argument("--variants", default="off,on", help=f"which runs, in order ({', '.join(VARIANTS)})")
    ap.add_argument("--set", action="append", default=[], help="a demo override for every run, e.g. rl.max_rl_seconds=60")
    ap.add_argument("--report-only", action="store_true", help="tabulate the finished runs under --out, start none")
    args = ap.parse_args()
    results: dict[tuple[int, str], dict] = {}
    for start in args.starts:
        seed = _seed_of(start)
        for variant in args.variants.split(","):
            out = args.out / f"seed{seed}-{variant}"
            if args.report_only:
                if (out / "summary.json").exists():
                    results[seed, variant] = measure(out, args.target)
                continue
            rl_only_copy(start, out)
            print(f"seed {seed}, sampler {variant}: RL into {out}", flush=True)
            run_rl(seed, out, [*args.set, *VARIANTS[variant]])
            results[seed, variant] = measure(out, args.target)
            print(table(results, args.target), flush=True)
    report = table(results, args.target)
    RESULTS.parent.mkdir(exist_ok=True)
    atomic_write_text(RESULTS, f"# Pass-rate-aware sampling (bench/pass_rate_sampling.py)\n\n{report}\n")
    print(report)


def _seed_of(start: Path) -> int:
    import yaml

    return int((yaml.safe_load((start / "config.yaml").read_text()) or {}).get("seed", 0))


if __name__ == "__main__":
    main()
