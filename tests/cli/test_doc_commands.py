"""Every `asearch ...` command line that README.md and docs/*.md show parses with the real CLI: the command
exists, its options exist, and its arguments fit (nothing runs). Values are not judged here (a placeholder
file need not exist); `key=value` overrides are loaded by tests/test_docs_configs.py."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.core
import typer.main

# typer carries its own copy of click: its exceptions are the ones a parse raises
from typer._click import core as cli_core
from typer._click import exceptions as cli_errors

from asearch.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_ASEARCH = re.compile(r"(?:^|[\s;&|(`])(?:\.venv/bin/)?asearch\s+([a-z][^;&|`]*)")
# a usage synopsis, not a command: `[--words N]`, `passages|pages`, `RUN...`, `<that kind's options>`
_SYNOPSIS = re.compile(r"\[-|\w\|\w|\.\.\.|<\w")


def _snippets(text: str) -> Iterator[tuple[str, bool]]:
    """(shell line, whether it is an inline code span) for the lines of fenced bash/sh/unlabelled blocks
    (continuations joined) and the inline code spans of the prose."""
    for m in _FENCE.finditer(text):
        if m.group(1) in ("", "bash", "sh", "shell", "console"):
            yield from ((line, False) for line in m.group(2).replace("\\\n", " ").splitlines())
    yield from ((span, True) for span in re.findall(r"`([^`\n]+)`", _FENCE.sub("", text)))


def _commands() -> list[tuple[str, tuple[str, ...], bool]]:
    found: dict[tuple[str, tuple[str, ...], bool], None] = {}
    for path in DOCS:
        for snippet, inline in _snippets(path.read_text()):
            for m in _ASEARCH.finditer(snippet):
                line = m.group(1).split(" #", 1)[0].strip()
                if _SYNOPSIS.search(line):
                    continue
                try:
                    argv = shlex.split(line, comments=True)
                except ValueError:  # an unbalanced quote: prose
                    continue
                if argv:
                    found[str(path.relative_to(ROOT)), tuple(argv), inline] = None
    return list(found)


COMMANDS = _commands()


def parse_problem(argv: list[str], *, prose: bool = False) -> str | None:
    """Why `asearch ARGV` does not parse (unknown command or option, missing or extra argument), or None.
    A bad value (a file that is not here, a placeholder) is not a shape problem and passes. `prose`: an
    inline mention (`asearch ask --json`), which may leave out required arguments."""
    command = typer.main.get_command(app)
    parent, args, name = None, list(argv), "asearch"
    while True:
        try:
            ctx = command.make_context(name, args, parent=parent)
        except (cli_errors.NoArgsIsHelpError, cli_core.Exit):
            return None  # a command group named in prose (`asearch corpus`), or `--help`
        except (cli_errors.MissingParameter, cli_errors.BadOptionUsage) as e:  # `asearch eval -d` in prose
            return None if prose else e.format_message()
        except cli_errors.BadParameter:
            return None
        except cli_errors.UsageError as e:
            return e.format_message()
        rest = [*ctx._protected_args, *ctx.args]  # noqa: SLF001 (what a group passes to its subcommand)
        if not isinstance(command, typer.core.TyperGroup) or not rest:
            return f"unexpected extra arguments {rest}" if rest else None
        if "/" in rest[0]:  # `asearch index build/info/search`: prose naming several commands
            return None
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return f"no command {rest[0]!r} under {name!r}"
        parent, command, args, name = ctx, sub, rest[1:], rest[0]


def test_the_commands_were_found() -> None:
    """The extractor sees what it exists for (a broken pattern would pass everything)."""
    where = {w for w, *_ in COMMANDS}
    assert {"README.md", "docs/retrieval.md", "docs/sim.md", "docs/corpora.md"} <= where
    assert ("README.md", ("index", "build", "--corpus", "world", "--out", "indexes/world"), False) in COMMANDS
    assert len(COMMANDS) > 60


def test_the_parser_catches_the_shapes_it_checks() -> None:
    assert parse_problem(["index", "build", "--corpus", "world", "--out", "x"]) is None
    assert parse_problem(["index", "build", "world", "--out", "x", "chunk.words=80"]) is None
    assert parse_problem(["corpus", "info", "--corpus", "world"]) is None
    assert "--nope" in parse_problem(["corpus", "info", "world", "--nope"])
    assert "nosuch" in parse_problem(["nosuch"])
    assert "--out" in parse_problem(["index", "build", "--corpus", "world"])
    assert "extra" in parse_problem(["corpus", "show", "wiki10k", "Mona Lisa", "three"])
    assert parse_problem(["sim", "--calibrate", "not-here.json"]) is None  # a value problem only
    assert "question" in parse_problem(["ask", "--json"]) and parse_problem(["ask", "--json"], prose=True) is None


@pytest.mark.parametrize(("where", "argv", "inline"), COMMANDS, ids=[f"{w}: {' '.join(a)[:70]}" for w, a, _ in COMMANDS])
def test_every_documented_command_parses(where: str, argv: tuple[str, ...], inline: bool) -> None:
    problem = parse_problem(list(argv), prose=inline)
    assert problem is None, f"{where}: `asearch {' '.join(argv)}`: {problem}"
