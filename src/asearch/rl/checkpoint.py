"""Checkpoints of an RL run: RUN/checkpoints/step_N/{trainer state, state.json}, and resuming from the last one.

The trainer writes its own state (`Trainer.save_checkpoint`): one process's trainer a `trainer.pt`; FSDP ranks
each their shard (`shards/`, torch.distributed.checkpoint) and rank 0 the scalars, so the driver never holds
the model or optimizer state.

A checkpoint is written into `.tmp_step_N` and renamed, `state.json` last, so a directory with a
`state.json` is whole. `state.json` holds the step, the RL wall time so far and the controller's state
(staleness counters, queued groups, prompts in flight, data position, rejections).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asearch.files import atomic_write_json
from asearch.rl.controller import RolloutController
from asearch.rl.trainer import Trainer
from asearch.runs import RunDir


def _step_of(path: Path) -> int:
    return int(path.name.split("_")[1])


def latest_checkpoint(run: Path) -> Path | None:
    ckpts = sorted((run / "checkpoints").glob("step_*"), key=_step_of)
    ckpts = [p for p in ckpts if (p / "state.json").exists()]  # state.json is written last
    return ckpts[-1] if ckpts else None


def save_checkpoint(run: Path, step: int, trainer: Trainer, state: dict[str, Any], keep: int) -> Path:
    """Write step `step` (the trainer's state and `state`), then keep only the newest `keep`."""
    final = run / "checkpoints" / f"step_{step}"
    tmp = run / "checkpoints" / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer.save_checkpoint(tmp)
    atomic_write_json(tmp / "state.json", state)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted((run / "checkpoints").glob("step_*"), key=_step_of)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass
class Resume:
    """Where a run starts: step 0, or its last checkpoint's step, wall time and controller state."""

    step: int = 0
    rl_wall_s: float = 0.0
    controller: dict[str, Any] = field(default_factory=dict)  # RolloutController keyword arguments


def resume_from_checkpoint(run: RunDir, trainer: Trainer, log: Callable[[str], Any] = print) -> Resume:
    """Load the last checkpoint of `run` into `trainer` (if there is one) and drop the metrics and
    trajectory rows logged after it (the steps that produced them are redone)."""
    ckpt = latest_checkpoint(run.path)
    if ckpt is None:
        return Resume()
    trainer.load_checkpoint(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    resume = Resume(state["step"], state["rl_wall_s"], RolloutController.restore_parts(state["controller"]))
    if dropped := run.rewind(resume.step):
        log(f"dropped {dropped} metrics/trajectory rows logged after step {resume.step} (they are redone)")
    parts = resume.controller
    log(f"resumed from {ckpt} (step {resume.step}, {len(parts['ready'])} queued groups, {len(parts['redo'])} to redo)")
    return resume
