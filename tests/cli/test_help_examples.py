"""Every `key=value` a command's --help shows is a real key of that command's config model, with a valid
value; the commands that take overrides show one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main

from asearch.cli.app import app
from asearch.cli.configs import config_model
from asearch.config import load_config

ROOT = Path(__file__).resolve().parents[2]
# `a.b=value` where the key is a name (not `engine.<key>=value`, not inside a url's query)
_OVERRIDE = re.compile(r"(?<![\w:,.=/<-])([a-z_]\w*(?:\.\w+)*)=([^\s`',;)]+)")
# Required keys an override example leaves to the config file it does not show.
REQUIRED = {"train": {"model": "m", "data": "world"}, "plan": {"model": "m", "data": "world"}}


_model = config_model


def _commands() -> Iterator[tuple[str, object]]:
    def walk(cmd, path: list[str]) -> Iterator[tuple[str, object]]:
        if path and not getattr(cmd, "commands", None):
            yield " ".join(path), cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    root = typer.main.get_command(app)
    yield from walk(root, [])
    yield "eval", root.commands["eval"]  # a group that is itself the command


def _help_text(cmd) -> str:
    """The help of a command and its parameters, without quoted corpus specs ('names=N') and without the
    placeholder `key.sub=value`."""
    texts = [cmd.help or "", getattr(cmd.callback, "__doc__", None) or ""]
    text = "\n".join([*texts, *(getattr(p, "help", None) or "" for p in cmd.params)])
    return re.sub(r"'[^'\s]*'|key\.sub=value", "", text)


def _takes_overrides(cmd) -> bool:
    return any(p.name == "overrides" for p in cmd.params)


COMMANDS = sorted(dict(_commands()).items())


def test_the_commands_and_examples_were_found() -> None:
    names = [name for name, _ in COMMANDS]
    assert {"ask", "train", "eval", "index build", "sim", "demo", "corpus info", "config list"} <= set(names)
    shown = {name for name, cmd in COMMANDS if _OVERRIDE.search(_help_text(cmd))}
    assert {"ask", "train", "eval", "index build", "sim", "demo"} <= shown


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_help_overrides_are_real_keys_with_valid_values(name: str, cmd) -> None:
    """Each example (a code span, or the prose around them) loads on its own, over the config file the
    example names (`asearch synth configs/synth-llm.yaml llm.generator.base_url=...`)."""
    text = _help_text(cmd)
    for example in [*re.findall(r"`([^`]+)`", text), re.sub(r"`[^`]*`", "", text)]:
        overrides = [f"{key}={value}" for key, value in _OVERRIDE.findall(example)]
        if not overrides:
            continue
        files = [ROOT / f for f in re.findall(r"\bconfigs/[\w.-]+\.yaml\b", example)]
        cfg = load_config(model := _model(name), files[0] if files else None, overrides, base=None if files else REQUIRED.get(name))
        assert isinstance(cfg, model), cfg  # loaded, every key known (else ConfigError)


@pytest.mark.parametrize(
    ("name", "cmd"), [(n, c) for n, c in COMMANDS if _takes_overrides(c)], ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_command_that_takes_overrides_shows_one(name: str, cmd) -> None:
    assert _OVERRIDE.search(_help_text(cmd)), f"`asearch {name} --help` shows no `key=value` example"

