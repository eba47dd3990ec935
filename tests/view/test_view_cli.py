"""`asearch view` as a real subprocess: it prints the runs and the url, serves them, and warns off loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from asearch.net import free_port

# The command as the top-level app will mount it (`app.command("view")(view)`), with its error handling.
MOUNTED = (
    "import sys\n"
    "from asearch.cli.app import app, main\n"
    "from asearch.cli.view import view\n"
    "app.command('view')(view)\n"
    "sys.argv[0] = 'asearch'\n"
    "main()\n"
)


def asearch_view(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", MOUNTED, "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        **kw,
    )


def test_serves_the_runs_on_loopback(runs_root):
    port = free_port()
    proc = asearch_view(str(runs_root), "--port", str(port))
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                runs = httpx.get(f"{url}/api/runs", timeout=2).json()["runs"]
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "asearch view did not answer within 60 s"
                time.sleep(0.2)
        assert sorted(r["kind"] for r in runs) == ["demo", "eval", "synth", "train", "trajectories"]
        assert httpx.get(url + "/", timeout=5).status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"asearch view on http://127.0.0.1:{port}/" in out
    assert "demo-seed0/rl" in out and "WARNING" not in out


def test_warns_off_loopback_and_names_a_port_it_cannot_use(runs_root):
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the warning prints, then binding fails cleanly,
    # so the test never opens a port to the network.
    proc = asearch_view(str(runs_root), "--host", "192.0.2.1", "--port", "8765")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "WARNING: not a loopback address" in out and "no authentication" in out
    assert "AsearchError" in out and "cannot listen on 192.0.2.1:8765" in out

    missing = asearch_view(str(runs_root / "nope"))
    out, _ = missing.communicate(timeout=60)
    assert missing.returncode != 0 and "does not exist" in out
