"""The cluster simulator: a discrete-event model of rollout servers, a trainer and the staleness rule.

`simulate(cfg, eta)` runs S training steps of RL on a modelled cluster (a `Simulation`: its state
as attributes, one method per event) and returns throughput, idle time and staleness. What is modelled, in the order a trajectory meets it:

- admission: `asearch.rl.staleness.StalenessManager` itself (the rule `asearch train` uses) decides
  when a new group of n trajectories may start; groups are cancelled or dropped when they outlive eta
  exactly as `asearch.rl.controller.RolloutController` does (batch_order "finished"), or batches keep
  admission order (batch_order "admitted", nothing cancelled);
- rollout: each trajectory is pinned to the least-loaded server. A server decodes its batch in steps
  (continuous batching): a step over b rows holding S cached tokens, prefilling P tokens, takes
  a + c*b + kv*S + p*P seconds, and gives every row one token. Rows join and leave between steps.
  After each turn but the last, a tool call of the turn's latency; then the next turn's new tokens
  are prefilled;
- training: a batch of B groups trains in  sum_traj cost(L) / throughput(M) + overhead  seconds, then
  the weights are pushed (servers pause, caches are dropped and recomputed on the next step), and the
  version advances;
- contention: while both sides compute, each runs at `cluster.contention` of its speed (1 on a GPU
  cluster, 0.5 when one loaded CPU box runs both).

eta = 0 is synchronous RL: generation stops after B groups until the update lands. Runs of decode
steps in which no row joins or leaves are taken in one event (their time has a closed form), so a
128-GPU cluster simulates in seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from dataclasses import dataclass, field

from asearch.rl.staleness import StalenessManager
from asearch.sim.config import SimConfig
from asearch.sim.workload import Shape, Workload

# --------------------------------------------------------------------------- the actors


class Group:
    __slots__ = ("seq", "admitted_version", "trajs", "left", "alive")

    def __init__(self, seq: int, admitted_version: int):
        self.seq, self.admitted_version = seq, admitted_version
        self.trajs: list[Traj] = []
        self.left = 0  # trajectories not finished
        self.alive = True  # False once cancelled

    @property
    def min_version(self) -> int:
        """Oldest version among the group's tokens (its admission version before any token)."""
        vs = [t.first_version for t in self.trajs if t.first_version >= 0]
        return min(vs) if vs else self.admitted_version


class Traj:
    __slots__ = (
        "group",
        "shape",
        "server",
        "turn",
        "cached",
        "first_version",
        "join_clock",
        "in_batch",
        "done",
    )

    def __init__(self, group: Group, shape: Shape, server: Server):
        self.group, self.shape, self.server = group, shape, server
        self.turn = 0  # index of the current (or next) LLM call
        self.cached = 0  # context tokens whose KV is valid on the server (0 after a weight update)
        self.first_version = -1  # policy version of the first generated token
        self.join_clock = 0  # server clock when it joined the batch for this turn
        self.in_batch = False
        self.done = False


