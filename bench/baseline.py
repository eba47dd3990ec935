"""What the benches that compare with a base commit share: a git worktree of that commit (its `src/` goes first
on a worker's PYTHONPATH) and the modules the worker imports, found where the base commit had them."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# Modules that moved since the oldest base commit a bench names, new path -> old path (engine/ was split by
# role into local/, remote/ and server/ in 21c6d0f).
MOVED = {
    "asearch.engine.local.inprocess": "asearch.engine.inprocess",
    "asearch.engine.remote.http": "asearch.engine.http",
    "asearch.engine.remote.pool": "asearch.engine.pool",
    "asearch.engine.remote.sglang": "asearch.engine.sglang",
    "asearch.engine.server.app": "asearch.engine.server",
}


def worktree(rev: str) -> Path:
    """/tmp/wt-<rev>: a detached worktree of `rev`, made once."""
    path = Path(f"/tmp/wt-{rev}")
    if not (path / "src" / "asearch").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True, capture_output=True)
    return path


def import_moved(name: str) -> ModuleType:
    """The module `name`, or, in a tree older than its move, the module it was before (`MOVED`)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        if name not in MOVED:
            raise
        return importlib.import_module(MOVED[name])
