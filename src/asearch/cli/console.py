"""Shared CLI pieces: the rich console, progress bars, the config/override arguments, validated option values."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
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

from asearch.errors import ConfigError

console = Console(stderr=True)
M = TypeVar("M", bound=BaseModel)

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


def from_options(model: type[M], options: dict[str, Any], *, over: BaseModel | None = None) -> M:
    """`model` from command-line option values (laid over `over`'s values, e.g. the config file's).

    A bad value is a ConfigError naming the option as typed, `--port: Input should be less than or equal
    to 65535 (got 70000)`, instead of a pydantic traceback; a rule across fields is named by its message.
    """
    try:
        return model.model_validate({**(over.model_dump() if over is not None else {}), **options})
    except ValidationError as e:
        problems = [
            f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']} (got {err['input']!r})"
            if err["loc"]
            else err["msg"].removeprefix("Value error, ")
            for err in e.errors()
        ]
        raise ConfigError("; ".join(problems)) from None
