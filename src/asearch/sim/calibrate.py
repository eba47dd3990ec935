"""Calibrate the simulator on bench/async_vs_sync.py's JSON: fit on the synchronous row, predict the others.

The bench trains a tiny model on one CPU box (one engine thread, one trainer thread) for S steps at each
eta. From its JSON this module builds the `SimConfig` of that run:

- workload: the bench's questions exactly (turns per group: the same discrete Pareto and seed), the
  sync row's generated tokens per turn and context tokens per turn (prompt and observations);
- controller: B, n, max_concurrent, batch_order and S from the bench's `args`;
- costs: the *shape* of a decode step (fixed / per row / per cached token), of prefill and of the
  trainer's attention share from bench/results/sim_probe.json (`bench/sim_calibration.py --probe`
  measures them on the bench's model); the *level* is scaled so that the synchronous row's rollout
  time and train time come out exactly as measured. Synchronous RL never overlaps the two, so this
  fit is exact and uses nothing of the other rows;
- contention: the bench's box shares 2 cores among several users. If the synchronous row's process got
  less than 0.9 of a core with one thread busy (`cores_used`), the box had no free core, so the engine
  and the trainer split what one thread got when both compute: contention 0.5; otherwise 1.

Fields are read defensively (the bench is evolving): required are `args.batch/group/steps` and, per
row, `eta`, `wall_s`, `train_s`, `trained_trajectories`, `train_tokens`, `trained_gen_tokens`,
`trained_turns_mean`; everything else is compared when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asearch.errors import ConfigError, DataFormatError
from asearch.files import read_utf8_text
from asearch.sim.config import SimConfig
from asearch.sim.model import SimResult, simulate

PROBE_PATH = Path(__file__).resolve().parents[3] / "bench" / "results" / "sim_probe.json"

# Cost shapes measured by `bench/sim_calibration.py --probe` on the bench's model (Qwen2 d=64 x 2, one
# torch thread, float32) on the shared 2-core box; used when no probe file is found. Only their ratios
# matter: the fit rescales them to the synchronous row.
DEFAULT_SHAPE: dict[str, dict[str, float]] = {
    "engine": {
        "decode_base_s": 1.40e-3,
        "decode_per_row_s": 2.42e-5,
        "kv_read_s_per_token": 2.36e-7,
        "prefill_s_per_token": 3.04e-5,
    },
    "trainer": {"attention_equal_tokens": 1096.0},
}

# (name in the table, bench key, SimResult attribute); rows lacking a bench key are skipped
COMPARED = [
    ("trajectories/s", "trajectories_per_s", "trajectories_per_s"),
    ("wall s", "wall_s", "wall_s"),
    ("train s", "train_s", "train_s"),
    ("rollout wait s", "rollout_wait_s", "rollout_wait_s"),
    ("generator idle", "idle_fraction", "rollout_idle"),
    ("staleness mean", "staleness_mean", "staleness_mean"),
    ("trained turns mean", "trained_turns_mean", "trained_turns_mean"),
    ("train tokens", "train_tokens", "train_tokens"),
    ("engine rows/step", "engine_mean_batch", "engine_mean_batch"),
    ("recomputed tokens", "recomputed_tokens", "recomputed_tokens"),
]


def _need(row: dict[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise ConfigError(f"{where}: missing {key!r} (is this a JSON from bench/async_vs_sync.py --json?)")
    return row[key]


def load_bench(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = Path(path)
    try:
        data = json.loads(read_utf8_text(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except DataFormatError as e:  # not UTF-8: names the line and byte
        raise ConfigError(str(e)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) or not data["results"]:
        raise ConfigError(
            f"{path}: expected an object with a non-empty 'results' list (bench/async_vs_sync.py --json)"
        )
    args = data.get("args") or {}
    for key in ("batch", "group", "steps"):
        _need(args, key, f"{path}: args")
    rows = sorted(data["results"], key=lambda r: _need(r, "eta", str(path)))
    if rows[0]["eta"] != 0:
        raise ConfigError(
            f"{path}: no synchronous (eta=0) row to fit on; etas are {[r['eta'] for r in rows]}"
        )
    for r in rows:
        for key in (
            "wall_s",
            "train_s",
            "trained_trajectories",
            "train_tokens",
            "trained_gen_tokens",
            "trained_turns_mean",
        ):
            _need(r, key, f"{path}: eta={r['eta']}")
    return data, rows


def load_probe(path: str | Path | None) -> dict[str, dict[str, float]]:
    if path is not None and Path(path).is_file():
        probe = json.loads(Path(path).read_text())
        return {"engine": probe["engine"], "trainer": probe["trainer"]}
    return DEFAULT_SHAPE


def bench_config(
    data: dict[str, Any],
    sync: dict[str, Any],
    shape: dict[str, dict[str, float]],
    contention: float | None = None,
) -> SimConfig:
    """The SimConfig of a bench run, with the cost levels still unfitted (the shape's own values)."""
    args = data.get("args") or {}
    B, n = int(args["batch"]), int(args["group"])
    turns_total = sync["trained_trajectories"] * sync["trained_turns_mean"]
    gen_per_turn = sync["trained_gen_tokens"] / turns_total
    ctx_per_turn = (sync["train_tokens"] - sync["trained_gen_tokens"]) / turns_total
    if contention is None:
        cores = sync.get("cores_used")
        contention = 0.5 if cores is not None and cores < 0.9 else 1.0
    tokens = {"kind": "fixed", "integer": True}
    return SimConfig.model_validate(
        {
            "seed": int(args.get("seed", 0)),
            "steps": int(args["steps"]),
            "batch_size": B,
            "group_size": n,
            "max_concurrent": int(args.get("max_concurrent") or 4 * B),
            "etas": sorted({int(r) for r in args.get("eta_list", [0])}),
            "batch_order": args.get("batch_order") or "finished",
            "cluster": {"gpus": 2, "rollout_gpus": 1, "contention": contention},
            "rollout": {
                **shape["engine"],
                "max_batch": int(args.get("max_concurrent") or 4 * B) * n,
                "recompute_on_update": True,
                "pause_for_sync": True,
            },
            "trainer": {
                "tokens_per_s_per_gpu": 1.0,  # fitted below
                "scaling_per_doubling": 1.0,
                "attention_equal_tokens": shape["trainer"].get("attention_equal_tokens", 0.0),
                "step_overhead_s": 0.0,
                "weight_sync_s": float(sync.get("weight_sync_s", 0.0)) / int(args["steps"]),
            },
            "workload": {
                "turns": {
                    "kind": "pareto",
                    "min": int(args.get("min_turns", 2)),
                    "max": int(args.get("max_turns", 60)),
                    "alpha": float(args.get("alpha", 1.0)),
                    "integer": True,
                },
                "prompt_tokens": {**tokens, "value": ctx_per_turn},
                "obs_tokens": {**tokens, "value": ctx_per_turn},
                "gen_tokens": {**tokens, "value": gen_per_turn},
                "tool_latency_s": float(args.get("env_latency_ms") or 0.0)
                / 1000,  # the bench sleeps after every call
                "tool_after_last_turn": True,
                "turns_shared_in_group": True,
                "max_context": int(args.get("max_positions", 4096)),
            },
            "split": {"enabled": False},
        }
    )


def fit(cfg: SimConfig, sync: dict[str, Any]) -> SimConfig:
    """Scale the rollout costs and the trainer throughput so the synchronous run matches `sync` exactly."""
    first = simulate(cfg, 0)
    measured_rollout = float(sync.get("rollout_wait_s") or (sync["wall_s"] - sync["train_s"]))
    r_scale = measured_rollout / max(first.rollout_wait_s, 1e-12)
    t_scale = first.train_s / max(float(sync["train_s"]), 1e-12)  # throughput multiplier
    ro = cfg.rollout
    rollout = ro.model_copy(
        update={
            k: getattr(ro, k) * r_scale
            for k in ("decode_base_s", "decode_per_row_s", "kv_read_s_per_token", "prefill_s_per_token")
        }
    )
    trainer = cfg.trainer.model_copy(
        update={"tokens_per_s_per_gpu": cfg.trainer.tokens_per_s_per_gpu * t_scale}
    )
    return cfg.model_copy(update={"rollout": rollout, "trainer": trainer})


def _measured(row: dict[str, Any]) -> dict[str, float]:
    out = {k: float(row[k]) for _, k, _ in COMPARED if row.get(k) is not None}
    if "trajectories_per_s" not in out:
        out["trajectories_per_s"] = row["trained_trajectories"] / max(row["wall_s"], 1e-12)
    out["rejected_stale"] = float((row.get("rejected") or {}).get("stale", 0))
    return out


def _predicted(sims: list[SimResult]) -> dict[str, float]:
    """The mean over replicates of each compared figure."""
    out = {k: sum(float(getattr(r, attr)) for r in sims) / len(sims) for _, k, attr in COMPARED}
    out["rejected_stale"] = sum(r.rejected.get("stale", 0) for r in sims) / len(sims)
    return out


def calibrate(
    path: str | Path,
    *,
    probe_file: str | Path | None = PROBE_PATH,
    contention: float | None = None,
    replicates: int = 5,
) -> list[dict[str, Any]]:
    """Fit on the eta=0 row of one bench JSON; simulate every row `replicates` times (the same questions,
    other token-count draws); return predicted (the mean) vs measured per row."""
    assert replicates >= 1, f"replicates must be >= 1, got {replicates}"
    data, rows = load_bench(path)
    sync = rows[0]
    cfg = fit(bench_config(data, sync, load_probe(probe_file), contention), sync)
    out = []
    for row in rows:
        sims = [simulate(cfg.model_copy(update={"replicate": k}), int(row["eta"])) for k in range(replicates)]
        measured, predicted = _measured(row), _predicted(sims)
        tps = [r.trajectories_per_s for r in sims]
        out.append(
            {
                "source": Path(path).stem,
                "order": cfg.batch_order,
                "eta": int(row["eta"]),
                "measured": measured,
                "predicted": predicted,
                "range": (min(tps), max(tps)),
                "error": {
                    k: predicted[k] / measured[k] - 1.0
                    for k in measured
                    if k in predicted and measured[k] > 0
                },
                "config": cfg,
            }
        )
    return out


def format_calibration(rows: list[dict[str, Any]], command: str = "") -> str:
    """Markdown: the fitted constants per source, then predicted vs measured per row."""
    lines = ["# Simulator calibration against bench/async_vs_sync.py", ""]
    if command:
        lines += [f"`{command}`", ""]
    lines += [
        "Fitted on each file's synchronous row (eta=0); every other row is a prediction. Simulated = the mean of "
        "replicates that share the bench's questions and differ in the simulator's own draws (token counts are "
        "rounded stochastically), with their range. Error = simulated / measured - 1.",
        "",
    ]
    seen = set()
    for r in rows:
        if r["source"] in seen:
            continue
        seen.add(r["source"])
        c: SimConfig = r["config"]
        ro, tr = c.rollout, c.trainer
        lines.append(
            f"- `{r['source']}` (batch_order={c.batch_order}): decode step = {ro.decode_base_s * 1e3:.3f} ms "
            f"+ {ro.decode_per_row_s * 1e3:.4f} ms/row + {ro.kv_read_s_per_token * 1e6:.4f} us/cached token; "
            f"prefill {ro.prefill_s_per_token * 1e6:.2f} us/token; trainer {tr.tokens_per_s_per_gpu:,.0f} tokens/s "
            f"(attention-equal length {tr.attention_equal_tokens:.0f}); contention {c.cluster.contention}; "
            f"gen/ctx tokens per turn {c.workload.gen_tokens.value:.2f}/{c.workload.obs_tokens.value:.2f}"
        )
    lines += [
        "",
        "| source | eta | traj/s measured | traj/s simulated (range) | error | wall s meas/sim | train s meas/sim "
        "| idle meas/sim | staleness mean meas/sim | stale groups meas/sim | trained turns meas/sim "
        "| engine rows/step meas/sim |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def pair(r: dict[str, Any], key: str, fmt: str) -> str:
        m, p = r["measured"].get(key), r["predicted"].get(key)
        return f"{format(m, fmt) if m is not None else '-'} / {format(p, fmt)}"

    for r in rows:
        err = r["error"].get("trajectories_per_s")
        lines.append(
            f"| {r['source']} | {r['eta']} | {r['measured']['trajectories_per_s']:.2f} "
            f"| {r['predicted']['trajectories_per_s']:.2f} ({r['range'][0]:.2f}-{r['range'][1]:.2f}) "
            f"| {'-' if err is None else f'{err:+.0%}'} "
            f"| {pair(r, 'wall_s', '.1f')} | {pair(r, 'train_s', '.1f')} | {pair(r, 'idle_fraction', '.2f')} "
            f"| {pair(r, 'staleness_mean', '.2f')} | {pair(r, 'rejected_stale', '.0f')} "
            f"| {pair(r, 'trained_turns_mean', '.1f')} | {pair(r, 'engine_mean_batch', '.1f')} |"
        )
    predicted = [r for r in rows if r["eta"] != 0]
    if predicted:
        errs = [abs(r["error"]["trajectories_per_s"]) for r in predicted]
        within = sum(e <= 0.2 for e in errs)
        lines += [
            "",
            f"throughput (trajectories/s) of the {len(predicted)} predicted rows: mean |error| "
            f"{sum(errs) / len(errs):.0%}, max {max(errs):.0%}, {within} of {len(predicted)} within 20%.",
        ]
    return "\n".join(lines)
