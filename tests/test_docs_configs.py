"""The configs and `key=value` examples that README, docs/*.md, configs/*.yaml comments and `--help` show work.

Every `configs/*.yaml` loads with the model of the command that takes it; every config a text cites exists;
every `asearch COMMAND ... key.sub=value` example loads with that command's model (real keys, valid values),
on top of the config file the example names.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asearch.cli.configs import config_model
from asearch.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


_model = config_model


COMMANDS = ("ask", "eval", "train", "plan", "demo", "index build", "serve", "sim", "synth")
# Required keys an example without a config file leaves to the file it does not show.
REQUIRED = {"train": {"model": "runs/demo-seed0/model-sft", "data": "world"}, "plan": {"model": "runs/demo-seed0/model-sft", "data": "world"}}
# configs/<prefix>*.yaml is read by this command.
FILE_COMMANDS = {
    "train-": "train",
    "eval": "eval",
    "synth-": "synth",
    "sim-": "sim",
    "index": "index build",
    "server": "serve",
    "demo": "demo",
}


def _command_of_file(path: Path) -> str | None:
    return next((c for prefix, c in FILE_COMMANDS.items() if path.name.startswith(prefix)), None)


# --------------------------------------------------------------------------- the texts


def _help_texts() -> Iterator[tuple[str, str, str | None]]:
    """(where, text, command whose model its bare overrides belong to) for every command's help."""
    import typer

    from asearch.cli.app import app

    def walk(cmd, path: list[str]) -> Iterator[tuple[str, str, str | None]]:
        texts = [cmd.help or "", getattr(cmd.callback, "__doc__", None) or ""]
        texts += [getattr(p, "help", None) or "" for p in cmd.params]
        name = " ".join(path)
        command = "synth" if name == "synth run" else name if name in COMMANDS else None
        yield f"asearch {name} --help".replace("  ", " "), "\n".join(t for t in texts if t), command
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, sub_name])

    yield from walk(typer.main.get_command(app), [])


def _doc_texts() -> Iterator[tuple[str, str]]:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield str(path.relative_to(ROOT)), path.read_text()


def _shell_snippets(text: str) -> Iterator[str]:
    """Shell lines of a markdown text (bash/sh/unlabelled fences and indented blocks, continuations joined)
    and its inline code spans."""
    fenced = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
    for m in fenced.finditer(text):
        if m.group(1) in ("", "bash", "sh", "shell", "console"):
            yield from m.group(2).replace("\\\n", " ").splitlines()
    prose = fenced.sub("", text)
    yield from (line for line in prose.replace("\\\n", " ").splitlines() if line.startswith("    "))
    yield from re.findall(r"`([^`\n]+)`", prose)


def _comment_lines(text: str) -> Iterator[str]:
    lines = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    yield from "\n".join(lines).replace("\\\n", " ").splitlines()


_ASEARCH = re.compile(r"(?:^|[\s;&|(])(?:\.venv/bin/)?asearch\s+([^;&|]*)")
_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(?:\.\w+)*=")


def _examples(snippet: str) -> Iterator[tuple[str, list[str]]]:
    """(command, its arguments) for every `asearch COMMAND ...` in a shell line (`ask/eval/train` gives three)."""
    for m in _ASEARCH.finditer(snippet):
        try:
            args = shlex.split(m.group(1), comments=True)
        except ValueError:  # an unbalanced quote: prose, not a command
            continue
        if not args:
            continue
        head, rest = args[0], args[1:]
        for name in head.split("/"):
            if name == "index" and rest[:1] == ["build"]:
                yield "index build", rest[1:]
            elif name == "synth" and rest[:1] != ["report"] and rest[:1] != ["measure"]:
                yield "synth", rest[1:] if rest[:1] == ["run"] else rest
            elif name in COMMANDS:
                yield name, rest


def _all_examples() -> list[tuple[str, str, tuple[str, ...]]]:
    found: dict[tuple[str, str, tuple[str, ...]], None] = {}  # in order, without repeats
    sources: list[tuple[str, Callable[[], Iterator[str]]]] = [
        (where, lambda t=text: _shell_snippets(t)) for where, text in _doc_texts()
    ]
    sources += [
        (str(p.relative_to(ROOT)), lambda t=p.read_text(): _comment_lines(t)) for p in sorted(CONFIGS.glob("*.yaml"))
    ]
    sources += [(where, lambda t=text: iter(re.findall(r"`([^`]+)`", t))) for where, text, _ in _help_texts()]
    for where, snippets in sources:
        for snippet in snippets():
            for command, args in _examples(snippet):
                found[where, command, tuple(args)] = None
    return list(found)


EXAMPLES = _all_examples()


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_loads_with_its_commands_model(path: Path) -> None:
    command = _command_of_file(path)
    assert command is not None, f"{path.name}: no command reads configs/{path.name}; add its prefix to FILE_COMMANDS"
    load_config(_model(command), path)


def test_every_cited_config_file_exists() -> None:
    texts = [*_doc_texts(), *((w, t) for w, t, _ in _help_texts())]
    texts += [(str(p.relative_to(ROOT)), p.read_text()) for p in CONFIGS.glob("*.yaml")]
    cited = {(where, m) for where, text in texts for m in re.findall(r"\bconfigs/[\w.*-]+\.ya?ml\b", text)}
    assert cited, "found no config citations: the pattern is broken"
    missing = sorted(f"{where}: {name}" for where, name in cited if not list(ROOT.glob(name)))
    assert not missing, "cited but not in configs/:\n" + "\n".join(missing)


def test_the_examples_were_found() -> None:
    """The extractor sees the examples this file exists for (a broken pattern would pass everything)."""
    seen = {(where, command) for where, command, _ in EXAMPLES}
    assert ("asearch eval --help", "eval") in seen
    assert ("docs/sim.md", "sim") in seen and ("README.md", "train") in seen
    assert sum(1 for *_, args in EXAMPLES if any(_OVERRIDE.match(a) for a in args)) >= 20


@pytest.mark.parametrize(
    ("where", "command", "args"),
    [e for e in EXAMPLES if any(_OVERRIDE.match(a) for a in e[2])],
    ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60],
)
def test_every_override_example_loads_with_its_commands_model(where: str, command: str, args: tuple[str, ...]) -> None:
    overrides = [a for a in args if _OVERRIDE.match(a)]
    files = [ROOT / a for a in args if a.endswith((".yaml", ".yml")) and (ROOT / a).is_file()]
    path = files[0] if files else None
    cfg = load_config(model := _model(command), path, overrides, base=None if path else REQUIRED.get(command))
    assert isinstance(cfg, model), cfg  # loaded, every key known (else ConfigError)


@pytest.mark.parametrize(("where", "text", "command"), [h for h in _help_texts() if h[2]], ids=lambda v: str(v)[:40])
def test_bare_overrides_in_help_are_real_keys_of_the_command(where: str, text: str, command: str) -> None:
    """`a.b=value` in a command's help outside a quoted example is an override of that command."""
    prose = re.sub(r"`[^`]*`|'[^']*'", "", text)
    overrides = re.findall(r"(?<![\w:,.=/-])([a-z_]\w*(?:\.\w+)+=[^\s,;)]+)", prose)
    cfg = load_config(model := _model(command), None, overrides, base=REQUIRED.get(command))
    assert isinstance(cfg, model), cfg  # loaded, every key known (else ConfigError)

