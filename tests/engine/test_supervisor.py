"""ServerSupervisor against a real Python HTTP server subprocess that we make crash."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.errors import RemoteError
from asearch.net import free_port

pytestmark = pytest.mark.server  # HTTP server subprocesses that crash on purpose

# A tiny server: /health answers with its pid, /crash exits the process with code 3, and it forks a
# sleeping grandchild so we can check that stop() reaches the whole process group.
SERVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    delay = float(os.environ.get("START_DELAY", "0"))
    time.sleep(delay)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("server up, child", child.pid, flush=True)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/crash":
                os._exit(3)
            body = f"{os.getpid()} {child.pid}".encode()
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)

FAST = SupervisorConfig(
    health_timeout_s=20, health_poll_s=0.05, restart_backoff_s=0.05, watch_poll_s=0.05, stop_timeout_s=3
)


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    p = tmp_path / "server.py"
    p.write_text(SERVER)
    return p


def _supervisor(tmp_path: Path, script: Path, cfg: SupervisorConfig = FAST, **env: str) -> ServerSupervisor:
    port = free_port()
    return ServerSupervisor(
        [sys.executable, str(script), str(port)],
        f"http://127.0.0.1:{port}/health",
        log_path=tmp_path / "server.log",
        env=env or None,
        cfg=cfg,
        name="toy",
    )


def _wait(pred, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_crash_is_restarted_and_counted(tmp_path: Path, server_script: Path) -> None:
    sup = _supervisor(tmp_path, server_script)
    with sup:
        base = sup.health_url.rsplit("/", 1)[0]
        pid1, child1 = map(int, httpx.get(sup.health_url).text.split())
        assert pid1 == sup.pid and sup.restarts == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{base}/crash", timeout=5)
        _wait(lambda: sup.restarts == 1 and sup.is_running())
        _wait(lambda: not _alive(child1))  # the crashed server's worker went with it
        sup.ensure_healthy(timeout_s=15)
        pid2 = int(httpx.get(sup.health_url).text.split()[0])
        assert pid2 != pid1 and pid2 == sup.pid
        assert sup.starts == 2 and sup.failed is None
    assert not sup.is_running()
    log = (tmp_path / "server.log").read_text()
    assert log.count("toy launch #") == 2 and "server up" in log


def test_gives_up_after_max_restarts(tmp_path: Path, server_script: Path) -> None:
    sup = _supervisor(tmp_path, server_script, FAST.model_copy(update={"max_restarts": 1}))
    with sup:
        base = sup.health_url.rsplit("/", 1)[0]
        for expected in (1, None):
            _wait(lambda: sup.is_running() and sup._probe())
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{base}/crash", timeout=5)
            if expected is not None:
                _wait(lambda e=expected: sup.restarts == e)
        _wait(lambda: sup.failed is not None)
        assert sup.restarts == 1 and "gave up after 1 restarts" in sup.failed
        with pytest.raises(RemoteError, match="toy failed"):
            sup.ensure_healthy(timeout_s=1)


def test_stop_kills_the_whole_process_group(tmp_path: Path, server_script: Path) -> None:
    sup = _supervisor(tmp_path, server_script)
    sup.start()
    server_pid, child_pid = map(int, httpx.get(sup.health_url).text.split())
    assert psutil.pid_exists(child_pid)
    sup.stop()
    sup.stop()  # idempotent
    _wait(lambda: not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == "zombie", 5)
    assert not psutil.pid_exists(server_pid) or psutil.Process(server_pid).status() == "zombie"
    assert sup.restarts == 0  # a deliberate stop is not a crash


def test_start_failure_reports_exit_and_log_tail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys; print('model dir missing: /nope', flush=True); sys.exit(7)")
    sup = ServerSupervisor(
        [sys.executable, str(bad)],
        f"http://127.0.0.1:{free_port()}/health",
        log_path=tmp_path / "bad.log",
        cfg=FAST,
    )
    with pytest.raises(RemoteError, match=r"exited with code 7 during start-up(.|\n)*model dir missing"):
        sup.start()


def test_health_timeout_terminates_the_server(tmp_path: Path, server_script: Path) -> None:
    sup = _supervisor(
        tmp_path, server_script, FAST.model_copy(update={"health_timeout_s": 0.5}), START_DELAY="30"
    )
    with pytest.raises(
        RemoteError, match="not healthy .* after 0.5s; raise SupervisorConfig.health_timeout_s"
    ):
        sup.start()
    assert not sup.is_running()


def test_deliberate_restart_with_new_command(tmp_path: Path, server_script: Path) -> None:
    sup = _supervisor(tmp_path, server_script)
    with sup:
        pid1 = sup.pid
        new_port = free_port()
        sup.health_url = f"http://127.0.0.1:{new_port}/health"
        sup.restart([sys.executable, str(server_script), str(new_port)])
        assert sup.pid != pid1 and httpx.get(sup.health_url).status_code == 200
        time.sleep(0.3)  # the watcher must not mistake the deliberate stop for a crash
        assert sup.restarts == 0 and sup.starts == 2
