"""Calibrate the cluster simulator against bench/async_vs_sync.py (issue 6 section 5).

    .venv/bin/python bench/async_vs_sync.py --json avs.json             # the measurement (minutes)
    .venv/bin/python bench/sim_calibration.py avs.json [more.json ...]   # fit on eta=0, predict the rest
    .venv/bin/python bench/sim_calibration.py --probe                   # re-measure the cost shapes (~1 min)

The simulator's constants are fitted on the synchronous row of each JSON only (`asearch.sim.calibrate`);
every other row is a prediction, printed beside the measurement with its relative error. The split of
a decode step's cost into a fixed part, a per-row part and a per-cached-token part (and the trainer's
attention share) cannot be read from one aggregate row: `--probe` measures those *shapes* on the
bench's own tiny model and engine and writes bench/results/sim_probe.json, which the fit then scales to
the synchronous row's measured times. Writes bench/results/sim_calibration.md and, with matplotlib,
bench/results/sim_calibration.png (predicted vs measured wall time, one point per row).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from asearch.files import atomic_write_json, atomic_write_text
from asearch.sim.calibrate import PROBE_PATH, calibrate, format_calibration

HERE = Path(__file__).parent
RESULTS = HERE / "results"


# --------------------------------------------------------------------------- the probe


def _bench():
    """bench/async_vs_sync.py as a module: its tiny model and prompts are what the probe measures."""
    spec = importlib.util.spec_from_file_location("async_vs_sync_bench", HERE / "async_vs_sync.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _nnls(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0: the best fit over subsets of the columns (there are 2-3)."""
    from itertools import combinations

    import numpy as np

    X, y = np.array(rows), np.array(ys)
    best, best_err = [0.0] * X.shape[1], float("inf")
    for k in range(1, X.shape[1] + 1):
        for cols in combinations(range(X.shape[1]), k):
            coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            err = float(((X[:, cols] @ coef - y) ** 2).sum())
            if err < best_err:
                best_err, best = err, [0.0] * X.shape[1]
                for c, v in zip(cols, coef, strict=True):
                    best[c] = float(v)
    return best


async def _probe_engine(policy, tok, reps: int) -> dict[str, float]:
    """Decode-step time at batch sizes b and contexts L: fit a + c*b + kv*b*L; prefill time per token."""
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    engine = InProcessEngine(
        policy, None, cfg=InProcessEngineConfig(threads=1, max_batch=256, max_seq_len=4096)
    )
    vocab = policy.config.vocab_size

    async def run(b: int, ctx: int, new: int) -> float:
        reqs = [
            GenerateRequest(
                input_ids=[(7 * i + j) % (vocab - 10) + 5 for j in range(ctx)],
                sampling=SamplingParams(max_new_tokens=new, seed=i),
            )
            for i in range(b)
        ]
        t = time.perf_counter()
        await asyncio.gather(*(engine.generate(r) for r in reqs))
        return time.perf_counter() - t

    try:
        await run(4, 32, 4)  # warm-up
        decode_rows, decode_ys, prefill_rows, prefill_ys = [], [], [], []
        # 64 extra decode steps: the difference holds no prefill
        for b, ctx in ((1, 64), (1, 1024), (16, 64), (16, 1024), (64, 64), (64, 512), (128, 64), (128, 256)):
            t_short = min([await run(b, ctx, 8) for _ in range(reps)])
            t_long = min([await run(b, ctx, 72) for _ in range(reps)])
            decode_rows.append([1.0, b, b * (ctx + 40)])
            decode_ys.append((t_long - t_short) / 64)
        for b, ctx in ((1, 2048), (8, 512), (32, 256), (64, 512)):
            prefill_rows.append([1.0, b * ctx])
            prefill_ys.append(min([await run(b, ctx, 1) for _ in range(reps)]))
    finally:
        await engine.close()
    a, c, kv = _nnls(decode_rows, decode_ys)
    _, p = _nnls(prefill_rows, prefill_ys)
    return {"decode_base_s": a, "decode_per_row_s": c, "kv_read_s_per_token": kv, "prefill_s_per_token": p}


