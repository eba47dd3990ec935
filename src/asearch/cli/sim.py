"""`asearch sim CONFIG [key=value ...]`: the cluster simulator; `asearch sim --calibrate BENCH_JSON`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from asearch.cli.console import config_argument, console, make_console, overrides_argument

out = make_console(stderr=False)  # tables go to stdout


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _mode_table(title: str, results: list[Any]) -> Table:
    t = Table(title=title)
    for col in ("mode", "eta", "GPUs R/T", "traj/s", "gen tok/s", "train tok/s", "rollout idle",
                "trainer idle", "GPU idle", "staleness mean/max", "rejected", "s/step"):  # fmt: skip
        t.add_column(col, justify="left" if col == "mode" else "right")
    for r in results:
        rej = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected.items())) or "0"
        t.add_row(
            r.name, str(r.eta), f"{r.rollout_gpus}/{r.trainer_gpus}", f"{r.trajectories_per_s:.2f}",
            f"{r.gen_tokens_per_s:,.0f}", f"{r.train_tokens_per_s:,.0f}", _pct(r.rollout_idle),
            _pct(r.trainer_idle), _pct(r.gpu_idle), f"{r.staleness_mean:.2f}/{r.staleness_max}", rej,
            f"{r.wall_s / r.steps:.1f}",
        )  # fmt: skip
    return t


def sim(
    config: Annotated[Path | None, config_argument("Simulator YAML (configs/sim-*.yaml).")] = None,
    overrides: Annotated[
        list[str] | None, overrides_argument("cluster.rollout_gpus=80 workload.tool_latency_s=0.2")
    ] = None,
    calibrate: Annotated[
        list[Path] | None,
        typer.Option(
            "--calibrate",
            help="JSON from bench/async_vs_sync.py --json: fit on its synchronous row, predict the rest.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    split: Annotated[bool, typer.Option("--split/--no-split", help="Search rollout/trainer splits.")] = True,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", file_okay=False, help="Write everything here: the tables as printed (report.txt), "
                     "the results (results.json), the figure (plot.png) and the resolved config (config.yaml)."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also draw the modes and the split search (PNG).")
    ] = None,
) -> None:
    """Simulate synchronous, one-step-off and fully asynchronous RL on a modelled cluster (docs/sim.md).

    Prints throughput, idle time and staleness per mode, then the best rollout/trainer split. Example:
    `asearch sim configs/sim-reference.yaml cluster.rollout_gpus=80 workload.tool_latency_s=0.2 --out runs/sim`.
    """
    from asearch.errors import ConfigError

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        json_out, plot = json_out or out_dir / "results.json", plot or out_dir / "plot.png"
    if calibrate:
        return _calibrate(calibrate, json_out, out_dir)
    if config is None:
        raise ConfigError("give a simulator config (e.g. configs/sim-reference.yaml) or --calibrate BENCH_JSON")
    from asearch.config import dump_config, load_config
    from asearch.sim import SimConfig
    from asearch.sim.run import describe, run_modes, split_search

    cfg = load_config(SimConfig, config, overrides or [])
    for line in describe(cfg):
        console.print(line)
    results = run_modes(cfg)
    tables: list[Any] = [
        _mode_table(f"{config.stem}: {cfg.steps} steps per mode ({cfg.warmup_steps} warm-up not counted)", results)
    ]
    out.print(tables[-1])
    record: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "modes": [_as_dict(r) for r in results]}
    search = None
    if split and cfg.split.enabled:
        with console.status("split search") as status:
            search = split_search(
                cfg, on_result=lambda r: status.update(f"split search: eta={r.eta} R={r.rollout_gpus}")
            )
        for item in _split_report(cfg, search):
            tables.append(item)
            out.print(item)
        record["split"] = {str(eta): [_as_dict(r) for r in rs] for eta, rs in search.results.items()}
    if plot:
        from asearch.sim.plot import plot_run

        console.print(f"figure: {plot_run(results, search, plot, title=f'asearch sim {config.name}')}")
    if json_out:
        from asearch.files import atomic_write_json

        atomic_write_json(json_out, record)
    if out_dir is not None:
        dump_config(cfg, out_dir / "config.yaml")
        _write_report(out_dir / "report.txt", tables)
        console.print(f"wrote {out_dir}: report.txt, results.json, plot.png, config.yaml")


def _split_report(cfg: Any, search: Any) -> list[Any]:
    """The split-search table (trajectories/s per rollout/trainer split and eta), its legend and best splits."""
    t = Table(title=f"rollout/trainer split search ({cfg.split.steps or cfg.steps} steps each): trajectories/s")
    t.add_column("rollout/trainer GPUs")
    for eta in search.results:
        t.add_column(f"eta={eta}", justify="right")
    splits = [r.rollout_gpus for r in next(iter(search.results.values()))]
    for i, rg in enumerate(splits):
        row = []
        for eta, rs in search.results.items():
            mark = " *" if search.best[eta] is rs[i] else ""
            row.append(
                f"{rs[i].trajectories_per_s:.2f} (idle {_pct(rs[i].rollout_idle)}/{_pct(rs[i].trainer_idle)}){mark}"
            )
        t.add_row(f"{rg}/{cfg.cluster.gpus - rg}", *row)
    lines = [
        f"best split for eta={eta}: {b.rollout_gpus} rollout / {b.trainer_gpus} trainer GPUs, "
        f"{b.trajectories_per_s:.2f} trajectories/s"
        for eta, b in search.best.items()
    ]
    return [t, "(idle: rollout/trainer; * best split per eta)", *lines]


def _write_report(path: Path, items: list[Any]) -> None:
    """`items` (tables, lines) as plain text, as `asearch sim` printed them."""
    from asearch.files import atomic_write_text

    buffer = io.StringIO()
    text = Console(file=buffer, width=out.width, color_system=None)  # laid out as the tables were printed
    for item in items:
        text.print(item, markup=not isinstance(item, str), soft_wrap=isinstance(item, str))
    atomic_write_text(path, buffer.getvalue())


def _as_dict(r: Any) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(r)
    d.pop("step_end_s", None)
    derived = ("trajectories_per_s", "gen_tokens_per_s", "train_tokens_per_s", "gpu_idle")
    return {"name": r.name, **d, **{k: getattr(r, k) for k in derived}}


def _calibrate(paths: list[Path], json_out: Path | None, out_dir: Path | None) -> None:
    from asearch.files import atomic_write_text
    from asearch.sim.calibrate import calibrate, format_calibration

    rows = [row for p in paths for row in calibrate(p)]
    report = format_calibration(rows, command="asearch sim --calibrate " + " ".join(map(str, paths)))
    out.print(report, markup=False)
    if out_dir is not None:
        atomic_write_text(out_dir / "calibration.md", report)
    if json_out:
        from asearch.files import atomic_write_json

        atomic_write_json(json_out, [{k: v for k, v in r.items() if k != "config"} for r in rows])
