"""`asearch train CONFIG` and `asearch demo`: RL training runs and the CPU learning demo."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from asearch.cli.console import OverridesArg, console


def train(
    config: Annotated[Path, typer.Argument(help="Training YAML (see configs/).", exists=True, dir_okay=False)],
    overrides: OverridesArg = None,
    out: Annotated[Path | None, typer.Option(help="Run directory; an existing one is resumed.")] = None,
) -> None:
    """Train a search agent with fully asynchronous RL (resumes from the run directory's last checkpoint)."""
    from asearch.config import load_config
    from asearch.launch.train import TrainConfig
    from asearch.launch.train import train as run_train
    from asearch.runs import RunDir

    cfg = load_config(TrainConfig, config, [*(overrides or []), *([f"out={out}"] if out else [])])
    path = cfg.out or Path("runs") / f"train-{config.stem}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"run directory: [bold]{path}[/bold]")
    summary = asyncio.run(run_train(cfg, run=RunDir(path), log=console.print))
    print(json.dumps(summary, indent=2))


def demo(
    seed: Annotated[int, typer.Option(help="Seed of worlds, model, SFT and RL.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Run directory (default runs/demo-seed<seed>-<time>).")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Demo YAML.", exists=True, dir_okay=False)] = None,
    preset: Annotated[str, typer.Option(help="Starting settings: 'default' (search only, 1-3 hops) or 'long' "
                                        "(access, reading turns with summaries, 1-6 hops; docs/demo.md).")] = "default",
    overrides: OverridesArg = None,
) -> None:
    """The CPU learning demo: a tiny search agent learns multi-hop search on the embedded world."""
    from asearch.config import load_config
    from asearch.demo.pipeline import DemoConfig, run_demo
    from asearch.demo.presets import preset as preset_settings

    cfg = load_config(
        DemoConfig, config, [f"seed={seed}", *([f"out={out}"] if out else []), *(overrides or [])],
        base=preset_settings(preset),
    )  # fmt: skip
    summary = run_demo(cfg, log=console.print)
    print(json.dumps(summary, indent=2))
