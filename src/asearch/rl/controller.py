"""The rollout controller: keeps the engine busy with agent groups, admitted by the staleness rule.

Generation never waits for the slowest trajectory: a new group starts as soon as capacity allows,
finished groups queue up, and a training batch takes the B oldest. Groups are rejected (and free
capacity) when every sample got the same reward (no signal), when the workflow rejected one of their
episodes (it returned None), when an episode raised, or when they became too stale to train on: a
group admitted at version a is only trained at version <= a + eta, so the bound holds per group, not
just system-wide (in-flight hopeless groups are cancelled early). An episode that met an infrastructure
fault (a tool timeout, 5xx or garbled answer) leaves its group: the advantages compare the clean ones,
and a group with fewer than 2 clean episodes is rejected ("infra_fault"). With `sampling.pass_rate`, prompts
whose recent groups were all settled are mostly skipped before any generation, and with `sampling.probe` = k
a group whose first k samples all got the same reward is dropped before the rest are generated
("probe_settled"; `asearch.rl.sampling`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from asearch.agent.trajectory import Trajectory
from asearch.config import Config
from asearch.rl.sampling import PassRateSampler, SamplingConfig
from asearch.rl.staleness import StalenessManager


class ControllerConfig(Config):
    batch_size: int = Field(8, ge=1, description="B: prompt groups per training step.")
    group_size: int = Field(8, ge=1, description="n: samples per prompt (GRPO group).")
    max_staleness: int = Field(
        2, ge=0, description="eta: 0 = synchronous, 1 = one-step-off, >1 = fully asynchronous."
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="Groups generating at once. None: (max_staleness + 1) x batch_size, as many as the staleness "
        "rule ever admits, so eta is reached; a number caps the engine's load (and how far ahead eta lets it run).",
    )
    drop_zero_variance: bool = Field(True, description="Reject groups whose rewards are all equal.")
    batch_order: Literal["finished", "admitted"] = Field(
        "finished",
        description="finished: a batch is the B oldest finished groups, so a long group is overtaken by "
        "short ones and, once past the bound, cancelled (long trajectories go untrained). admitted: a batch "
        "waits for every older group, so batches keep admission order, no group is ever stale and long "
        "trajectories train as often as in synchronous RL; a straggler delays training, not generation.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)

    @property
    def concurrency(self) -> int:
        """Groups generating at once: `max_concurrent`, or what the staleness rule admits at most."""
        return self.max_concurrent or (self.max_staleness + 1) * self.batch_size

    @model_validator(mode="after")
    def _probe_fits_the_group(self) -> ControllerConfig:
        k = self.sampling.probe
        if k and not (2 <= k < self.group_size and self.drop_zero_variance):
            raise ValueError(
                f"sampling.probe={k} needs 2 <= probe < group_size ({self.group_size}) and drop_zero_variance "
                f"(it is {self.drop_zero_variance}): a probe of one sample cannot disagree, one of the whole "
                "group saves nothing"
            )
        return self


@dataclass
class Group:
    seq: int  # admission order (the "age" used to pick the oldest)
    index: int  # data position of the prompt
    sample: Any
    admitted_version: int
    trajectories: list[Trajectory] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    @property
    def min_version(self) -> int:
        versions = [t.min_version for t in self.trajectories if t.min_version >= 0]
        return min(versions) if versions else self.admitted_version


# (sample, k-th sample of the group) -> a trajectory with its reward set, or None to reject the group
EpisodeFn = Callable[[Any, int], Awaitable[Trajectory | None]]


class RolloutController:
    def __init__(
        self,
        cfg: ControllerConfig,
        data: Iterator[tuple[int, Any]],
        run_episode: EpisodeFn,
        *,
        staleness: StalenessManager | None = None,
        redo: list[tuple[int, Any]] | None = None,
        ready: list[Group] | None = None,
        rejected: dict[str, int] | None = None,
        data_position: int = 0,
        episodes: dict[str, int] | None = None,
        masked: dict[str, Any] | None = None,
        sampler_state: dict[str, Any] | None = None,
        seed: int = 0,
    ):
        self.cfg, self.data, self.run_episode = cfg, data, run_episode
        self.staleness = staleness or StalenessManager(cfg.batch_size, cfg.max_staleness, cfg.concurrency)
        self.staleness.max_concurrent = cfg.concurrency  # a resumed run takes the config's, not the checkpoint's
        self.redo: list[tuple[int, Any]] = list(redo or [])  # prompts in flight at the last checkpoint
        self.ready: list[Group] = list(ready or [])
        self.inflight: dict[int, tuple[Group, asyncio.Task]] = {}
        self.rejected: Counter[str] = Counter(rejected or {})
        self.errors: list[str] = []
        self.masked_episodes = (masked or {}).get("episodes", 0)  # met an infrastructure fault, left out of their group
        self.masked_by_kind: Counter[str] = Counter((masked or {}).get("by_kind", {}))  # by the fault kinds they met
        # every episode that finished (probes and rejected groups' included), and those in groups kept for
        # training (un-counted if they go stale in the queue)
        queued = sum(len(g.trajectories) for g in self.ready)  # a checkpoint from before these counters: its queue
        self.episodes_generated = (episodes or {}).get("generated", queued)
        self.episodes_kept = (episodes or {}).get("kept", queued)
        self.exhausted = False
        self.data_position = data_position  # one past the last prompt pulled from `data`
        use_pass_rate = cfg.sampling.pass_rate and cfg.drop_zero_variance and cfg.group_size >= 2
        self.sampler = PassRateSampler(cfg.sampling, seed, sampler_state) if use_pass_rate else None
        self._seq = max((g.seq for g in self.ready), default=-1) + 1
        self._wake = asyncio.Event()
        self._batch_ready = asyncio.Event()
        self._producer: asyncio.Task | None = None
        self._closing = False
        self._idle_since: float | None = None
        self.idle_s = 0.0  # time with no group generating (the engine has nothing to do)
        self._t0 = time.perf_counter()

    @property
    def version(self) -> int:
        return self.staleness.version

    # ------------------------------------------------------------------ producer

    def start(self) -> None:
        self._producer = asyncio.create_task(self._produce(), name="rollout-producer")
        self._mark_idle()

    async def _produce(self) -> None:
        while True:
            while self.staleness.capacity > 0 and not self.exhausted:
                item = self.redo.pop(0) if self.redo else self._next_prompt()
                if item is None:
                    self.exhausted = True
                    self._batch_ready.set()
                    break
                self.staleness.try_admit()
                group = Group(self._seq, item[0], item[1], self.version)
                self._seq += 1
                task = asyncio.create_task(self._run_group(group), name=f"group-{group.seq}")
                self.inflight[group.seq] = (group, task)
                self._mark_busy()
            self._wake.clear()
            await self._wake.wait()

    def _next_prompt(self) -> tuple[int, Any] | None:
        """The data stream's next prompt the sampler admits (all of them without one); None at its end."""
        while (item := next(self.data, None)) is not None:
            self.data_position = item[0] + 1
            if self.sampler is None or self.sampler.admit(item[1]):
                return item
        return None

    async def _run_group(self, group: Group) -> None:
        cause = None
        n, probe = self.cfg.group_size, self.cfg.sampling.probe
        # every sample's call is made now, in admission order (the episode function draws its seed there), so a
        # probe changes which samples run, not their seeds; calls never started (spared by a settled probe, or
        # cancelled first) are closed below
        calls = [self.run_episode(group.sample, k) for k in range(n)]
        try:
            episodes = await self._generate(calls[: probe or n])
            if probe:  # k samples first: equal rewards predict a settled group, so the other n - k are not spent
                cause = self._judge(group, episodes, probe)
                if cause == "zero_variance":
                    cause = "probe_settled"
                elif cause != "rejected_episode":  # variance, or too few clean probes to tell
                    episodes += await self._generate(calls[probe:])
                    cause = None
            if cause is None:
                cause = self._judge(group, episodes, n)
        except asyncio.CancelledError:
            cause = "stale"
        except Exception as e:  # an episode must not kill the run: count it, keep the message
            cause = "error"
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            for call in calls:
                if inspect.iscoroutine(call) and inspect.getcoroutinestate(call) == inspect.CORO_CREATED:
                    call.close()
        if cause == "stale" and self._closing:  # shut down, not stale: a checkpoint lists it to regenerate
            self.inflight.pop(group.seq, None)
            return
        # a settled probe is not a settled group (2 samples agree far more often than 8): the history skips it
        if self.sampler is not None and cause in (None, "zero_variance"):
            self.sampler.record(group.sample, group.rewards, [float(t.score or 0.0) for t in group.trajectories])
        self.inflight.pop(group.seq, None)
        self.staleness.finish(accepted=cause is None)
        if cause is None:
            self.ready.append(group)
            self.episodes_kept += len(group.trajectories)
        else:
            self.rejected[cause] += 1
        self._batch_ready.set()  # get_batch re-checks: a finished straggler may complete an "admitted" batch
        if not self.inflight:
            self._mark_idle()
        self._wake.set()

    async def _generate(self, calls: list[Awaitable[Trajectory | None]]) -> list[Trajectory | None]:
        """Runs episode `calls` together, each counted as it finishes (the infrastructure-faulted ones by fault
        kind too). One that raises raises here once the others are done, so none runs on unaccounted."""
        results = await asyncio.gather(*(self._counted(c) for c in calls), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        episodes: list[Trajectory | None] = list(results)  # type: ignore[arg-type]
        unscored = [t.id for t in episodes if t is not None and t.reward is None]
        if unscored:
            raise ValueError(f"the workflow returned unscored trajectories {unscored}")
        masked = [t for t in episodes if t is not None and t.met_infra_fault]
        self.masked_episodes += len(masked)
        self.masked_by_kind.update(kind for t in masked for kind in t.infra_faults)
        return episodes

    async def _counted(self, call: Awaitable[Trajectory | None]) -> Trajectory | None:
        episode = await call
        self.episodes_generated += 1
        return episode

    def _judge(self, group: Group, episodes: list[Trajectory | None], n: int) -> str | None:
        """Sets the group's clean trajectories and rewards; the cause to reject it, None to keep it."""
        finished = [t for t in episodes if t is not None]
        # out whatever its reward: the infrastructure failed it (conditioning on the reward would bias)
        group.trajectories = [t for t in finished if not t.met_infra_fault]
        group.rewards = [float(t.reward or 0.0) for t in group.trajectories]
        if len(finished) < len(episodes):  # a group is compared within itself: a missing sample spoils it
            return "rejected_episode"
        if len(group.trajectories) < min(2, n):  # too few clean samples left to compare
            return "infra_fault"
        if self.cfg.drop_zero_variance and max(group.rewards) - min(group.rewards) < 1e-9:
            return "zero_variance"
        return None

    # ------------------------------------------------------------------ consumer

    async def get_batch(self) -> list[Group] | None:
        """The B oldest finished groups that are still fresh enough; None when the data ran out."""
        B, eta = self.cfg.batch_size, self.cfg.max_staleness
        while True:
            # drop queued groups that can no longer be trained within the bound
            for g in [g for g in self.ready if self.version - g.min_version > eta]:
                self.ready.remove(g)
                self.staleness.accepted -= 1  # it was counted as kept: un-count it to free capacity
                self.staleness.rejected += 1
                self.rejected["stale"] += 1
                self.episodes_kept -= len(g.trajectories)
                self._wake.set()
            self.ready.sort(key=lambda g: g.seq)
            eligible = self.ready
            if self.cfg.batch_order == "admitted":  # never skip past a group still generating
                oldest_running = min(self.inflight, default=None)
                eligible = [g for g in self.ready if oldest_running is None or g.seq < oldest_running]
            if len(eligible) >= B:
                batch = eligible[:B]
                taken = {g.seq for g in batch}
                self.ready = [g for g in self.ready if g.seq not in taken]
                return batch
            if self.exhausted and not self.inflight:
                return None
            self._batch_ready.clear()
            await self._batch_ready.wait()

    def set_version(self, version: int) -> None:
        """After a weight update: advance the rule, cancel groups that can no longer be fresh, admit more."""
        self.staleness.set_version(version)
        for group, task in list(self.inflight.values()):
            if version - group.admitted_version > self.cfg.max_staleness:
                task.cancel()
        self._wake.set()

    # ------------------------------------------------------------------ bookkeeping

    def _mark_idle(self) -> None:
        if self._idle_since is None:
            self._idle_since = time.perf_counter()

    def _mark_busy(self) -> None:
        if self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None

    def idle_fraction(self) -> float:
        idle = self.idle_s + (time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0)
        return idle / max(time.perf_counter() - self._t0, 1e-9)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs so nothing is lost: the rule's counters, queued groups, in-flight prompts."""
        return {
            "staleness": self.staleness.state_dict(),
            "ready": [
                {
                    "seq": g.seq,
                    "index": g.index,
                    "sample": g.sample,
                    "admitted_version": g.admitted_version,
                    "rewards": g.rewards,
                    "trajectories": [t.to_dict() for t in g.trajectories],
                }
                for g in self.ready
            ],
            "redo": [(g.index, g.sample) for g, _ in sorted(self.inflight.values(), key=lambda x: x[0].seq)]
            + self.redo,
            "rejected": dict(self.rejected),
            "episodes": {"generated": self.episodes_generated, "kept": self.episodes_kept},
            "masked": {"episodes": self.masked_episodes, "by_kind": dict(self.masked_by_kind)},
            "data_position": self.data_position,
            "sampler_state": self.sampler.state_dict() if self.sampler is not None else None,
        }

    @staticmethod
    def restore_parts(state: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for the constructor that rebuild the saved state."""
        ready = [
            Group(
                d["seq"],
                d["index"],
                d["sample"],
                d["admitted_version"],
                [Trajectory.from_dict(t) for t in d["trajectories"]],
                d["rewards"],
            )
            for d in state["ready"]
        ]
        staleness = StalenessManager.from_state_dict(state["staleness"], unconsumed=len(ready))
        return {
            "staleness": staleness,
            "ready": ready,
            "redo": [tuple(x) for x in state["redo"]],
            "rejected": state.get("rejected", {}),
            "episodes": state.get("episodes"),
            "masked": state.get("masked"),
            "data_position": state["data_position"],
            "sampler_state": state.get("sampler_state"),
        }

    async def close(self) -> None:
        """Stop producing and cancel the groups in flight; they are not counted as rejected (a checkpoint taken
        before lists them to regenerate)."""
        self._closing = True
        if self._producer:
            self._producer.cancel()
        for _, task in list(self.inflight.values()):
            task.cancel()
        await asyncio.gather(*(t for _, t in self.inflight.values()), return_exceptions=True)
