"""The top-level CLI: every command has --help, and AsearchError becomes `Type: message` with exit 1."""

from __future__ import annotations

import subprocess
import sys

import typer.main
from typer.testing import CliRunner

from asearch.cli.app import app


def _all_command_paths():
    root = typer.main.get_command(app)
    stack = [((), root)]
    while stack:
        path, cmd = stack.pop()
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            stack.append(((*path, name), sub))


def test_every_command_has_help():
    runner = CliRunner()
    paths = list(_all_command_paths())
    assert len(paths) > 3
    for path in paths:
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage" in res.output


def test_asearch_error_is_reported_not_traced(tmp_path):
    bad = tmp_path / "missing.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "asearch", "corpus", "info", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert "Error" in res.stderr and "missing.jsonl" in res.stderr
