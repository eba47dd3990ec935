"""The staleness rule: admit a new rollout group only while no finished batch could be too off-policy.

With eta = max staleness in versions, v = current policy version and B = batch size in groups,
    capacity = min(max_concurrent - running, (eta + v + 1) * B - (accepted + running)).
Every group admitted while the policy is at version v will be trained at version <= v + eta + 1 - 1,
so its tokens are at most eta versions behind. eta = 0 is synchronous RL (generation waits for
training), eta = 1 is one-step-off, larger eta is fully asynchronous: one code path for all three.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class StalenessManager:
    batch_size: int  # B: groups per training step
    max_staleness: int  # eta
    max_concurrent: int  # groups generating at once
    version: int = 0  # v: policy version the engine is serving
    running: int = 0  # groups admitted, not yet finished
    accepted: int = 0  # groups finished and kept (trained, or waiting to be)
    rejected: int = 0  # groups finished and dropped (they free capacity)

    def __post_init__(self) -> None:
        assert self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"
        assert self.max_staleness >= 0, f"max_staleness must be >= 0, got {self.max_staleness}"
        assert self.max_concurrent >= 1, f"max_concurrent must be >= 1, got {self.max_concurrent}"

    @property
    def capacity(self) -> int:
        by_concurrency = self.max_concurrent - self.running
        by_staleness = (self.max_staleness + self.version + 1) * self.batch_size - (self.accepted + self.running)
        return min(by_concurrency, by_staleness)

    def try_admit(self) -> bool:
        if self.capacity <= 0:
            return False
        self.running += 1
        return True

    def finish(self, accepted: bool) -> None:
        assert self.running > 0, "finish() without a running group"
        self.running -= 1
        if accepted:
            self.accepted += 1
        else:
            self.rejected += 1

    def set_version(self, version: int) -> None:
        assert version >= self.version, f"policy version went backwards: {self.version} -> {version}"
        self.version = version

    # -- checkpointing: running groups are lost in a kill and regenerated, so they are not saved.
    def state_dict(self) -> dict[str, int]:
        d = asdict(self)
        d.pop("running")
        return d

    @classmethod
    def from_state_dict(cls, state: dict[str, int], *, unconsumed: int = 0) -> StalenessManager:
        """Restore after a restart. `accepted` is reset to what was consumed by training (v * B) plus
        groups still queued (`unconsumed`): resetting it to 0 (AReaL's restart bug) would inflate
        capacity and let the next batches exceed the staleness bound."""
        m = cls(
            batch_size=state["batch_size"],
            max_staleness=state["max_staleness"],
            max_concurrent=state["max_concurrent"],
            version=state["version"],
            rejected=state.get("rejected", 0),
        )
        m.accepted = m.version * m.batch_size + unconsumed
        return m
