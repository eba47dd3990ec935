"""The one progress bar of every long job: what it does, count, the job's own fields, time and ETA.

    with progress_bar("{task.fields[rate]}") as bar:
        task = bar.add_task("index", total=n, rate="")
"""

from __future__ import annotations

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


def progress_bar(*fields: str, console: Console | None = None, transient: bool = False) -> Progress:
    """A bar with count and ETA (a spinner where the total is unknown), and a column per template in
    `fields` (e.g. "{task.fields[rate]}") between the count and the times; on stderr unless `console` says.
    Off a terminal rich draws a bar once, when it stops: a transient one is then not drawn at all."""
    console = console or Console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(f, style="dim") for f in fields),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=transient and not console.is_terminal,
    )
