"""Shared CLI pieces: the rich console, progress bars, the config/override arguments, shipped configs,
validated option values."""

from __future__ import annotations

import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import Progress

from asearch.errors import ConfigError
from asearch.progress import progress_bar

# Off a terminal (a log file, a pipe) rich would wrap at 80 columns and break long log lines in two: there
# text lines are never wrapped, and tables and panels get this width (COLUMNS, when set, wins).
LOG_WIDTH = 200


class _LogConsole(Console):
    """A console off a terminal: a line of text is never broken (soft wrap), while panels and tables are
    still laid out to the console's width (soft wrap would crop their contents instead)."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if soft_wrap is None:
            soft_wrap = all(isinstance(o, str) for o in objects)
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


def make_console(*, stderr: bool) -> Console:
    """A console for stderr (logs) or stdout (results): rich's own on a terminal; elsewhere text lines are
    never wrapped and tables/panels are `COLUMNS` (else `LOG_WIDTH`) wide."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else LOG_WIDTH
    return _LogConsole(stderr=stderr, width=width)


console = make_console(stderr=True)
M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------- shipped configs


def shipped_configs() -> dict[str, Path]:
    """{name: path} of the YAML configs installed with the package (`asearch config list`); a clone's
    `configs/` directory is the same files."""
    directory = resources.files("asearch") / "configs"
    found = {p.name.removesuffix(".yaml"): Path(str(p)) for p in directory.iterdir() if p.name.endswith(".yaml")}
    return dict(sorted(found.items()))


def resolve_config(value: str | Path) -> Path:
    """A config file: `value` itself when it is a file, else the shipped config it names (`train-world-tiny`,
    `train-world-tiny.yaml` or `configs/train-world-tiny.yaml`, so a clone's paths work after a pip install).

    Anything else is a ConfigError naming the value and the shipped names."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"{value}: is a directory, not a YAML config file")
    shipped = shipped_configs()
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    if name in shipped and path.parent in (Path("."), Path("configs")):
        return shipped[name]
    raise ConfigError(
        f"{value}: no such file, and not the name of a shipped config ({', '.join(shipped)}; "
        "`asearch config list`)"
    )


def _config_callback(value: Path | None) -> Path | None:
    if value is None:
        return None
    try:
        return resolve_config(value)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None


CONFIG_HELP = "YAML config: a file, or the name of a shipped one (`asearch config list`)."
ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP, callback=_config_callback)]


def config_argument(help: str) -> Any:
    """A config-file argument that also takes a shipped config's name (see `resolve_config`)."""
    return typer.Argument(help=f"{help} A file, or the name of a shipped config (`asearch config list`).",
                          callback=_config_callback, show_default=False)  # fmt: skip


def overrides_argument(example: str | None = None, *, corpus: bool = False) -> Any:
    """The `key.sub=value ...` argument; `example`: real overrides of the command (a test loads them);
    `corpus`: the first argument that is not an override may name the corpus (`index build SPEC ...`)."""
    shown = f", e.g. `{example}`" if example else ""
    first = "The corpus, unless --corpus gives it; then config" if corpus else "Config"
    return typer.Argument(
        help=f"{first} overrides, `key.sub=value` (any key of the YAML), applied over the file{shown}.",
        metavar="SPEC|KEY=VALUE" if corpus else "KEY=VALUE",
        show_default=False,
    )


OverridesArg = Annotated[list[str] | None, overrides_argument()]


# --------------------------------------------------------------------------- the corpus argument

CORPUS_OPTION_HELP = "The corpus (wiki10k, world[:opts], or a .jsonl path); the same as the first argument."
_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(?:\.\w+)*=")


def corpus_spec(positional: str | None, option: str | None, *, usage: str) -> str:
    """The corpus a command reads, given as its first argument or as `--corpus SPEC` (one shape for every
    command that reads a corpus); both at once must agree. `usage` is the command line shown when neither is."""
    if positional is not None and option is not None and positional != option:
        raise ConfigError(f"two corpora given: {positional!r} and --corpus {option!r}; give one")
    spec = option if option is not None else positional
    if not spec:
        raise ConfigError(f"give a corpus: `{usage}` (wiki10k, world[:opts] or a .jsonl path)")
    return spec


def split_corpus_from_overrides(args: list[str]) -> tuple[str | None, list[str]]:
    """(the first argument that is not a `key=value` override, the overrides): `index build SPEC k=v ...`."""
    for i, arg in enumerate(args):
        if not _OVERRIDE.match(arg):
            return arg, [*args[:i], *args[i + 1 :]]
    return None, list(args)


def progress(transient: bool = False) -> Progress:
    """The commands' progress bar: count, rate and ETA on the log console (a transient one is not drawn off a
    terminal, where it would leave an empty line)."""
    return progress_bar("{task.fields[rate]}", console=console, transient=transient)


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
