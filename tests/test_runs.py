"""The run directory survives a kill mid-write: a torn last line of metrics.jsonl or trajectories.jsonl is
cut when the run resumes, so the next row is not glued to it and every line parses (no DataFormatError)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asearch.files import iter_jsonl
from asearch.runs import RunDir

# A training run's writes in a loop: big trajectory rows (several page-cache pages each, so a kill can
# land inside one) and small metrics rows, as RunDir writes them.
WRITER = """
import sys
from asearch.runs import RunDir

run = RunDir(sys.argv[1], tensorboard=False)
step = 0
while True:
    step += 1
    run.log_trajectory({"step": step, "text": "x" * 4_000_000})
    run.log(step, {"loss": 1.0 / step})
"""


def lines(path: Path) -> list[dict]:
    """Every row, read strictly: a torn or glued line raises DataFormatError."""
    return [row for _, row in iter_jsonl(path)]


def logged_run(path: Path, steps: int) -> RunDir:
    run = RunDir(path, tensorboard=False)
    for step in range(1, steps + 1):
        run.log(step, {"loss": 1.0 / step})
        run.log_trajectory({"step": step, "answer": f"a{step}"})
    return run


@pytest.mark.parametrize("name", ["metrics.jsonl", "trajectories.jsonl"])
@pytest.mark.parametrize(
    "torn",
    [
        b'{"step": 4, "wall_s": 0.1, "lo',  # a kill mid-write
        b'{"step": 4, "wall_s": 0.1}',  # a kill just before the newline
        b'{"step": 4, "wa{"step": 4, "wall_s": 0.2}\n',  # an older resume glued a row to a fragment
    ],
)
def test_a_torn_last_line_is_cut_when_the_run_resumes(tmp_path, name, torn):
    logged_run(tmp_path, 3).close()
    before = (tmp_path / name).read_bytes()
    with open(tmp_path / name, "ab") as f:
        f.write(torn)
    run = RunDir(tmp_path, tensorboard=False)  # the resumed run
    assert run.repaired_bytes[name] == len(torn)
    run.log(4, {"loss": 0.25})
    run.log_trajectory({"step": 4, "answer": "a4"})
    assert (tmp_path / name).read_bytes().startswith(before)  # nothing whole was lost
    assert [r["step"] for r in lines(tmp_path / name)] == [1, 2, 3, 4]
    assert run.rewind(2) == 4 and [r["step"] for r in run.metrics()] == [1, 2]


@pytest.mark.timeout(180)
def test_a_run_killed_mid_write_resumes_with_every_line_whole(tmp_path):
    """A real writer is SIGKILLed while a trajectory row is half on disk; the resumed run appends cleanly."""
    traj = tmp_path / "trajectories.jsonl"
    at_kill = _kill_mid_row(tmp_path)
    whole = at_kill[: at_kill.rfind(b"\n") + 1]

    run = RunDir(tmp_path, tensorboard=False)
    assert run.repaired_bytes["trajectories.jsonl"] == len(at_kill) - len(whole) > 0
    step = max(r["step"] for r in lines(tmp_path / "metrics.jsonl")) + 1
    run.log_trajectory({"step": step, "text": "after the resume"})
    run.log(step, {"loss": 0.0})
    assert traj.read_bytes().startswith(whole)  # every row written whole before the kill is kept
    rows = lines(traj)
    assert len(rows) == whole.count(b"\n") + 1 and rows[-1]["text"] == "after the resume"
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")][-1] == step


def _kill_mid_row(run_dir: Path, tries: int = 5) -> bytes:
    """Run WRITER into `run_dir` and SIGKILL it once trajectories.jsonl ends inside a row; the bytes then.
    A kill that lands just after the row was finished is tried again (the writer resumes the same run)."""
    traj = run_dir / "trajectories.jsonl"
    for _ in range(tries):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir)])
        deadline = time.monotonic() + 30
        try:
            while not _torn_after_first_row(traj):
                assert proc.poll() is None, "the writer died on its own"
                assert time.monotonic() < deadline, "never caught a row half written"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        at_kill = traj.read_bytes()
        if not at_kill.endswith(b"\n"):
            return at_kill
    raise AssertionError(f"no kill in {tries} tries landed inside a row")


def _torn_after_first_row(path: Path) -> bool:
    """Whether the file holds a whole first row and now ends inside another one."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size <= 4_000_100:
                return False
            f.seek(size - 1)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False
