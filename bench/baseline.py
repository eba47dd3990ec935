"""What the benches share: for those that compare with a base commit, a git worktree of that commit (its `src/`
goes first on a worker's PYTHONPATH) and the modules the worker imports, found where the base commit had them;
for all, the report they print and write."""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys
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


def write_report(title: str, script: str, argv: list[str] | None, detail: str, seconds: float, body: str, out: Path | None) -> str:
    """`# title`, the command that made it (python bench/<script> and its arguments), the machine, `detail` and
    the run's seconds, then `body`: printed, and written to `out` unless it is None."""
    import torch

    args = " ".join(argv if argv is not None else sys.argv[1:])
    where = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {detail}"
    report = f"# {title}\n\n`{f'python bench/{script} {args}'.strip()}` ({where}; {seconds:.0f} s in all)\n\n{body}\n"
    print("\n" + report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
    return report
