"""`asearch plan CONFIG`: the predicted peak memory of a training config, per trainer rank and rollout server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from asearch.cli.console import config_argument, make_console, overrides_argument

out = make_console(stderr=False)


def plan(
    config: Annotated[Path, config_argument("Training YAML (what `asearch train` takes).")],
    overrides: Annotated[
        list[str] | None, overrides_argument("allocation.trainer_ranks=8 trainer.token_budget=8192")
    ] = None,
    device_memory_gb: Annotated[
        float | None,
        typer.Option(help="Memory of one device in GiB (default: device_memory_gb, else the visible GPU's, else "
                     "this machine's RAM for a CPU trainer)."),
    ] = None,
) -> None:
    """Print the memory plan of a training config before launch: per trainer rank and per rollout server,
    each component's bytes, the total against the device, and the knobs that would make it fit (docs/plan.md).
    Exits 1 when it does not fit. Example: `asearch plan configs/train-qwen2.5-7b-2x8h100.yaml --device-memory-gb 80`."""
    from asearch.config import load_config
    from asearch.launch.plan import plan_for
    from asearch.launch.train import TrainConfig

    cfg = load_config(TrainConfig, config, overrides or [])
    memory_plan = plan_for(cfg, override_gb=device_memory_gb)
    out.print(memory_plan.render(), markup=False, highlight=False)
    if memory_plan.fits is False:
        raise typer.Exit(1)
