"""`asearch config list | show NAME`: the YAML configs installed with the package (a clone's `configs/`)."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from asearch.cli.console import make_console, resolve_config, shipped_configs

app = typer.Typer(
    help="The shipped YAML configs: list them, print one to start your own from. Every command that takes a "
    "config file also takes a shipped config's name (`asearch train train-world-tiny`).",
    no_args_is_help=True,
)
stdout = make_console(stderr=False)

# The command that reads configs/<prefix>*.yaml (tests/test_docs_configs.py loads each with its model).
COMMAND_OF_PREFIX = {
    "train-": "asearch train NAME",
    "eval": "asearch eval -c NAME",
    "synth-": "asearch synth NAME",
    "sim-": "asearch sim NAME",
    "index": "asearch index build -c NAME",
    "server": "asearch serve -c NAME",
    "demo-": "asearch demo -c NAME",
}


def config_model(command: str) -> type:
    """The config model `asearch COMMAND` loads its YAML and `key=value` overrides into."""
    import importlib

    if command == "eval":
        from asearch.cli.eval import _run_config_model

        return _run_config_model()
    where = {
        "ask": "asearch.agent.runtime:RuntimeConfig", "train": "asearch.launch.train:TrainConfig",
        "plan": "asearch.launch.train:TrainConfig",
        "demo": "asearch.demo.pipeline:DemoConfig", "index build": "asearch.retrieval.index:IndexConfig",
        "serve": "asearch.retrieval.server:ServerConfig", "sim": "asearch.sim.config:SimConfig",
        "engine serve": "asearch.cli.engine:ServeConfig",
        "synth": "asearch.synth.config:SynthConfig", "synth run": "asearch.synth.config:SynthConfig",
    }.get(command)  # fmt: skip
    if where is None:
        raise KeyError(f"no config model known for `asearch {command}`")
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)


def command_for(name: str) -> str:
    """How a shipped config is used, e.g. `asearch train train-world-tiny`."""
    usage = next((c for prefix, c in COMMAND_OF_PREFIX.items() if name.startswith(prefix)), "-")
    return usage.replace("NAME", name)


def summary_line(text: str) -> str:
    """What a config is for: the first sentence (up to `. ` or `: `) of its leading comment paragraph."""
    paragraph = []
    for line in text.splitlines():
        words = line.lstrip("#").strip()
        if not line.startswith("#") or not words:
            break
        paragraph.append(words)
    return re.split(r"(?<=[.:])\s", " ".join(paragraph), maxsplit=1)[0].rstrip(".:")


@app.command("list")
def list_configs() -> None:
    """Name, the command that runs it, and what it is for, of every shipped config."""
    table = Table("name", "run with", "what it is", box=None, header_style="bold")
    for name, path in shipped_configs().items():
        table.add_row(escape(name), escape(command_for(name)), escape(summary_line(path.read_text())))
    stdout.print(table)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="A shipped config's name (`asearch config list`) or a YAML file.")],
    path_only: Annotated[bool, typer.Option("--path", help="Print only where the file is.")] = False,
) -> None:
    """Print a config as written, comments included (`asearch config show eval > my-eval.yaml` to start one)."""
    path = resolve_config(name)
    if path_only:
        print(path.absolute())
    else:
        print(path.read_text(), end="")
