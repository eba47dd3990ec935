"""The run directory: the one contract between producers (train, eval, synth, ask) and readers (view, reports).

    RUN/config.yaml          resolved config
    RUN/metrics.jsonl        one object per step: {"step", "wall_s", "<prefix>/<name>": value, ...}
    RUN/trajectories.jsonl   sampled trajectories (with step and reward)
    RUN/checkpoints/step_N/  resumable checkpoints
    RUN/summary.json         final figures
    RUN/tb/                  the same metrics for TensorBoard (when installed)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from asearch.config import dump_config
from asearch.files import append_jsonl, atomic_write_json, atomic_write_text, iter_jsonl, repair_jsonl_tail

# The jsonl logs a run appends to; a torn last line in either is cut before the run goes on.
LOGS = ("metrics.jsonl", "trajectories.jsonl")


class RunDir:
    def __init__(self, path: str | Path, *, tensorboard: bool = True):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # a killed run's torn last lines are cut before anything is read or appended
        self.repaired_bytes = {name: repair_jsonl_tail(self.path / name) for name in LOGS}
        self._t0 = time.time() - self._previous_wall()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path / "tb"))
            except Exception:  # tensorboard not installed: jsonl stays the source of truth
                self._tb = None

    def _previous_wall(self) -> float:
        """On resume, wall time continues from the last logged row instead of restarting at 0."""
        last = 0.0
        if (self.path / "metrics.jsonl").exists():
            for _, row in iter_jsonl(self.path / "metrics.jsonl", tolerate_torn_tail=True):
                last = max(last, float(row.get("wall_s", 0.0)))
        return last

    @property
    def wall_s(self) -> float:
        return time.time() - self._t0

    def save_config(self, cfg: BaseModel) -> None:
        dump_config(cfg, self.path / "config.yaml")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row: dict[str, float | None] = {"step": step, "wall_s": round(self.wall_s, 3)}
        row.update({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()})
        append_jsonl(self.path / "metrics.jsonl", row)
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def log_trajectory(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / "trajectories.jsonl", record)

    def rewind(self, step: int) -> int:
        """Drop metrics and trajectory rows logged after `step` (a resumed run redoes those steps, so
        keeping them would count them twice). Returns how many rows were dropped."""
        dropped = 0
        for name in LOGS:
            p = self.path / name
            if not p.exists():
                continue
            rows = [row for _, row in iter_jsonl(p, tolerate_torn_tail=True)]
            keep = [row for row in rows if int(row.get("step", 0)) <= step]
            if len(keep) != len(rows):
                dropped += len(rows) - len(keep)
                atomic_write_text(p, "".join(json.dumps(row) + "\n" for row in keep))
        self._t0 = time.time() - self._previous_wall()
        return dropped

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.path / "summary.json", summary)

    def metrics(self) -> list[dict[str, Any]]:
        p = self.path / "metrics.jsonl"
        return [row for _, row in iter_jsonl(p, tolerate_torn_tail=True)] if p.exists() else []

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_summary(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "summary.json").read_text())
