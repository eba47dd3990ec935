"""Output written to a file or a pipe: no line broken at 80 columns, panels and tables still whole, no
transient progress residue, and no tqdm fragments (from transformers, or from the model conversion)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.panel import Panel

from asearch.cli import console as console_module
from asearch.cli.console import LOG_WIDTH, make_console


def _log_console(monkeypatch) -> tuple[io.StringIO, object]:
    """A log console writing into a buffer that is not a terminal (what `make_console` sees in a pipe).
    Called in the test itself: pytest swaps sys.stderr back between a fixture and the test."""
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buffer)
    monkeypatch.delenv("COLUMNS", raising=False)
    return buffer, make_console(stderr=True)


def test_a_long_log_line_stays_one_line(monkeypatch) -> None:
    buffer, console = _log_console(monkeypatch)
    line = "step 12: " + " ".join(f"metric_{i}=0.{i:03d}" for i in range(30))
    assert len(line) > 2 * LOG_WIDTH
    console.print(line)
    assert buffer.getvalue() == line + "\n"


def test_panels_wrap_inside_their_width_and_lose_nothing(monkeypatch) -> None:
    buffer, console = _log_console(monkeypatch)
    words = [f"word{i}" for i in range(120)]
    console.print(Panel(" ".join(words), title="turn 1"))
    lines = buffer.getvalue().splitlines()
    assert len(lines) > 3 and max(len(line) for line in lines) == LOG_WIDTH
    assert " ".join(lines).split().count("word119") == 1  # the whole text, none cropped


def test_columns_sets_the_width_off_a_terminal(monkeypatch) -> None:
    _log_console(monkeypatch)
    monkeypatch.setenv("COLUMNS", "120")
    assert make_console(stderr=True).width == 120


def test_a_transient_bar_leaves_nothing_in_a_log(monkeypatch) -> None:
    buffer, console = _log_console(monkeypatch)
    monkeypatch.setattr(console_module, "console", console)
    with console_module.progress(transient=True) as bar:
        task = bar.add_task("count", total=3, rate="")
        bar.update(task, completed=3)
    assert buffer.getvalue() == ""


def test_the_cli_turns_library_progress_bars_off_in_a_log() -> None:
    code = (
        "import os, sys\nsys.argv = ['asearch', 'version']\nfrom asearch.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint(os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "1", res.stdout + res.stderr


@pytest.mark.slow  # converts SmolLM2-135M from its GGUF file (~50 s on 2 cores)
def test_model_conversion_logs_two_lines_off_a_terminal(tmp_path) -> None:
    pytest.importorskip("gguf")
    env = {**os.environ, "ASEARCH_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # the conversion itself keeps its log quiet
    res = subprocess.run(
        [sys.executable, "-c", "from asearch.models.smollm import smollm2_path; print(smollm2_path())"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, res.stderr[-2000:]
    assert lines[0].startswith("converting SmolLM2-135M-Instruct.Q4_1.gguf") and lines[1].startswith("converted ")