def _probe_trainer(policy, reps: int) -> dict[str, float]:
    """Seconds per token of train_step at short and long sequences: cost(L) = L * (1 + L / L_eq) * k."""
    from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig

    trainer = PolicyTrainer(policy, TrainerConfig(prox="loglinear"), temperature=1.0, total_steps=100)
    vocab = policy.config.vocab_size
    per_token = {}
    for length, rows in ((128, 64), (2048, 4)):
        samples = [
            Sample(
                [(5 * i + j) % (vocab - 10) + 5 for j in range(length)],
                [0] * 16 + [1] * (length - 16),
                [-1.0] * length,
                [0] * length,
                1.0 if i % 2 else -1.0,
            )
            for i in range(rows)
        ]
        trainer.train_step(samples, policy_version=0)  # warm-up
        best = min(_timed(lambda s=samples: trainer.train_step(s, policy_version=0)) for _ in range(reps))
        per_token[length] = best / (length * rows)
    # per-token cost k * (1 + L / L_eq): two lengths give k and L_eq
    k_short, k_long = per_token[128], per_token[2048]
    slope = (k_long - k_short) / (2048 - 128)
    base = max(k_short - slope * 128, 1e-12)
    return {
        "s_per_token_128": k_short,
        "s_per_token_2048": k_long,
        "attention_equal_tokens": base / slope if slope > 0 else 0.0,
    }


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def probe(out: Path, reps: int) -> dict[str, object]:
    import os

    import torch

    torch.set_num_threads(1)
    bench = _bench()
    policy, tok = bench.build_policy(0, 64, 2, 4096)  # the bench's default model
    engine = asyncio.run(_probe_engine(policy, tok, reps))
    trainer = _probe_trainer(policy, reps)
    result = {
        "engine": engine,
        "trainer": trainer,
        "load_average": os.getloadavg()[0],
        "model": "Qwen2 d=64 x 2",
    }
    atomic_write_json(out, result)
    return result


# --------------------------------------------------------------------------- main


def _figure(rows: list[dict[str, object]], path: Path) -> bool:
    """One panel per bench file: trajectories/s by eta, measured vs simulated (the replicates' range)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sources = list(dict.fromkeys(str(r["source"]) for r in rows))
    fig, axes = plt.subplots(1, len(sources), figsize=(3.2 * len(sources), 3.4), squeeze=False)
    for ax, src in zip(axes[0], sources, strict=True):
        rs = [r for r in rows if r["source"] == src]
        etas = [int(r["eta"]) for r in rs]  # type: ignore[call-overload]
        meas = [r["measured"]["trajectories_per_s"] for r in rs]  # type: ignore[index]
        sim = [r["predicted"]["trajectories_per_s"] for r in rs]  # type: ignore[index]
        lo = [s - r["range"][0] for r, s in zip(rs, sim, strict=True)]  # type: ignore[index]
        hi = [r["range"][1] - s for r, s in zip(rs, sim, strict=True)]  # type: ignore[index]
        ax.fill_between(
            etas, [m * 0.8 for m in meas], [m * 1.2 for m in meas], color="0.9", label="measured ±20%"
        )
        ax.plot(etas, meas, "o-", color="C0", label="measured")
        ax.errorbar(etas, sim, yerr=[lo, hi], fmt="s--", color="C1", mfc="none", capsize=3, label="simulated")
        ax.set_title(f"{src}\n(batch_order={rs[0]['order']})", fontsize=9)
        ax.set_xticks(etas)
        ax.set_xlabel("eta (0 = synchronous: the fitted row)")
        ax.set_ylim(0, max(meas + sim) * 1.35)
    axes[0][0].set_ylabel("trained trajectories/s")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("asearch sim vs bench/async_vs_sync.py: fitted on eta=0, the rest predicted", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "bench_json", nargs="*", type=Path, help="JSON files written by bench/async_vs_sync.py --json"
    )
    p.add_argument("--probe", action="store_true", help="measure the engine and trainer cost shapes first")
    p.add_argument("--probe-reps", type=int, default=2)
    p.add_argument("--probe-file", type=Path, default=PROBE_PATH)
    p.add_argument("--contention", type=float, default=None, help="override the contention the fit derives")
    p.add_argument("--replicates", type=int, default=5, help="simulations per row (the mean is reported)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/sim_calibration.*")
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe_file, args.probe_reps), indent=2))
    if not args.bench_json:
        if not args.probe:
            p.error("give at least one JSON written by bench/async_vs_sync.py --json (or --probe)")
        return 0
    rows = []
    for path in args.bench_json:
        rows += calibrate(
            path, probe_file=args.probe_file, contention=args.contention, replicates=args.replicates
        )
    report = format_calibration(
        rows, command="bench/sim_calibration.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print(report)
    if not args.no_save:
        atomic_write_text(RESULTS / "sim_calibration.md", report + "\n")
        if _figure(rows, RESULTS / "sim_calibration.png"):
            print(f"figure: {RESULTS / 'sim_calibration.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
