"""How a new policy version reaches the engine after a train step: `await weights.push(version)`.

- `LiveWeights`: the in-process engine shares this process's policy; it gets the live state dict (it
  pauses its requests, recomputes their KV caches under the new weights and resumes them itself).
- `DiskWeights`: rollout servers load each version from RUN/weights/v{version}, written atomically by
  `trainer.save_hf`; `engine.update_weights` pauses every server, loads it and resumes. The latest
  `keep` versions stay on disk (a server may still be reading the previous one).
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from asearch.engine.types import Engine
from asearch.models.lora import merged_state_dict
from asearch.rl.trainer import PolicyTrainer, Trainer


class WeightSync(Protocol):
    async def push(self, version: int) -> None:
        """Make `version` the engine's weights (tokens sampled after it carry that version)."""
        ...


@dataclass
class LiveWeights:
    engine: Engine
    trainer: PolicyTrainer

    async def push(self, version: int) -> None:
        await self.engine.update_weights(merged_state_dict(self.trainer.model), version)  # LoRA: merged


@dataclass
class DiskWeights:
    engine: Engine
    trainer: Trainer
    tokenizer: Any  # saved beside every version, so a server can load it as a model directory
    directory: Path  # RUN/weights
    keep: int

    async def push(self, version: int) -> None:
        path = await asyncio.to_thread(self.trainer.save_hf, self.directory / f"v{version}", self.tokenizer)
        await self.engine.update_weights(path, version)
        saved = {int(p.name[1:]): p for p in self.directory.glob("v[0-9]*")}
        older = sorted(v for v in saved if v < version)
        newer = [v for v in saved if v > version]  # written before a kill, by steps that resume redoes
        for v in older[: max(len(older) - (self.keep - 1), 0)] + newer:
            shutil.rmtree(saved[v], ignore_errors=True)
