"""Shared CLI pieces: the rich console, progress bars, and the config/override arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (see configs/).", exists=True, dir_okay=False)
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Config overrides, `key.sub=value` (any key of the YAML), applied over the file.", show_default=False)
]


def progress(transient: bool = False) -> Progress:
    """A progress bar with count, rate and ETA; unknown totals show a spinner."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}", style="dim"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
    )
