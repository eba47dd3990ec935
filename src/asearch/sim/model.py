"""The cluster simulator: a discrete-event model of rollout servers, a trainer and the staleness rule.

One function, `simulate(cfg, eta)`, runs S training steps of RL on a modelled cluster and returns
throughput, idle time and staleness. What is modelled, in the order a trajectory meets it:

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
    # ---------------------------------------------------------------- setup
    R = cfg.rollout
    rollout_gpus = rollout_gpus or cfg.cluster.rollout_gpus
    trainer_gpus = trainer_gpus or cfg.cluster.trainer_gpus
    S = steps or cfg.steps
    W = min(cfg.warmup_steps, S - 1)
    B, n, contention = cfg.batch_size, cfg.group_size, cfg.cluster.contention
    tool_after_last = cfg.workload.tool_after_last_turn
    n_servers = rollout_gpus // R.gpus_per_server
    assert n_servers >= 1, f"{rollout_gpus} rollout GPUs hold no server of {R.gpus_per_server} GPUs"
    assert eta >= 0, f"eta must be >= 0, got {eta}"
    servers = [Server(i) for i in range(n_servers)]
    loads = [(0, i) for i in range(n_servers)]  # (assigned, index), lazily updated
    throughput = cfg.trainer.throughput(trainer_gpus)
    workload = Workload(cfg.workload, cfg.seed, cfg.replicate)
    staleness = StalenessManager(B, eta, cfg.max_concurrent)

    events: list[tuple[float, int, int, object, int]] = []  # (time, tiebreak, kind, subject, token)
    SERVER, TOOL, TRAIN, SYNC = 0, 1, 2, 3
    tick = order = 0  # tiebreaks: equal times and clocks resolve in creation order

    def at(t: float, kind: int, subject: object, token: int = 0) -> None:
        nonlocal tick
        tick += 1
        heapq.heappush(events, (t, tick, kind, subject, token))

    inflight: dict[int, Group] = {}
    ready: list[Group] = []
    rejected: Counter[str] = Counter()
    seq = 0
    version = 0
    engine_tokens = decode_steps = prefilled = recomputed = 0  # what the servers did
    busy_servers = 0  # servers in a run of steps (the rollout side computes)
    # trainer state
    training = syncing = False
    train_left = train_rate = train_since = train_started = 0.0
    train_token = 0
    wait_s = train_s = sync_s = 0.0  # trainer: waiting for a batch, training, pushing weights
    wait_since = 0.0
    batch_now: list[Group] = []
    # per-step records
    step_end: list[float] = []
    snap: dict[str, float] = {}
    trained = gen_trained = tokens_trained = turns_trained = 0
    stale_list: list[int] = []

    # ---------------------------------------------------------------- rollout servers

    a_, c_, kv_, p_ = R.decode_base_s, R.decode_per_row_s, R.kv_read_s_per_token, R.prefill_s_per_token

    def step_time(s: Server, j: int) -> float:
        """Seconds for the first j steps of the run in progress (the cached tokens grow by b per step)."""
        return (j * s.A + s.K * j * (j - 1) / 2 + s.P) / s.speed

    def server_start(s: Server, now: float) -> None:
        """At a step boundary: let waiting rows join, then start the next run of steps."""
        nonlocal busy_servers, order, recomputed
        if s.busy or s.paused:
            return
        while s.queue and len(s.batch) < R.max_batch:
            t = s.queue[0]
            if not t.group.alive:
                s.queue.popleft()
                continue
            turn = t.shape.turns[t.turn]
            need = turn.context + turn.gen
            if R.kv_capacity_tokens and s.batch and s.kv + need > R.kv_capacity_tokens:
                break  # no KV room: wait for rows to leave
            s.queue.popleft()
            if t.cached > 0 and t.cached == turn.context - turn.new:  # the prefix is still cached
                s.pending += turn.new
            else:  # first call, a rewritten context, or caches dropped by a weight update
                s.pending += turn.context
                if t.turn > 0:
                    recomputed += turn.context - turn.new
            t.cached = turn.context
            t.in_batch, t.join_clock = True, s.clock
            if t.first_version < 0:
                t.first_version = s.version
            s.batch.add(t)
            s.base += turn.context - s.clock
            s.kv += need
            order += 1
            heapq.heappush(s.finish, (s.clock + turn.gen, order, t))
        while s.finish and not s.finish[0][2].in_batch:  # rows cancelled meanwhile
            heapq.heappop(s.finish)
        if not s.batch:
            return
        s.b0 = b = len(s.batch)
        s.p0, s.pending = s.pending, 0
        s.A = a_ + c_ * b + kv_ * (s.base + b * s.clock)
        s.K, s.P = kv_ * b, p_ * s.p0
        s.k = max(1, s.finish[0][0] - s.clock)  # until the first row's turn ends (prefill is in step 1)
        s.speed = contention if training else 1.0
        s.busy, s.t0 = True, now
        s.token += 1
        at(now + step_time(s, s.k), SERVER, s, s.token)
        if busy_servers == 0:
            busy_servers = 1
            rerate_trainer(now)
        else:
            busy_servers += 1

    def server_cut(s: Server, now: float) -> None:
        """End the run in progress at its first step boundary at or after `now`."""
        if not s.busy or s.k == 1 or s.t0 + step_time(s, s.k - 1) < now:
            return  # already ends at the first boundary after now
        # smallest j with T(j) >= now - t0, where T(j) * speed = j*A + K*j*(j-1)/2 + P
        A, K = s.A, s.K
        D = (now - s.t0) * s.speed - s.P
        if D <= 0:
            j = 1
        elif K > 0:
            h = A - K / 2
            j = math.ceil((-h + math.sqrt(h * h + 2 * K * D)) / K)
        else:
            j = math.ceil(D / A) if A > 0 else 1
        j = max(1, min(j, s.k))
        while j > 1 and s.t0 + step_time(s, j - 1) >= now:  # guard against rounding
            j -= 1
        while j < s.k and s.t0 + step_time(s, j) < now:
            j += 1
        if j < s.k:
            s.k = j
            s.token += 1
            at(s.t0 + step_time(s, j), SERVER, s, s.token)

    def server_done(s: Server, now: float) -> None:
        """A run of k steps ended: every row got k tokens; rows whose turn is over leave."""
        nonlocal busy_servers, engine_tokens, decode_steps, prefilled
        s.busy = False
        busy_servers -= 1
        s.busy_s += now - s.t0
        s.clock += s.k
        engine_tokens += s.k * s.b0
        decode_steps += s.k
        prefilled += s.p0
        over = []
        while s.finish and (s.finish[0][0] <= s.clock or not s.finish[0][2].in_batch):
            _, _, t = heapq.heappop(s.finish)
            if t.in_batch:
                leave(s, t)
                over.append(t)
        for t in over:  # after every finished row has left: this may admit groups and start the next run
            turn_over(t, now)
        server_start(s, now)
        if busy_servers == 0:
            rerate_trainer(now)

    def leave(s: Server, t: Traj) -> None:
        turn = t.shape.turns[t.turn]
        t.in_batch = False
        s.batch.discard(t)
        s.base -= turn.context - t.join_clock
        s.kv -= turn.context + turn.gen
        t.cached = turn.context + turn.gen

    def arrive(t: Traj, now: float) -> None:
        """A trajectory's next call reaches its server (or, after its last call, it is done)."""
        if not t.group.alive:
            return
        if t.turn == len(t.shape.turns):
            return traj_done(t, now)
        s = t.server
        s.queue.append(t)
        if s.busy:
            if len(s.batch) < R.max_batch:
                server_cut(s, now)  # join at the next step boundary
        else:
            server_start(s, now)

    def turn_over(t: Traj, now: float) -> None:
        t.turn += 1
        if t.turn < len(t.shape.turns) or tool_after_last:
            at(now + t.shape.turns[t.turn - 1].tool_s, TOOL, t)
        else:
            traj_done(t, now)

    def traj_done(t: Traj, now: float) -> None:
        t.done = True
        unassign(t.server)
        g = t.group
        g.left -= 1
        if g.left == 0:
            group_done(g, now)

    # ---------------------------------------------------------------- the controller (staleness rule)

    def admit(now: float) -> None:
        nonlocal seq
        while staleness.try_admit():
            g = Group(seq, version)
            seq += 1
            for shape in workload.group(n):
                s = least_loaded()
                s.assigned += 1
                heapq.heappush(loads, (s.assigned, s.idx))
                t = Traj(g, shape, s)
                g.trajs.append(t)
            g.left = n
            inflight[g.seq] = g
            for t in g.trajs:
                arrive(t, now)

    def least_loaded() -> Server:
        """The server with the fewest live trajectories (lowest index on ties): a lazy heap of loads."""
        while True:
            load, i = loads[0]
            if servers[i].assigned == load:
                return servers[i]
            heapq.heappop(loads)  # outdated entry

    def unassign(s: Server) -> None:
        s.assigned -= 1
        heapq.heappush(loads, (s.assigned, s.idx))

    def group_done(g: Group, now: float) -> None:
        del inflight[g.seq]
        keep = not workload.dropped()
        staleness.finish(accepted=keep)
        if keep:
            ready.append(g)
        else:
            rejected["zero_variance"] += 1
        admit(now)
        try_train(now)

    def cancel(g: Group) -> None:
        """An in-flight group can no longer be trained within eta: stop its trajectories."""
        g.alive = False
        del inflight[g.seq]
        for t in g.trajs:
            if t.in_batch:
                leave(t.server, t)
            if not t.done:
                unassign(t.server)
        staleness.finish(accepted=False)
        rejected["stale"] += 1

    def get_batch() -> list[Group] | None:
        """The controller's get_batch without waiting: None until a batch can be formed."""
        for g in [g for g in ready if version - g.min_version > eta]:  # never under "admitted"
            ready.remove(g)
            staleness.accepted -= 1  # counted as kept: un-count it to free capacity
            staleness.rejected += 1
            rejected["stale"] += 1
        if len(ready) < B:
            return None
        ready.sort(key=lambda g: g.seq)
        if cfg.batch_order == "admitted" and inflight and min(inflight) < ready[B - 1].seq:
            return None  # never skip past a group still generating
        batch = ready[:B]
        del ready[:B]
        return batch

    # ---------------------------------------------------------------- the trainer

    def try_train(now: float) -> None:
        nonlocal training, train_left, train_since, train_rate, train_token, wait_s, batch_now, train_started
        if training or syncing or len(step_end) >= S:
            return
        batch = get_batch()
        if batch is None:
            admit(now)  # dropping stale groups freed capacity
            return
        wait_s += now - wait_since
        batch_now = batch
        work = sum(cfg.trainer.sequence_cost(t.shape.train_tokens) for g in batch for t in g.trajs)
        training, train_left, train_since, train_started = (
            True,
            work / throughput + cfg.trainer.step_overhead_s,
            now,
            now,
        )
        train_rate = contention if busy_servers else 1.0
        train_token += 1
        at(now + train_left / train_rate, TRAIN, None, train_token)
        if contention < 1:
            for s in servers:
                server_cut(s, now)  # the servers slow down from their next step

    def rerate_trainer(now: float) -> None:
        """The rollout side started or stopped computing: the trainer's speed changes."""
        nonlocal train_left, train_since, train_rate, train_token
        rate = contention if busy_servers else 1.0
        if not training or rate == train_rate:
            return
        train_left -= (now - train_since) * train_rate
        train_since, train_rate = now, rate
        train_token += 1
        at(now + max(train_left, 0.0) / train_rate, TRAIN, None, train_token)

    def train_done(now: float) -> None:
        nonlocal training, syncing, train_s, trained, gen_trained, tokens_trained, turns_trained
        training, syncing = False, True
        train_s += now - train_started
        for g in batch_now:
            for t in g.trajs:
                trained += 1
                gen_trained += t.shape.gen_tokens
                tokens_trained += t.shape.train_tokens
                turns_trained += len(t.shape.turns)
                stale_list.append(max(0, version - t.first_version))
        for s in servers:  # they stop at their next step boundary (or continue there at full speed)
            s.paused = R.pause_for_sync
            server_cut(s, now)
        at(now + cfg.trainer.weight_sync_s, SYNC, None)

    def sync_done(now: float) -> None:
        nonlocal syncing, version, sync_s, wait_since, recomputed
        syncing = False
        sync_s += cfg.trainer.weight_sync_s
        version += 1
        staleness.set_version(version)
        for g in [g for g in inflight.values() if version - g.admitted_version > eta]:
            cancel(g)
        for s in servers:
            s.version = version
            if R.recompute_on_update:
                for t in s.batch:  # in-flight rows recompute their whole context
                    ctx = t.shape.turns[t.turn].context + s.clock - t.join_clock
                    s.pending += ctx
                    recomputed += ctx
        if R.recompute_on_update:
            for g in inflight.values():
                for t in g.trajs:
                    if not t.in_batch:
                        t.cached = 0  # prefix caches are dropped too
        step_end.append(now)
        if len(step_end) == W:
            snapshot(now)
        wait_since = now
        for s in servers:
            s.paused = False
            server_start(s, now)
        admit(now)
        try_train(now)

    def snapshot(now: float) -> None:
        snap.update(
            t=now,
            server_busy=server_busy(now),
            trained=trained,
            gen=gen_trained,
            tokens=tokens_trained,
            turns=turns_trained,
            stale_from=len(stale_list),
            wait=wait_s,
            train=train_s,
            sync=sync_s,
        )

    def server_busy(now: float) -> float:
        return sum(s.busy_s + (now - s.t0 if s.busy else 0.0) for s in servers)

    # ---------------------------------------------------------------- the event loop
    snapshot(0.0)
    admit(0.0)
    while len(step_end) < S:
        if not events:
            raise RuntimeError(
                f"simulation stalled at step {len(step_end)}: {len(inflight)} groups in flight, "
                f"{len(ready)} ready, capacity {staleness.capacity} (eta={eta}, B={B})"
            )
        now, _, kind, subject, token = heapq.heappop(events)
        if kind == SERVER:
            assert isinstance(subject, Server)
            if token == subject.token and subject.busy:
                server_done(subject, now)
        elif kind == TOOL:
            assert isinstance(subject, Traj)
            arrive(subject, now)
        elif kind == TRAIN:
            if token == train_token and training:
                train_done(now)
        else:
            sync_done(now)

    # ---------------------------------------------------------------- the report
    end = step_end[-1]
    span = end - snap["t"]
    stale = stale_list[int(snap["stale_from"]) :]
    steps_counted = S - W
    return SimResult(
        eta=eta,
        rollout_gpus=rollout_gpus,
        trainer_gpus=trainer_gpus,
        servers=n_servers,
        steps=steps_counted,
        wall_s=span,
        trained_trajectories=trained - int(snap["trained"]),
        trained_gen_tokens=gen_trained - int(snap["gen"]),
        train_tokens=tokens_trained - int(snap["tokens"]),
        rollout_idle=1.0 - (server_busy(end) - snap["server_busy"]) / (span * n_servers),
        trainer_idle=1.0 - (train_s - snap["train"]) / span,
        staleness_mean=sum(stale) / max(len(stale), 1),
        staleness_max=max(stale, default=0),
        rejected=dict(rejected),
        trained_turns_mean=(turns_trained - snap["turns"]) / max(trained - snap["trained"], 1),
        engine_tokens=engine_tokens,
        engine_mean_batch=engine_tokens / max(decode_steps, 1),
        prefill_tokens=prefilled,
        recomputed_tokens=recomputed,
        groups_started=seq,
        rollout_wait_s=wait_s - snap["wait"],
        train_s=train_s - snap["train"],
        weight_sync_s=sync_s - snap["sync"],
        colocated=colocated,
        step_end_s=step_end,
    )
