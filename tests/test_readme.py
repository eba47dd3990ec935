"""The README's command blocks, run as written (bash, the real CLI, curl) in a fresh clone's directory, on
free ports: every one succeeds and prints no warning. The HTTP blocks run in `make test`; the blocks that
load SmolLM2 or train are slow (`make test-all`). A test checks that every bash block is run by one of them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from asearch.net import free_port

ROOT = Path(__file__).resolve().parents[1]


def _section(title: str) -> str:
    return (ROOT / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(title: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", _section(title), re.S)


def _http_blocks() -> list[str]:
    return _blocks("Search a corpus over HTTP")


# The README sections whose bash blocks the tests below run, in order. The first block (`make demo`,
# `make test`) is what CI itself runs.
RUN_SECTIONS = ("Search a corpus over HTTP", "Ask an agent", "Evaluate", "Train")


def test_every_readme_bash_block_is_run_by_a_test() -> None:
    text = (ROOT / "README.md").read_text()
    every = re.findall(r"```bash\n(.*?)```", text, re.S)
    run = [block for title in RUN_SECTIONS for block in _blocks(title)]
    assert every[0].startswith("make demo") and every[1:] == [b for b in every if b in run], (
        "a README bash block outside RUN_SECTIONS: add its section to a test"
    )


def _fresh_clone(tmp_path: Path) -> Path:
    """A directory laid out as a fresh clone for the README's paths (.venv/bin/asearch, configs/), with
    nothing built yet, and its own model and index cache."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    (clone / "configs").symlink_to(ROOT / "configs")
    return clone


def run_block(script: str, cwd: Path, *, cache: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    """`script` with each `--port N` moved to a free port, under `set -e` (any failing command fails it)
    and a trap that stops its background servers; `asearch view` (a server in the foreground) is
    started in the background and fetched once."""
    for port in set(re.findall(r"--port (\d+)", script)):
        script = script.replace(port, str(free_port()))

    def view_in_background(m: re.Match) -> str:
        port = free_port()
        return (f"{m.group(1)} --port {port} &\nuntil curl -sf localhost:{port}/ >/dev/null; do sleep 0.5; done\n"
                f"curl -sf localhost:{port}/ >/dev/null")  # fmt: skip

    script = re.sub(r"^(\.venv/bin/asearch view [^#\n]*?)\s*(#.*)?$", view_in_background, script, flags=re.M)
    bin_dir = ROOT / ".venv" / "bin"
    wrapped = f"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1", "ASEARCH_CACHE": str(cache)}
    return subprocess.run(["bash", "-c", wrapped], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _assert_clean(done: subprocess.CompletedProcess, script: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script}\n{done.stderr[-3000:]}"
    assert "warning" not in output.lower(), f"{script}\nprinted a warning:\n{output[-3000:]}"


def _answer(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("answer: "))
    return line.removeprefix("answer: ").split("   finish=")[0]


@pytest.mark.slow  # converts SmolLM2 and indexes wiki10k, then 3 agent commands and 3 evals on 2 cores
@pytest.mark.timeout(3600)
def test_readme_ask_and_evaluate_blocks_work_as_written(tmp_path: Path) -> None:
    clone, cache = _fresh_clone(tmp_path), tmp_path / "cache"
    ask, served = _blocks("Ask an agent")
    done = run_block(ask, clone, cache=cache)
    _assert_clean(done, ask)
    shown = re.search(r"```text\n(.*?)```", _section("Ask an agent"), re.S).group(1)
    assert _answer(done.stderr) == _answer(shown), "the README shows another answer than `asearch ask` gives"
    assert "evidence: " in done.stderr and "asearch engine serve" in done.stderr
    done = run_block(served, clone, cache=cache)
    _assert_clean(done, served)
    assert _answer(done.stderr)
    (evaluate,) = _blocks("Evaluate")
    done = run_block(evaluate, clone, cache=cache)
    _assert_clean(done, evaluate)
    for run in ("runs/eval-wiki10k", "runs/eval-world"):
        assert (clone / run / "summary.json").is_file()


@pytest.mark.slow  # the whole CPU demo, then its RL stage again: about half an hour on 2 cores
@pytest.mark.timeout(5400)
def test_readme_train_block_works_as_written(tmp_path: Path) -> None:
    clone = _fresh_clone(tmp_path)
    (train,) = _blocks("Train")
    done = run_block(train, clone, cache=tmp_path / "cache", timeout=5000)
    _assert_clean(done, train)
    assert (clone / "runs" / "demo-seed0" / "model-sft").is_dir()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize(
    ("block", "expect_url"),
    [(0, "https://world0.example/wiki/Vantern"), (1, "https://en.wikipedia.org/wiki/Mona_Lisa")],
    ids=["world", "wiki10k"],
)
def test_readme_http_block_works_as_written(block: int, expect_url: str, tmp_path: Path) -> None:
    script = _http_blocks()[block]
    port = re.search(r"--port (\d+)", script).group(1)
    script = script.replace(port, str(free_port()))  # the same commands, on a port free here
    bin_dir = ROOT / ".venv" / "bin"
    # `set -e` plus a trap: a failing command fails the test, and the backgrounded server always stops
    wrapped = f"set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "-c", wrapped.replace(".venv/bin/", f"{bin_dir}/")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stderr[-3000:]
    replies, text, decoder = [], done.stdout.strip(), json.JSONDecoder()
    while text:  # curl prints no newline after a body: the two replies may share a line
        obj, end = decoder.raw_decode(text)
        replies.append(obj)
        text = text[end:].lstrip()
    assert len(replies) == 2, done.stdout[-2000:]
    retrieved, accessed = replies
    hits = retrieved["result"][0]
    docs = [h["document"] if "document" in h else h for h in hits]
    assert docs and all({"id", "contents", "url"} <= d.keys() for d in docs)
    assert expect_url in [d["url"] for d in docs], [d["url"] for d in docs]
    page = accessed["result"][0]
    assert page is not None and page["url"] == expect_url and page["contents"]
