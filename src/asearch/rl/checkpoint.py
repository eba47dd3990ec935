"""Checkpoints of an RL run: RUN/checkpoints/step_N/{trainer state, state.json}, and resuming from the last one.

The trainer writes its own state (`Trainer.save_checkpoint`): one process's trainer a `trainer.pt`; FSDP ranks
each their shard (`shards/`, torch.distributed.checkpoint) and rank 0 the scalars, so the driver never holds
the model or optimizer state.

A checkpoint is written into `.tmp_step_N` and renamed, `state.json` last, so a directory with a
`state.json` is whole. `state.json` holds the step, the RL wall time so far, the controller's state
(staleness counters, queued groups, prompts in flight, data position, rejections) and a digest of the weights
saved (`Trainer.weights_digest`), which a resume checks against the weights it loaded.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asearch.errors import CheckpointError
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
    atomic_write_json(tmp / "state.json", {**state, "weights_digest": trainer.weights_digest()})
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
    weights = _loaded_as_saved(ckpt, state.get("weights_digest"), trainer)
    resume = Resume(state["step"], state["rl_wall_s"], RolloutController.restore_parts(state["controller"]))
    if dropped := run.rewind(resume.step):
        log(f"dropped {dropped} metrics/trajectory rows logged after step {resume.step} (they are redone)")
    parts = resume.controller
    log(f"resumed from {ckpt} (step {resume.step}, {len(parts['ready'])} queued groups, {len(parts['redo'])} to redo; {weights})")
    return resume


def _loaded_as_saved(ckpt: Path, saved: list[float] | None, trainer: Trainer) -> str:
    """Compare the trainer's weights, just loaded, with the digest saved beside them; CheckpointError when
    they differ. Returns what the resume line says of them."""
    if saved is None:
        return "weights not checked: state.json has no digest"
    loaded = trainer.weights_digest()
    scale = max(1.0, abs(saved[1]))  # the sum of squares bounds the rounding of both sums
    if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12 * scale) for a, b in zip(loaded, saved, strict=True)):
        raise CheckpointError(
            f"{ckpt}: the weights loaded are not those saved (digest [sum, sum of squares] {loaded} against "
            f"{saved} in state.json): a shard from another step or run, or a damaged file"
        )
    return f"weights as saved: digest {loaded[0]:.9g} / {loaded[1]:.9g}"
