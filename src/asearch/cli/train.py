"""`asearch train CONFIG` and `asearch demo`: RL training runs and the CPU learning demo."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from asearch.cli.console import ConfigOption, config_argument, console, overrides_argument
from asearch.errors import ConfigError

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".tsv", ".csv")


def train(
    config: Annotated[Path, config_argument("Training YAML.")],
    overrides: Annotated[list[str] | None, overrides_argument("rollout.max_staleness=4 trainer.optim.lr=1e-4")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory; an existing one is resumed.")] = None,
    replay: Annotated[
        Path | None,
        typer.Option(help="Answer every search/access from RUN_DIR's tool record only, calling no backend; "
                     "misses are refused and counted (docs/replay.md)."),
    ] = None,
) -> None:
    """Train a search agent with fully asynchronous RL (resumes from the run directory's last checkpoint)."""
    from asearch.config import load_config
    from asearch.launch.plan import refuse_if_too_big
    from asearch.launch.train import TrainConfig
    from asearch.launch.train import train as run_train
    from asearch.runs import RunDir

    flags = [*([f"out={out}"] if out else []), *([f"tools.record.replay={json.dumps(str(replay))}"] if replay else [])]
    cfg = load_config(TrainConfig, config, [*(overrides or []), *flags])
    check_inputs_exist(cfg, config)  # before the run directory exists: a failed start leaves nothing behind
    refuse_if_too_big(cfg)  # the memory plan (docs/plan.md), also before the run directory
    path = cfg.out or Path("runs") / f"train-{config.stem}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"run directory: [bold]{path}[/bold]")
    summary = asyncio.run(run_train(cfg, run=RunDir(path), log=console.print))
    print(json.dumps(summary, indent=2))


def check_inputs_exist(cfg: Any, config: Path) -> None:
    """Refuse a config whose model, data or held-out set is a local path that is not there, naming the
    command that writes it when it is a demo run's (`runs/demo-seed0/model-sft`: `asearch demo --seed 0`)."""
    wanted = {"model": cfg.model, "data": cfg.data, "heldout.dataset": cfg.heldout.dataset}
    missing = [(key, value) for key, value in wanted.items() if value and _missing_local_path(key, value)]
    if not missing:
        return
    lines = [f"{config}: the run's inputs are not there (nothing was started):"]
    lines += [f"  {key}={value}: no such file or directory" for key, value in missing]
    demo_runs = sorted({m.group(0) for _, v in missing if (m := re.match(r"(?:\./)?runs/demo-seed(\d+)", v))})
    for run in demo_runs:
        seed = re.search(r"\d+$", run).group(0)  # type: ignore[union-attr]
        lines.append(
            f"{run} is what the CPU demo writes: run `asearch demo --seed {seed} --out {run}` first, "
            "or set model= and data= to your own"
        )
    raise ConfigError("\n".join(lines))


def _missing_local_path(key: str, value: str) -> bool:
    """True for a local path (not a hub model name, built-in alias or dataset spec) that does not exist."""
    from asearch.models.loading import BUILTIN_MODELS

    if Path(value).expanduser().exists() or value.lower() in BUILTIN_MODELS:
        return False
    if key == "model":  # `org/name` is a hub model; a deeper or explicitly relative/absolute path is local
        return value.startswith((".", "/", "~")) or value.count("/") > 1
    return value.endswith(DATA_SUFFIXES) or "/" in value


def demo(
    seed: Annotated[int, typer.Option(help="Seed of worlds, model, SFT and RL.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Run directory (default runs/demo-seed<seed>-<time>).")] = None,
    config: ConfigOption = None,
    preset: Annotated[str, typer.Option(help="Starting settings: 'default' (search only, 1-3 hops) or 'long' "
                                        "(access, reading turns with summaries, 1-6 hops; docs/demo.md).")] = "default",
    overrides: Annotated[list[str] | None, overrides_argument("rl.max_rl_seconds=300 sft.steps=400")] = None,
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
