"""Trajectory shapes for the simulator: drawn from parametric distributions or replayed from measured runs.

A shape is what the simulator needs of a trajectory: per turn, the context length when the call starts,
the tokens new since the last call (prefilled when the KV cache is still valid), the tokens generated,
and the tool latency after it; plus the tokens the trainer sees. Draws use one RNG stream per quantity,
so the turn counts of a seed are the same whatever else is configured (and the same as
`bench/async_vs_sync.py`'s for a Pareto turn distribution with the same seed).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asearch.errors import ConfigError, DataFormatError
from asearch.files import iter_jsonl
from asearch.sim.config import Dist, WorkloadConfig


@dataclass(frozen=True, slots=True)
class Turn:
    context: int  # tokens in the context when the call starts (prefilled in full after a KV drop)
    new: int  # tokens added since the previous call (prefilled when the cache is valid)
    gen: int  # tokens generated (>= 1)
    tool_s: float  # tool latency after this turn (unused after the last)


@dataclass(frozen=True, slots=True)
class Shape:
    turns: tuple[Turn, ...]
    train_tokens: int  # every token the trainer sees (context + generated)

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen for t in self.turns)


class Stream:
    """Uniform draws in [0, 1): numpy's generator (fast, for per-turn quantities), or Python's
    random.Random (the turn stream: one draw per Pareto value, exactly as bench/async_vs_sync.py)."""

    def __init__(self, seed: int | str, *, python: bool = False):
        self.py = random.Random(seed) if python else None
        key = (
            seed
            if isinstance(seed, int)
            else int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little")
        )
        self.np = np.random.default_rng(key)

    def uniform(self, k: int) -> np.ndarray:
        if self.py is not None:
            return np.array([self.py.random() for _ in range(k)])
        return self.np.random(k)


def sample(d: Dist, stream: Stream, k: int) -> np.ndarray:
    """k draws of `d` (see `Dist`): capped at max, floored at min, whole numbers if `integer`."""
    if k <= 0:
        return np.zeros(0)
    u = stream.uniform(k)
    if d.kind == "fixed":
        assert d.value is not None
        x = np.full(k, d.value, dtype=float)
    elif d.kind == "uniform":
        assert d.max is not None
        x = d.min + (d.max - d.min) * u
    elif d.kind == "pareto":
        x = d.min / (1.0 - u) ** (1.0 / d.pareto_alpha())
        if d.integer:  # floored: P(K >= k) = (min/k)^alpha for whole k
            x = np.floor(x)
        return np.minimum(x, d.max) if d.max is not None else x
    elif d.kind == "lognormal":  # Box-Muller from two uniforms, so any stream works
        mu, sigma = d.lognormal_params()
        z = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2.0 * math.pi * stream.uniform(k))
        x = np.exp(mu + sigma * z)
    else:
        x = np.asarray(d.values, dtype=float)[np.minimum((u * len(d.values)).astype(int), len(d.values) - 1)]
    x = np.clip(x, d.min, d.max if d.max is not None else np.inf)
    if d.integer:  # stochastic rounding keeps the mean
        lo = np.floor(x)
        x = lo + (stream.uniform(k) < x - lo)
    return x


class Draws:
    """Values of one distribution drawn ahead in blocks (numpy is slow per call and fast per block);
    `take` hands them out in order, so the sequence does not depend on how they are asked for."""

    def __init__(self, d: Dist, stream: Stream, block: int = 4096):
        self.d, self.stream, self.block = d, stream, block
        self.buf: list[float] = []
        self.pos = 0

    def take(self, k: int) -> list[float]:
        while self.pos + k > len(self.buf):
            self.buf = self.buf[self.pos :] + sample(self.d, self.stream, max(self.block, k)).tolist()
            self.pos = 0
        out = self.buf[self.pos : self.pos + k]
        self.pos += k
        return out


def parametric_shape(cfg: WorkloadConfig, turns: int, draws: dict[str, Draws]) -> Shape:
    """A trajectory of `turns` calls with token counts drawn per turn, cut where the context is full."""
    k = max(1, turns)
    new = [int(x) for x in draws["prompt"].take(1) + draws["obs"].take(k - 1)]
    gens = [max(1, int(x)) for x in draws["gen"].take(k)]
    tools = draws["tool"].take(k) if "tool" in draws else [0.0] * k
    out: list[Turn] = []
    context = 0
    for i in range(k):
        room = cfg.max_context - context - new[i]
        if room < 1 and out:  # no room for this call: the trajectory ended with the previous one
            break
        gen = max(1, min(gens[i], room))
        out.append(Turn(context + new[i], new[i], gen, tools[i]))
        context += new[i] + gen
        if context >= cfg.max_context:
            break
    return Shape(tuple(out), context)


# --------------------------------------------------------------------------- measured trajectories


def _shape_from_record(rec: dict[str, Any], where: str) -> Shape:
    """A Trajectory dict (turns with prompt/output tokens) or a summary {turns, gen_tokens, ...} record."""
    turns = rec.get("turns")
    if isinstance(turns, list):
        if not turns:
            raise DataFormatError(where, None, "turns", "a trajectory with no turns")
        out: list[Turn] = []
        prev_end, prev_seg = 0, None
        for t in turns:
            ctx, gen = int(t.get("prompt_tokens", 0)), max(1, int(t.get("output_tokens", 0)))
            same = prev_seg is None or t.get("segment", 0) == prev_seg
            new = (
                ctx - prev_end if same and ctx >= prev_end and out else ctx
            )  # a rewritten context is all new
            out.append(Turn(ctx, new, gen, float(t.get("tool_latency_s", 0.0) or 0.0)))
            prev_end, prev_seg = ctx + gen, t.get("segment", 0)
        segs = rec.get("segments")
        train = (
            sum(len(s.get("token_ids", [])) for s in segs) if isinstance(segs, list) and segs else prev_end
        )
        return Shape(tuple(out), max(train, 1))
    if isinstance(turns, (int, float)) and turns >= 1:
        k = int(turns)
        gen_total = int(rec.get("gen_tokens", rec.get("generated_tokens", 0)))
        if gen_total < k:
            raise DataFormatError(
                where, None, "gen_tokens", f"need >= 1 generated token per turn, got {gen_total}"
            )
        prompt = int(rec.get("prompt_tokens", 0))
        obs_total = int(rec.get("obs_tokens", 0))
        if "tokens" in rec and "obs_tokens" not in rec:  # total tokens given: the rest is observations
            obs_total = max(0, int(rec["tokens"]) - gen_total - prompt)
        latency = float(rec.get("tool_latency_s", 0.0)) / max(k - 1, 1)
        out, ctx = [], 0
        for i in range(k):
            new = prompt if i == 0 else obs_total // (k - 1) + (i - 1 < obs_total % (k - 1))
            gen = gen_total // k + (i < gen_total % k)
            out.append(Turn(ctx + new, new, gen, latency))
            ctx += new + gen
        return Shape(tuple(out), ctx)
    raise DataFormatError(
        where, None, "turns", f"expected a list of turns or a turn count >= 1, got {turns!r}"
    )


def load_measured(source: Path) -> list[list[Shape]]:
    """Measured trajectories as groups of shapes (records sharing `step` and `group` form one group).

    `source` is a run directory (its trajectories.jsonl, or rl/trajectories.jsonl of a demo), a .jsonl
    of records, or a .json holding a list of records (or {"trajectories": [...]})."""
    path = Path(source)
    if path.is_dir():
        for cand in (path / "trajectories.jsonl", path / "rl" / "trajectories.jsonl"):
            if cand.is_file():
                path = cand
                break
        else:
            raise ConfigError(
                f"workload.source: {source} has no trajectories.jsonl (nor rl/trajectories.jsonl)"
            )
    if not path.is_file():
        raise ConfigError(f"workload.source: {source} not found")
    records: list[tuple[str, dict[str, Any]]] = []
    if path.suffix == ".jsonl":
        records = [(f"{path}:{i}", r) for i, r in iter_jsonl(path)]
    else:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DataFormatError(path, e.lineno, None, f"not valid JSON ({e.msg})") from None
        items = data.get("trajectories") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise DataFormatError(path, None, None, "expected a list of records or {'trajectories': [...]}")
        records = [(f"{path}[{i}]", r) for i, r in enumerate(items) if isinstance(r, dict)]
    if not records:
        raise ConfigError(f"workload.source: {path} holds no trajectory records")
    groups: dict[Any, list[Shape]] = {}
    for j, (where, rec) in enumerate(records):
        key = (rec.get("step"), rec["group"]) if "group" in rec else ("record", j)
        groups.setdefault(key, []).append(_shape_from_record(rec, where))
    return list(groups.values())


# --------------------------------------------------------------------------- the sampler


class Workload:
    """Draws the n shapes of each new group, in admission order, reproducibly from `seed`."""

    def __init__(self, cfg: WorkloadConfig, seed: int, replicate: int = 0):
        self.cfg = cfg
        self.measured = load_measured(cfg.source) if cfg.source is not None else None
        # one stream per quantity; the turn stream is random.Random(seed) itself, as in the bench, and
        # `replicate` changes every other stream (the same questions, other token counts and latencies)
        self.draws = {"turns": Draws(cfg.turns, Stream(seed, python=True), block=256)}
        salt = f"{seed}/{replicate}" if replicate else f"{seed}"
        for name, d in (("prompt", cfg.prompt_tokens), ("obs", cfg.obs_tokens), ("gen", cfg.gen_tokens)):
            self.draws[name] = Draws(d, Stream(f"{salt}/{name}"))
        if isinstance(cfg.tool_latency_s, Dist):
            self.draws["tool"] = Draws(cfg.tool_latency_s, Stream(f"{salt}/tool"))
        self.pick = Stream(f"{salt}/pick").np
        self.drop = Stream(f"{salt}/drop")

    def group(self, n: int) -> list[Shape]:
        """The n shapes of the next group."""
        if self.measured is not None:
            return self._measured_group(n)
        k = 1 if self.cfg.turns_shared_in_group else n
        turns = [int(x) for x in self.draws["turns"].take(k)]
        return [parametric_shape(self.cfg, turns[i % k], self.draws) for i in range(n)]

    def _measured_group(self, n: int) -> list[Shape]:
        assert self.measured is not None
        pick = self.pick
        if self.cfg.turns_shared_in_group:  # a measured group, its members cycled to n
            members = self.measured[int(pick.integers(len(self.measured)))]
            shapes = [members[i % len(members)] for i in range(n)]
        else:
            shapes = []
            for _ in range(n):
                members = self.measured[int(pick.integers(len(self.measured)))]
                shapes.append(members[int(pick.integers(len(members)))])
        if "tool" not in self.draws:  # measured latencies
            return shapes
        tool = self.draws["tool"]
        return [
            Shape(
                tuple(
                    Turn(t.context, t.new, t.gen, x)
                    for t, x in zip(s.turns, tool.take(len(s.turns)), strict=True)
                ),
                s.train_tokens,
            )
            for s in shapes
        ]

    def dropped(self) -> bool:
        """Whether a finished group is rejected (all rewards equal), at `drop_rate`."""
        return self.cfg.drop_rate > 0 and float(self.drop.uniform(1)[0]) < self.cfg.drop_rate
