"""Configuration of the cluster simulator: one pydantic model per part, loaded from YAML (`asearch.config`).

    SimConfig
    ├── cluster    GPUs, the rollout/trainer split, contention between the two sides
    ├── rollout    one inference server: continuous batching, decode/prefill cost model, KV capacity
    ├── trainer    tokens/s per GPU, scaling with the number of trainer GPUs, step overhead
    ├── workload   trajectory shapes: turns, tokens per turn, tool latency (parametric or measured)
    └── split      the rollout/trainer split search

Every time is in seconds of simulated wall clock. A distribution (`Dist`) is written as a number (a
constant) or a mapping such as `{kind: lognormal, mean: 300, cv: 1.0, max: 1024}`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from asearch.config import Config


class Dist(Config):
    """A distribution of one quantity. Integer quantities (turns, tokens) use `integer: true`:
    a pareto draw is floored (a discrete Pareto, P(K >= k) = (min/k)^alpha), any other is rounded
    stochastically so the mean is kept."""

    kind: Literal["fixed", "uniform", "pareto", "lognormal", "choice"] = Field(
        "fixed",
        description="fixed | uniform(min, max) | pareto(min, alpha or mean, max) | lognormal(mean, cv) | choice(values)",
    )
    value: float | None = Field(None, description="fixed: the constant.")
    min: float = Field(0.0, ge=0, description="lower bound; pareto: the scale (smallest value), > 0.")
    max: float | None = Field(
        None, gt=0, description="cap: larger draws are cut to this (uniform: upper bound)."
    )
    mean: float | None = Field(
        None,
        gt=0,
        description="lognormal: the mean before the cap; pareto: the mean after the cap (alpha is solved).",
    )
    alpha: float | None = Field(None, gt=0, description="pareto: tail index (1 = P(X >= x) = min/x).")
    cv: float = Field(
        1.0, gt=0, description="lognormal: coefficient of variation (std / mean) before the cap."
    )
    values: list[float] = Field(default_factory=list, description="choice: values drawn uniformly.")
    integer: bool = Field(False, description="draws are whole numbers (turns, tokens).")
    _alpha: float | None = PrivateAttr(None)  # pareto: the tail index, solved once
    whole_value: ClassVar[bool] = True  # `turns: {kind: pareto, mean: 10}` is a whole new distribution

    @model_validator(mode="before")
    @classmethod
    def _number_is_fixed(cls, data: Any) -> Any:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"kind": "fixed", "value": data}
        return data

    @model_validator(mode="after")
    def _check(self) -> Dist:
        k = self.kind
        if k == "fixed" and self.value is None:
            raise ValueError("kind fixed needs `value`")
        if k == "uniform" and (self.max is None or self.max < self.min):
            raise ValueError(f"kind uniform needs max >= min, got min={self.min}, max={self.max}")
        if k == "pareto":
            if self.min <= 0:
                raise ValueError(f"kind pareto needs min > 0 (the scale), got {self.min}")
            if (self.alpha is None) == (self.mean is None):
                raise ValueError("kind pareto needs exactly one of `alpha` or `mean`")
            if self.mean is not None:
                if self.max is None:
                    raise ValueError(
                        "kind pareto with `mean` needs `max` (alpha is solved for the capped mean)"
                    )
                if not self.min < self.mean < self.max:
                    raise ValueError(
                        f"kind pareto needs min < mean < max, got {self.min}, {self.mean}, {self.max}"
                    )
        if k == "lognormal" and self.mean is None:
            raise ValueError("kind lognormal needs `mean`")
        if k == "choice" and not self.values:
            raise ValueError("kind choice needs a non-empty `values` list")
        if self.max is not None and k != "pareto" and self.max < self.min:
            raise ValueError(f"max must be >= min, got min={self.min}, max={self.max}")
        return self

    def lognormal_params(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal for the configured mean and cv."""
        assert self.mean is not None
        s2 = math.log(1.0 + self.cv**2)
        return math.log(self.mean) - s2 / 2, math.sqrt(s2)

    def pareto_alpha(self) -> float:
        """The tail index: given, or solved so that E[min(X, max)] = mean (bisection, X ~ Pareto(min, alpha))."""
        if self.alpha is not None:
            return self.alpha
        if self._alpha is not None:
            return self._alpha
        assert self.mean is not None and self.max is not None
        lo, hi = 1e-3, 100.0
        for _ in range(100):
            a = (lo + hi) / 2
            if _capped_pareto_mean(self.min, a, self.max) > self.mean:
                lo = a  # heavier tail than wanted: raise alpha
            else:
                hi = a
        self._alpha = (lo + hi) / 2
        return self._alpha


