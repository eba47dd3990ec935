"""What a launcher places: the allocation spec shared by the local launcher and (later) the Ray launcher."""

from __future__ import annotations

from pydantic import Field

from asearch.config import Config


class Allocation(Config):
    """Rollout servers and trainer ranks of one run (e.g. 4 servers x 1 GPU and 4 FSDP ranks on a cluster)."""

    rollout_servers: int = Field(2, ge=1, description="Rollout server processes to start.")
    server_threads: int = Field(1, ge=1, description="torch threads of each rollout server (CPU).")
    trainer_ranks: int = Field(
        1, ge=1, le=1, description="Trainer processes; 1 until `asearch train` drives the FSDP trainer."
    )

    def threads(self, trainer_threads: int) -> int:
        """CPU threads the run asks for: every server's, plus the trainer's."""
        return self.rollout_servers * self.server_threads + self.trainer_ranks * trainer_threads
