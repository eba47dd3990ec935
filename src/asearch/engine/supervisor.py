"""Run an inference server as a supervised subprocess: start, wait for health, restart on crash, stop.

Generic over the command and the health URL (vLLM, SGLang, llama.cpp, or any HTTP server). The child
runs in its own process group so stopping it also stops the workers it forks.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
from pydantic import Field

from asearch.config import Config
from asearch.errors import RemoteError

log = logging.getLogger(__name__)


class SupervisorConfig(Config):
    """How long to wait for a server, and how hard to try to keep it up."""

    health_timeout_s: float = Field(
        300.0, gt=0, description="Give up on start-up after this long (vLLM on CPU needs 1-2 min)."
    )
    health_poll_s: float = Field(0.5, gt=0, description="Seconds between health probes while starting.")
    progress_every_s: float = Field(15.0, gt=0, description="Log a 'still waiting' line this often.")
    max_restarts: int = Field(
        3, ge=0, description="Crash restarts allowed before the server is marked failed."
    )
    restart_backoff_s: float = Field(1.0, ge=0, description="First restart delay; doubles per restart.")
    restart_backoff_max_s: float = Field(30.0, ge=0, description="Cap on the restart delay.")
    stop_timeout_s: float = Field(10.0, gt=0, description="SIGTERM grace period before SIGKILL.")
    watch_poll_s: float = Field(0.2, gt=0, description="How often the watcher thread checks for a crash.")


class ServerSupervisor:
    """Keep one server subprocess alive and healthy.

    `start()` launches the command and blocks until `health_url` answers 200. A watcher thread then
    restarts the process if it exits on its own (up to `cfg.max_restarts`, with doubling backoff); the
    count is `restarts`. After too many crashes `failed` holds the reason and `ensure_healthy()` raises.
    stdout and stderr of every incarnation are appended to `log_path`.
    """

    def __init__(
        self,
        command: Sequence[str],
        health_url: str,
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        cfg: SupervisorConfig | None = None,
        name: str = "server",
    ):
        self.command = [str(c) for c in command]
        self.health_url = health_url
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.cfg = cfg or SupervisorConfig()
        self.name = name
        self.restarts = 0  # crash restarts (not counting deliberate `restart()` calls)
        self.starts = 0  # every launch, deliberate or not
        self.failed: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()  # serialises launch/stop between the caller and the watcher
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ public

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Launch the server and wait until it is healthy; start the crash watcher."""
        with self._lock:
            if self.is_running():
                return
            self._stopping.clear()
            self.failed = None
            self._launch()
            self._wait_healthy()
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, name=f"supervise-{self.name}", daemon=True)
            self._watcher.start()

    def restart(self, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
        """Deliberately stop and relaunch, optionally with a new command/env (e.g. new weights); waits for
        health. Not counted in `restarts`."""
        with self._lock:
            self._terminate()
            if command is not None:
                self.command = [str(c) for c in command]
            if env is not None:
                self.env = dict(env)
            self.failed = None
            self._launch()
            self._wait_healthy()

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after `stop_timeout_s`; stop the watcher. Idempotent."""
        self._stopping.set()
        with self._lock:
            self._terminate()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        self._watcher = None

    def ensure_healthy(self, timeout_s: float | None = None) -> None:
        """Raise RemoteError if the server has failed for good; wait for health (e.g. mid-restart)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.cfg.health_timeout_s)
        while True:
            if self.failed:
                raise RemoteError(f"{self.name} failed: {self.failed}\n{self._tail_hint()}")
            if self._probe():
                return
            if time.monotonic() > deadline:
                raise RemoteError(f"{self.name} at {self.health_url} is not healthy.\n{self._tail_hint()}")
            time.sleep(self.cfg.health_poll_s)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ServerSupervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as f:
            f.write(f"\n===== {self.name} launch #{self.starts} at {time.strftime('%F %T')}: ".encode())
            f.write((" ".join(self.command) + "\n").encode())
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child owns this handle for its lifetime
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env} if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,  # own process group: stop() reaches forked workers too
            )
        except OSError as e:
            raise RemoteError(f"{self.name}: cannot start {self.command[0]!r}: {e}") from e
        finally:
            logf.close()  # the child holds its own copy of the descriptor
        log.info("%s: started pid %d (log: %s)", self.name, self._proc.pid, self.log_path)

    def _probe(self) -> bool:
        try:
            return httpx.get(self.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_healthy(self) -> None:
        start = time.monotonic()
        next_note = start + self.cfg.progress_every_s
        while True:
            proc = self._proc
            assert proc is not None
            if self._stopping.is_set():
                raise RemoteError(f"{self.name}: stop() was called while waiting for it to become healthy")
            if proc.poll() is not None:
                raise RemoteError(
                    f"{self.name} exited with code {proc.returncode} during start-up "
                    f"(command: {' '.join(self.command)}).\n{self._tail_hint()}"
                )
            if self._probe():
                log.info("%s: healthy after %.1fs", self.name, time.monotonic() - start)
                return
            now = time.monotonic()
            if now - start > self.cfg.health_timeout_s:
                self._terminate()
                raise RemoteError(
                    f"{self.name} not healthy at {self.health_url} after {self.cfg.health_timeout_s:g}s; "
                    f"raise SupervisorConfig.health_timeout_s if start-up is just slow.\n{self._tail_hint()}"
                )
            if now >= next_note:
                log.info(
                    "%s: waiting for %s (%.0fs of %.0fs; log: %s)",
                    self.name,
                    self.health_url,
                    now - start,
                    self.cfg.health_timeout_s,
                    self.log_path,
                )
                next_note = now + self.cfg.progress_every_s
            time.sleep(self.cfg.health_poll_s)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=self.cfg.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s: no exit %.0fs after SIGTERM; sending SIGKILL", self.name, self.cfg.stop_timeout_s
            )
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        _kill_group(proc)

    def _watch(self) -> None:
        while not self._stopping.wait(self.cfg.watch_poll_s):
            with self._lock:
                proc = self._proc
                if self._stopping.is_set() or self.failed or proc is None or proc.poll() is None:
                    continue
                code = proc.returncode
                _kill_group(proc)  # the dead server's workers would keep its port and memory from the restart
                if self.restarts >= self.cfg.max_restarts:
                    self.failed = f"exited with code {code}; gave up after {self.restarts} restarts"
                    log.error("%s: %s", self.name, self.failed)
                    continue
                self.restarts += 1
                delay = min(
                    self.cfg.restart_backoff_s * 2 ** (self.restarts - 1), self.cfg.restart_backoff_max_s
                )
                log.warning(
                    "%s: exited with code %s; restart %d/%d in %.1fs",
                    self.name,
                    code,
                    self.restarts,
                    self.cfg.max_restarts,
                    delay,
                )
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._launch()
                    self._wait_healthy()
                except RemoteError as e:
                    # The next loop iteration sees the dead process and counts another restart.
                    log.error("%s: restart %d failed: %s", self.name, self.restarts, e)

    def _tail_hint(self) -> str:
        tail = self.log_tail(20)
        return f"Last lines of {self.log_path}:\n{tail}" if tail else f"(log {self.log_path} is empty)"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of `proc`'s process group: workers it forked may outlive it and keep the port."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