def _capped_pareto_mean(xm: float, alpha: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ Pareto(scale xm, alpha): xm + integral_xm^cap (xm/x)^alpha dx."""
    if abs(alpha - 1.0) < 1e-9:
        return xm + xm * math.log(cap / xm)
    return xm + xm**alpha * (cap ** (1 - alpha) - xm ** (1 - alpha)) / (1 - alpha)


class ClusterConfig(Config):
    gpus: int = Field(128, ge=2, description="GPUs in all (rollout + trainer).")
    rollout_gpus: int = Field(
        96, ge=1, description="GPUs serving rollouts; the trainer gets gpus - rollout_gpus."
    )
    contention: float = Field(
        1.0,
        gt=0,
        le=1,
        description="speed of each side while both rollout and trainer compute, as a fraction of its speed "
        "alone: 1 = separate hardware (GPU clusters), 0.5 = one processor time-shared (a loaded CPU box).",
    )
    colocated_baseline: bool = Field(
        False,
        description="also report synchronous RL with every GPU doing rollout, then every GPU training "
        "(verl-style colocation), beside the split runs.",
    )

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if not 1 <= self.rollout_gpus < self.gpus:
            raise ValueError(
                f"need 1 <= rollout_gpus < gpus (the trainer needs one), got {self.rollout_gpus} of {self.gpus}"
            )
        return self

    @property
    def trainer_gpus(self) -> int:
        return self.gpus - self.rollout_gpus


class RolloutConfig(Config):
    """One inference server (gpus_per_server GPUs, tensor-parallel) with continuous batching.

    A decode step over b rows holding S cached tokens in all, plus P prompt tokens prefilled in the same
    step, takes  decode_base_s + decode_per_row_s * b + kv_read_s_per_token * S + prefill_s_per_token * P.
    Every row sampled in a step gets one token; a row joins the batch only between steps.
    """

    gpus_per_server: int = Field(1, ge=1, description="tensor-parallel size: servers = rollout_gpus // this.")
    decode_base_s: float = Field(
        7.5e-3, ge=0, description="a: a decode step's fixed cost (weights read once)."
    )
    decode_per_row_s: float = Field(5e-5, ge=0, description="c: extra cost per row in the batch.")
    kv_read_s_per_token: float = Field(
        2.5e-8,
        ge=0,
        description="extra cost per cached context token of the rows in the batch (attention reads KV).",
    )
    prefill_s_per_token: float = Field(3e-5, ge=0, description="p: cost per prompt token prefilled.")
    max_batch: int = Field(256, ge=1, description="rows decoded together at most; more wait in a FIFO queue.")
    kv_capacity_tokens: int = Field(
        0,
        ge=0,
        description="KV-cache tokens a server holds (context + this turn's output of every row); 0 = unlimited.",
    )
    recompute_on_update: bool = Field(
        True,
        description="a weight update drops every KV cache: in-flight rows and later turns prefill their whole "
        "context again (AReaL's interruptible generation and our in-process engine do this).",
    )
    pause_for_sync: bool = Field(True, description="servers stop decoding while weights are pushed to them.")


class TrainerConfig(Config):
    """A step trains every token of the batch's trajectories:
    seconds = sum over trajectories of L * (1 + L / attention_equal_tokens) / throughput + step_overhead_s,
    throughput = tokens_per_s_per_gpu * M * scaling_per_doubling ** log2(M) for M trainer GPUs."""

    tokens_per_s_per_gpu: float = Field(
        5200.0, gt=0, description="training tokens/s of one GPU (fwd + bwd + logp)."
    )
    scaling_per_doubling: float = Field(
        0.97,
        gt=0,
        le=1,
        description="parallel efficiency kept at each doubling of trainer GPUs (1 = linear).",
    )
    attention_equal_tokens: float = Field(
        0.0,
        ge=0,
        description="sequence length at which attention costs as much as the rest; 0 = ignore attention.",
    )
    step_overhead_s: float = Field(
        2.0, ge=0, description="fixed cost per step (optimizer, gradient sync, logging)."
    )
    weight_sync_s: float = Field(
        5.0, ge=0, description="pushing new weights to every rollout server, per step."
    )

    def throughput(self, gpus: int) -> float:
        return self.tokens_per_s_per_gpu * gpus * self.scaling_per_doubling ** math.log2(gpus)

    def sequence_cost(self, tokens: int) -> float:
        """Full-speed seconds of one trajectory on one unit of throughput (tokens, attention included)."""
        extra = tokens / self.attention_equal_tokens if self.attention_equal_tokens > 0 else 0.0
        return tokens * (1.0 + extra)


class WorkloadConfig(Config):
    """Trajectory shapes. A trajectory has `turns` LLM calls; turn 1 prefills `prompt_tokens`, later turns
    the observation (`obs_tokens`) that the tool call before them returned; each turn generates
    `gen_tokens`; a tool call of `tool_latency_s` follows every turn but the last. A trajectory stops
    early when its context would pass `max_context`."""

    source: Path | None = Field(
        None,
        description="measured trajectories: a run directory, or a .jsonl/.json of Trajectory dicts or of "
        "{turns, gen_tokens, prompt_tokens, obs_tokens} records; replaces turns and the token dists.",
    )
    turns: Dist = Field(
        default_factory=lambda: Dist(kind="pareto", min=2, max=60, alpha=1.0, integer=True),
        description="LLM calls per trajectory.",
    )
    prompt_tokens: Dist = Field(default_factory=lambda: Dist(kind="fixed", value=300, integer=True))
    obs_tokens: Dist = Field(default_factory=lambda: Dist(kind="fixed", value=500, integer=True))
    gen_tokens: Dist = Field(default_factory=lambda: Dist(kind="fixed", value=300, integer=True))
    tool_latency_s: Dist | Literal["measured"] = Field(
        default_factory=lambda: Dist(kind="fixed", value=0.0),
        description="a distribution, or `measured`: each turn's tool_latency_s from `source`.",
    )
    tool_after_last_turn: bool = Field(
        False,
        description="the last turn also waits a tool latency before the trajectory ends (as the bench's --env-latency-ms).",
    )
    turns_shared_in_group: bool = Field(
        True, description="the n samples of a group share one turn count (their question sets the work)."
    )
    max_context: int = Field(32768, ge=1, description="context tokens a trajectory may reach.")
    drop_rate: float = Field(
        0.0, ge=0, lt=1, description="share of finished groups rejected (all rewards equal: no signal)."
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        if self.tool_latency_s == "measured" and self.source is None:
            raise ValueError("tool_latency_s: measured needs a `source` of measured trajectories")
        if self.source is None and self.turns.kind != "choice" and (self.turns.max or math.inf) < 1:
            raise ValueError(f"turns.max must be >= 1, got {self.turns.max}")
        return self


class SplitConfig(Config):
    enabled: bool = Field(True, description="search rollout/trainer splits after the main run.")
    step_gpus: int = Field(
        16, ge=1, description="rollout GPU counts tried: multiples of this (and of gpus_per_server)."
    )
    steps: int | None = Field(None, ge=1, description="training steps per search run (default: `steps`).")


class SimConfig(Config):
    seed: int = Field(0, description="seeds the workload draws (the same trajectories in every mode).")
    replicate: int = Field(
        0, ge=0, description="varies every draw except the turn counts: repeats a run on the same questions."
    )
    steps: int = Field(20, ge=1, description="S: training steps simulated per mode.")
    warmup_steps: int = Field(0, ge=0, description="steps left out of throughput and idle (pipeline fill).")
    batch_size: int = Field(128, ge=1, description="B: groups per training step.")
    group_size: int = Field(16, ge=1, description="n: samples per group.")
    max_concurrent: int = Field(128, ge=1, description="groups generating at once.")
    etas: list[int] = Field(
        default_factory=lambda: [0, 1, 4],
        min_length=1,
        description="max_staleness settings to run: 0 = synchronous, 1 = one-step-off, > 1 fully asynchronous.",
    )
    batch_order: Literal["finished", "admitted"] = Field(
        "finished",
        description="finished: a batch is the B oldest finished groups, and groups that outlive eta are "
        "cancelled or dropped (the controller today); admitted: a batch waits for every older group.",
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps must be < steps, got {self.warmup_steps} and {self.steps}")
        if any(e < 0 for e in self.etas):
            raise ValueError(f"etas must be >= 0, got {self.etas}")
        if self.cluster.rollout_gpus < self.rollout.gpus_per_server:
            raise ValueError(
                f"cluster.rollout_gpus ({self.cluster.rollout_gpus}) < rollout.gpus_per_server "
                f"({self.rollout.gpus_per_server}): not one server"
            )
        return self