class Server:
    """One inference server. `clock` counts decode steps; a row that joined at clock j holds
    context + (clock - j) tokens, so the batch's cached tokens are S = base + b * clock."""

    __slots__ = (
        "idx", "batch", "queue", "finish", "clock", "base", "kv", "pending", "version", "assigned", "paused",
        "busy", "t0", "k", "b0", "p0", "A", "K", "P", "speed", "token", "busy_s",
    )  # fmt: skip

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.batch: set[Traj] = set()
        self.queue: deque[Traj] = deque()  # arrived, waiting to join the batch
        self.finish: list[tuple[int, int, Traj]] = []  # (clock at which its turn ends, tiebreak, row)
        self.clock = 0
        self.base = 0  # sum over rows of (context at join - join clock)
        self.kv = 0  # KV tokens reserved by the rows: context + this turn's output
        self.pending = 0  # tokens to prefill in the next step
        self.version = 0
        self.assigned = 0  # live trajectories pinned here
        self.paused = False
        self.busy = False  # a run of k steps is in progress, started at t0
        self.t0 = 0.0
        self.k = self.b0 = self.p0 = 0  # steps, rows and prefill tokens of the run
        self.A = self.K = self.P = 0.0  # its j-th step takes (A + K*(j-1)) s, step 1 also P s (at speed 1)
        self.speed = 1.0
        self.token = 0  # bumps when the run's end is rescheduled: older end events are void
        self.busy_s = 0.0

    def step_time(self, j: int) -> float:
        """Seconds for the first j steps of the run in progress (the cached tokens grow by b per step)."""
        return (j * self.A + self.K * j * (j - 1) / 2 + self.P) / self.speed

    def first_boundary_at(self, now: float) -> int:
        """The smallest j in 1..k whose step boundary t0 + step_time(j) is at or after `now`."""
        # solve j*A + K*j*(j-1)/2 + P >= (now - t0) * speed for j
        A, K = self.A, self.K
        D = (now - self.t0) * self.speed - self.P
        if D <= 0:
            j = 1
        elif K > 0:
            h = A - K / 2
            j = math.ceil((-h + math.sqrt(h * h + 2 * K * D)) / K)
        else:
            j = math.ceil(D / A) if A > 0 else 1
        j = max(1, min(j, self.k))
        while j > 1 and self.t0 + self.step_time(j - 1) >= now:  # guard against rounding
            j -= 1
        while j < self.k and self.t0 + self.step_time(j) < now:
            j += 1
        return j

    def leave(self, t: Traj) -> None:
        """Row t leaves the batch; its context and this turn's output stay cached."""
        turn = t.shape.turns[t.turn]
        t.in_batch = False
        self.batch.discard(t)
        self.base -= turn.context - t.join_clock
        self.kv -= turn.context + turn.gen
        t.cached = turn.context + turn.gen


def mode_name(eta: int) -> str:
    return {0: "synchronous", 1: "one-step-off"}.get(eta, "fully async")


@dataclass
class SimResult:
    """What one setting did in the measured window (after warmup_steps)."""

    eta: int
    rollout_gpus: int
    trainer_gpus: int
    servers: int
    steps: int
    wall_s: float
    trained_trajectories: int
    trained_gen_tokens: int
    train_tokens: int
    rollout_idle: float  # mean share of server time with no step running
    trainer_idle: float  # share of time the trainer was not computing (waiting for data, syncing)
    staleness_mean: float
    staleness_max: int
    rejected: dict[str, int]
    trained_turns_mean: float
    engine_tokens: int  # every token sampled, wasted work included
    engine_mean_batch: float  # rows per decode step
    prefill_tokens: int  # recomputed included
    recomputed_tokens: int
    groups_started: int
    rollout_wait_s: float  # trainer side: waiting for a batch
    train_s: float
    weight_sync_s: float
    colocated: bool = False
    step_end_s: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "synchronous, colocated" if self.colocated else mode_name(self.eta)

    @property
    def gpu_idle(self) -> float:
        """Share of all GPU time spent neither generating nor training."""
        if self.colocated:  # the same GPUs do both, one after the other
            return max(0.0, self.rollout_idle + self.trainer_idle - 1.0)
        r, t = self.rollout_gpus, self.trainer_gpus
        return (r * self.rollout_idle + t * self.trainer_idle) / (r + t)

    @property
    def trajectories_per_s(self) -> float:
        return self.trained_trajectories / max(self.wall_s, 1e-12)

    @property
    def gen_tokens_per_s(self) -> float:
        return self.trained_gen_tokens / max(self.wall_s, 1e-12)

    @property
    def train_tokens_per_s(self) -> float:
        return self.train_tokens / max(self.wall_s, 1e-12)


# --------------------------------------------------------------------------- the simulation

SERVER, TOOL, TRAIN, SYNC = 0, 1, 2, 3  # event kinds
Event = tuple[float, int, int, object, int]  # (time, tiebreak, kind, subject, token)


def simulate(
    cfg: SimConfig,
    eta: int,
    *,
    rollout_gpus: int | None = None,
    trainer_gpus: int | None = None,
    steps: int | None = None,
    colocated: bool = False,
) -> SimResult:
    """Simulate `steps` (default cfg.steps) training steps at max_staleness = eta on the given split."""
    sim = Simulation(
        cfg, eta, rollout_gpus=rollout_gpus, trainer_gpus=trainer_gpus, steps=steps, colocated=colocated
    )
    return sim.run()


