"""`asearch ask` over the engine registry: a dry run with kind `scripted` (no model), the kinds in --help,
and engine mistakes reported as one line naming the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from asearch.cli.app import app

PAGES = [{"id": "ada", "title": "Ada Varn", "text": "Ada Varn was born in Oslen."}]


def asearch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asearch", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_help_lists_the_registered_engine_kinds() -> None:
    from asearch.engine.registry import engine_kinds

    out = CliRunner().invoke(app, ["ask", "--help"], terminal_width=200).output
    assert all(kind in out for kind in engine_kinds()) and "guided" in out
    listed = CliRunner().invoke(app, ["engine", "kinds"], terminal_width=200).output.splitlines()
    assert [line.split(" ")[0].rstrip(":") for line in listed] == engine_kinds()
    assert "openai (needs engine.base_url): any OpenAI-compatible chat server" in "\n".join(listed)


def test_a_scripted_dry_run_answers_through_the_real_loop_and_tools(tmp_path, tok_dir, subprocess_env) -> None:
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PAGES))
    replies = json.dumps(["<search>Ada Varn</search>", "<answer>Oslen</answer>"])
    res = asearch(
        "ask", "Where was Ada Varn born?", "--engine", "scripted", "--model", str(tok_dir),
        "--corpus", str(corpus), "--style", "search-r1", "--json", f"engine.replies={replies}",
        env=subprocess_env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    traj = json.loads(res.stdout)
    assert traj["answer"] == "Oslen" and [t["action"] for t in traj["turns"]] == ["search", "answer"]
    assert "born in Oslen" in traj["turns"][0]["observation"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "http://127.0.0.1:9"], "engine.base_url is set but kind 'inprocess' uses no server"),
        (["--engine", "opnai"], "unknown engine kind 'opnai'; did you mean 'openai'?"),
        (["--engine", "openai"], "engine.kind='openai' needs engine.base_url"),
        (["engine.max_bach=2"], "did you mean 'engine.max_batch'?"),
    ],
)
def test_engine_mistakes_are_one_line_errors(args: list[str], message: str, subprocess_env) -> None:
    res = asearch("ask", "q", *args, env=subprocess_env)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "ConfigError" in res.stderr and message in " ".join(res.stderr.split()), res.stderr
