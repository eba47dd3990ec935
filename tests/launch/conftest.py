"""`asearch train` as a subprocess the launcher tests watch (through RUN/metrics.jsonl) and interrupt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def _sigint_default() -> None:
    """In the child: SIGINT back to its default, as in a terminal. A suite run as a background job (`make test &`,
    nohup) hands its children SIGINT ignored, and the Ctrl-C tests would then test the harness, not asearch."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class TrainRun:
    """Starts `cmd` writing to `console` (or nowhere); a `with` block kills it if the test leaves early."""

    def __init__(self, cmd: list[str], env: dict[str, str], out: Path, console: Path | None = None):
        self.out, self.console, self.t0 = out, console, time.monotonic()
        sink = console.open("wb") if console else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=_sigint_default)
        finally:
            if console:
                sink.close()

    @staticmethod
    def metrics(out: Path) -> list[dict]:
        path = out / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def output(self) -> str:
        return self.console.read_text() if self.console else ""

    def wait_for_step(self, step: int, timeout: float) -> None:
        """Until `step` is logged; fails (with the console's tail) if the run exits or takes too long."""
        while len(self.metrics(self.out)) < step:
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() - self.t0 < timeout, (
                f"no step {step} in {timeout:g} s:\n" + self.output()[-3000:]
            )
            time.sleep(0.05)

    def kill_server(self, i: int = 0) -> int:
        """SIGKILL rollout server `i` (and anything it forked); returns the last step logged before."""
        victim = json.loads((self.out / "logs" / "servers.json").read_text())[i]
        os.killpg(victim["pid"], signal.SIGKILL)
        return self.metrics(self.out)[-1]["step"]

    def __enter__(self) -> TrainRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def train_run() -> type[TrainRun]:
    return TrainRun