class Simulation:
    """One simulated run. The cluster, the controller and the trainer are attributes; each event and
    each rule of the controller is a method. Events carry a token: one that no longer matches its
    subject's was made void when the subject's end was rescheduled."""

    def __init__(
        self,
        cfg: SimConfig,
        eta: int,
        *,
        rollout_gpus: int | None = None,
        trainer_gpus: int | None = None,
        steps: int | None = None,
        colocated: bool = False,
    ) -> None:
        self.cfg, self.eta, self.colocated = cfg, eta, colocated
        self.rollout = cfg.rollout
        self.rollout_gpus = rollout_gpus or cfg.cluster.rollout_gpus
        self.trainer_gpus = trainer_gpus or cfg.cluster.trainer_gpus
        self.steps = steps or cfg.steps
        self.warmup = min(cfg.warmup_steps, self.steps - 1)
        self.contention = cfg.cluster.contention
        self.n_servers = self.rollout_gpus // self.rollout.gpus_per_server
        assert self.n_servers >= 1, (
            f"{self.rollout_gpus} rollout GPUs hold no server of {self.rollout.gpus_per_server} GPUs"
        )
        assert eta >= 0, f"eta must be >= 0, got {eta}"
        self.servers = [Server(i) for i in range(self.n_servers)]
        self.loads = [(0, i) for i in range(self.n_servers)]  # (assigned, index), lazily updated
        self.throughput = cfg.trainer.throughput(self.trainer_gpus)
        self.workload = Workload(cfg.workload, cfg.seed, cfg.replicate)
        self.staleness = StalenessManager(cfg.batch_size, eta, cfg.max_concurrent)
        self.events: list[Event] = []
        self.tick = self.order = 0  # tiebreaks: equal times and clocks resolve in creation order
        self.inflight: dict[int, Group] = {}
        self.ready: list[Group] = []
        self.rejected: Counter[str] = Counter()
        self.seq = 0  # groups started
        self.version = 0
        self._init_trainer()
        self._init_counters()

    def _init_trainer(self) -> None:
        self.training = self.syncing = False
        self.train_left = self.train_rate = self.train_since = self.train_started = 0.0
        self.train_token = 0
        self.wait_s = self.train_s = self.sync_s = 0.0  # waiting for a batch, training, pushing weights
        self.wait_since = 0.0
        self.batch_now: list[Group] = []

    def _init_counters(self) -> None:
        self.engine_tokens = self.decode_steps = self.prefilled = self.recomputed = 0  # what the servers did
        self.busy_servers = 0  # servers in a run of steps (the rollout side computes)
        self.step_end: list[float] = []
        self.snap: dict[str, float] = {}  # the counters when the warm-up ended
        self.trained = self.gen_trained = self.tokens_trained = self.turns_trained = 0
        self.stale_list: list[int] = []

    # ---------------------------------------------------------------- the event loop

    def at(self, t: float, kind: int, subject: object, token: int = 0) -> None:
        self.tick += 1
        heapq.heappush(self.events, (t, self.tick, kind, subject, token))

    def run(self) -> SimResult:
        self.snapshot(0.0)
        self.admit(0.0)
        while len(self.step_end) < self.steps:
            if not self.events:
                raise RuntimeError(
                    f"simulation stalled at step {len(self.step_end)}: {len(self.inflight)} groups in flight, "
                    f"{len(self.ready)} ready, capacity {self.staleness.capacity} "
                    f"(eta={self.eta}, B={self.cfg.batch_size})"
                )
            now, _, kind, subject, token = heapq.heappop(self.events)
            self.dispatch(now, kind, subject, token)
        return self.report()

    def dispatch(self, now: float, kind: int, subject: object, token: int) -> None:
        if kind == SERVER:
            assert isinstance(subject, Server)
            if token == subject.token and subject.busy:
                self.server_done(subject, now)
        elif kind == TOOL:
            assert isinstance(subject, Traj)
            self.arrive(subject, now)
        elif kind == TRAIN:
            if token == self.train_token and self.training:
                self.train_done(now)
        else:
            self.sync_done(now)

    # ---------------------------------------------------------------- rollout servers

    def server_start(self, s: Server, now: float) -> None:
        """At a step boundary: let waiting rows join, then start the next run of steps."""
        if s.busy or s.paused:
            return
        self.join_waiting(s)
        while s.finish and not s.finish[0][2].in_batch:  # rows cancelled meanwhile
            heapq.heappop(s.finish)
        if s.batch:
            self.start_run(s, now)

    def join_waiting(self, s: Server) -> None:
        """Waiting rows join the batch in arrival order while it has rows and KV room."""
        cap = self.rollout.kv_capacity_tokens
        while s.queue and len(s.batch) < self.rollout.max_batch:
            t = s.queue[0]
            if not t.group.alive:
                s.queue.popleft()
                continue
            turn = t.shape.turns[t.turn]
            if cap and s.batch and s.kv + turn.context + turn.gen > cap:
                break  # no KV room: wait for rows to leave
            s.queue.popleft()
            self.join(s, t)

    def join(self, s: Server, t: Traj) -> None:
        """Row t joins at the server's clock; what is not cached of its context is prefilled in the next step."""
        turn = t.shape.turns[t.turn]
        if t.cached > 0 and t.cached == turn.context - turn.new:  # the prefix is still cached
            s.pending += turn.new
        else:  # first call, a rewritten context, or caches dropped by a weight update
            s.pending += turn.context
            if t.turn > 0:
                self.recomputed += turn.context - turn.new
        t.cached = turn.context
        t.in_batch, t.join_clock = True, s.clock
        if t.first_version < 0:
            t.first_version = s.version
        s.batch.add(t)
        s.base += turn.context - s.clock
        s.kv += turn.context + turn.gen
        self.order += 1
        heapq.heappush(s.finish, (s.clock + turn.gen, self.order, t))

    def start_run(self, s: Server, now: float) -> None:
        """Start a run of steps that lasts until the first row's turn ends (prefill is in step 1)."""
        R = self.rollout
        s.b0 = b = len(s.batch)
        s.p0, s.pending = s.pending, 0
        s.A = R.decode_base_s + R.decode_per_row_s * b + R.kv_read_s_per_token * (s.base + b * s.clock)
        s.K, s.P = R.kv_read_s_per_token * b, R.prefill_s_per_token * s.p0
        s.k = max(1, s.finish[0][0] - s.clock)
        s.speed = self.contention if self.training else 1.0
        s.busy, s.t0 = True, now
        s.token += 1
        self.at(now + s.step_time(s.k), SERVER, s, s.token)
        self.busy_servers += 1
        if self.busy_servers == 1:  # the rollout side starts computing: the trainer slows down
            self.rerate_trainer(now)

    def server_cut(self, s: Server, now: float) -> None:
        """End the run in progress at its first step boundary at or after `now`."""
        if not s.busy or s.k == 1 or s.t0 + s.step_time(s.k - 1) < now:
            return  # already ends at the first boundary after now
        j = s.first_boundary_at(now)
        if j < s.k:
            s.k = j
            s.token += 1
            self.at(s.t0 + s.step_time(j), SERVER, s, s.token)

    def server_done(self, s: Server, now: float) -> None:
        """A run of k steps ended: every row got k tokens; rows whose turn is over leave."""
        s.busy = False
        self.busy_servers -= 1
        s.busy_s += now - s.t0
        s.clock += s.k
        self.engine_tokens += s.k * s.b0
        self.decode_steps += s.k
        self.prefilled += s.p0
        over = []
        while s.finish and (s.finish[0][0] <= s.clock or not s.finish[0][2].in_batch):
            _, _, t = heapq.heappop(s.finish)
            if t.in_batch:
                s.leave(t)
                over.append(t)
        for t in over:  # after every finished row has left: this may admit groups and start the next run
            self.turn_over(t, now)
        self.server_start(s, now)
        if self.busy_servers == 0:
            self.rerate_trainer(now)

    def arrive(self, t: Traj, now: float) -> None:
        """A trajectory's next call reaches its server (or, after its last call, it is done)."""
        if not t.group.alive:
            return
        if t.turn == len(t.shape.turns):
            return self.traj_done(t, now)
        s = t.server
        s.queue.append(t)
        if s.busy:
            if len(s.batch) < self.rollout.max_batch:
                self.server_cut(s, now)  # join at the next step boundary
        else:
            self.server_start(s, now)

    def turn_over(self, t: Traj, now: float) -> None:
        t.turn += 1
        if t.turn < len(t.shape.turns) or self.cfg.workload.tool_after_last_turn:
            self.at(now + t.shape.turns[t.turn - 1].tool_s, TOOL, t)
        else:
            self.traj_done(t, now)

    def traj_done(self, t: Traj, now: float) -> None:
        t.done = True
        self.unassign(t.server)
        g = t.group
        g.left -= 1
        if g.left == 0:
            self.group_done(g, now)

    # ---------------------------------------------------------------- the controller (staleness rule)

    def admit(self, now: float) -> None:
        """Start groups while the staleness rule allows; each trajectory goes to the least-loaded server."""
        n = self.cfg.group_size
        while self.staleness.try_admit():
            g = Group(self.seq, self.version)
            self.seq += 1
            for shape in self.workload.group(n):
                s = self.least_loaded()
                s.assigned += 1
                heapq.heappush(self.loads, (s.assigned, s.idx))
                g.trajs.append(Traj(g, shape, s))
            g.left = n
            self.inflight[g.seq] = g
            for t in g.trajs:
                self.arrive(t, now)

    def least_loaded(self) -> Server:
        """The server with the fewest live trajectories (lowest index on ties): a lazy heap of loads."""
        while True:
            load, i = self.loads[0]
            if self.servers[i].assigned == load:
                return self.servers[i]
            heapq.heappop(self.loads)  # outdated entry

    def unassign(self, s: Server) -> None:
        s.assigned -= 1
        heapq.heappush(self.loads, (s.assigned, s.idx))

    def group_done(self, g: Group, now: float) -> None:
        del self.inflight[g.seq]
        keep = not self.workload.dropped()
        self.staleness.finish(accepted=keep)
        if keep:
            self.ready.append(g)
        else:
            self.rejected["zero_variance"] += 1
        self.admit(now)
        self.try_train(now)

    def cancel(self, g: Group) -> None:
        """An in-flight group can no longer be trained within eta: stop its trajectories."""
        g.alive = False
        del self.inflight[g.seq]
        for t in g.trajs:
            if t.in_batch:
                t.server.leave(t)
            if not t.done:
                self.unassign(t.server)
        self.staleness.finish(accepted=False)
        self.rejected["stale"] += 1

    def get_batch(self) -> list[Group] | None:
        """The controller's get_batch without waiting: None until a batch can be formed."""
        B, ready = self.cfg.batch_size, self.ready
        for g in [g for g in ready if self.version - g.min_version > self.eta]:  # never under "admitted"
            ready.remove(g)
            self.staleness.accepted -= 1  # counted as kept: un-count it to free capacity
            self.staleness.rejected += 1
            self.rejected["stale"] += 1
        if len(ready) < B:
            return None
        ready.sort(key=lambda g: g.seq)
        if self.cfg.batch_order == "admitted" and self.inflight and min(self.inflight) < ready[B - 1].seq:
            return None  # never skip past a group still generating
        batch = ready[:B]
        del ready[:B]
        return batch

    # ---------------------------------------------------------------- the trainer

    def try_train(self, now: float) -> None:
        if self.training or self.syncing or len(self.step_end) >= self.steps:
            return
        batch = self.get_batch()
        if batch is None:
            self.admit(now)  # dropping stale groups freed capacity
            return
        self.wait_s += now - self.wait_since
        self.batch_now = batch
        trainer = self.cfg.trainer
        work = sum(trainer.sequence_cost(t.shape.train_tokens) for g in batch for t in g.trajs)
        self.training = True
        self.train_left = work / self.throughput + trainer.step_overhead_s
        self.train_since = self.train_started = now
        self.train_rate = self.contention if self.busy_servers else 1.0
        self.train_token += 1
        self.at(now + self.train_left / self.train_rate, TRAIN, None, self.train_token)
        if self.contention < 1:
            for s in self.servers:
                self.server_cut(s, now)  # the servers slow down from their next step

    def rerate_trainer(self, now: float) -> None:
        """The rollout side started or stopped computing: the trainer's speed changes."""
        rate = self.contention if self.busy_servers else 1.0
        if not self.training or rate == self.train_rate:
            return
        self.train_left -= (now - self.train_since) * self.train_rate
        self.train_since, self.train_rate = now, rate
        self.train_token += 1
        self.at(now + max(self.train_left, 0.0) / self.train_rate, TRAIN, None, self.train_token)

    def train_done(self, now: float) -> None:
        """The batch is trained: count it, pause the servers at their next step, push the weights."""
        self.training, self.syncing = False, True
        self.train_s += now - self.train_started
        for g in self.batch_now:
            for t in g.trajs:
                self.trained += 1
                self.gen_trained += t.shape.gen_tokens
                self.tokens_trained += t.shape.train_tokens
                self.turns_trained += len(t.shape.turns)
                self.stale_list.append(max(0, self.version - t.first_version))
        for s in self.servers:  # they stop at their next step boundary (or continue there at full speed)
            s.paused = self.rollout.pause_for_sync
            self.server_cut(s, now)
        self.at(now + self.cfg.trainer.weight_sync_s, SYNC, None)

    def sync_done(self, now: float) -> None:
        """The new weights landed: cancel what outlived eta, drop caches, resume and admit."""
        self.syncing = False
        self.sync_s += self.cfg.trainer.weight_sync_s
        self.version += 1
        self.staleness.set_version(self.version)
        for g in [g for g in self.inflight.values() if self.version - g.admitted_version > self.eta]:
            self.cancel(g)
        for s in self.servers:
            s.version = self.version
        if self.rollout.recompute_on_update:
            self.drop_caches()
        self.step_end.append(now)
        if len(self.step_end) == self.warmup:
            self.snapshot(now)
        self.wait_since = now
        for s in self.servers:
            s.paused = False
            self.server_start(s, now)
        self.admit(now)
        self.try_train(now)

    def drop_caches(self) -> None:
        """After a weight update in-flight rows recompute their whole context, and prefix caches are gone."""
        for s in self.servers:
            for t in s.batch:
                ctx = t.shape.turns[t.turn].context + s.clock - t.join_clock
                s.pending += ctx
                self.recomputed += ctx
        for g in self.inflight.values():
            for t in g.trajs:
                if not t.in_batch:
                    t.cached = 0

    # ---------------------------------------------------------------- the report

    def snapshot(self, now: float) -> None:
        self.snap.update(
            t=now,
            server_busy=self.server_busy(now),
            trained=self.trained,
            gen=self.gen_trained,
            tokens=self.tokens_trained,
            turns=self.turns_trained,
            stale_from=len(self.stale_list),
            wait=self.wait_s,
            train=self.train_s,
            sync=self.sync_s,
        )

    def server_busy(self, now: float) -> float:
        return sum(s.busy_s + (now - s.t0 if s.busy else 0.0) for s in self.servers)

    def report(self) -> SimResult:
        """What the measured window (after the warm-up steps) did."""
        snap, end = self.snap, self.step_end[-1]
        span = end - snap["t"]
        stale = self.stale_list[int(snap["stale_from"]) :]
        trained = self.trained - int(snap["trained"])
        return SimResult(
            eta=self.eta,
            rollout_gpus=self.rollout_gpus,
            trainer_gpus=self.trainer_gpus,
            servers=self.n_servers,
            steps=self.steps - self.warmup,
            wall_s=span,
            trained_trajectories=trained,
            trained_gen_tokens=self.gen_trained - int(snap["gen"]),
            train_tokens=self.tokens_trained - int(snap["tokens"]),
            rollout_idle=1.0 - (self.server_busy(end) - snap["server_busy"]) / (span * self.n_servers),
            trainer_idle=1.0 - (self.train_s - snap["train"]) / span,
            staleness_mean=sum(stale) / max(len(stale), 1),
            staleness_max=max(stale, default=0),
            rejected=dict(self.rejected),
            trained_turns_mean=(self.turns_trained - snap["turns"]) / max(self.trained - snap["trained"], 1),
            engine_tokens=self.engine_tokens,
            engine_mean_batch=self.engine_tokens / max(self.decode_steps, 1),
            prefill_tokens=self.prefilled,
            recomputed_tokens=self.recomputed,
            groups_started=self.seq,
            rollout_wait_s=self.wait_s - snap["wait"],
            train_s=self.train_s - snap["train"],
            weight_sync_s=self.sync_s - snap["sync"],
            colocated=self.colocated,
            step_end_s=self.step_end,
        )
