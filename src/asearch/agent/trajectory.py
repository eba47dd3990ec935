"""The trajectory record: exact tokens, loss mask, log-probs and versions, plus per-turn metadata.

One record feeds RL (segments), evaluation (answer, counters) and the viewer (turns). A trajectory is
a list of segments: a segment is one token sequence the model saw, extended turn by turn; a new one
starts only when the context is rewritten (memory compaction, or a style that rebuilds its prompt).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["answer", "max_turns", "max_tokens", "repeated", "length", "abort", "error"]


@dataclass(slots=True)
class Segment:
    """One token sequence exactly as the model saw it. loss_mask is 1 only on model-generated tokens."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # 0.0 where loss_mask is 0
    versions: list[int] = field(default_factory=list)  # -1 where loss_mask is 0
    advantage_scale: float = 1.0  # the share of its episode's advantage its tokens get (a per-turn discount)

    def extend_context(self, ids: list[int]) -> None:
        """Append tokens the model reads but did not write (prompt, observations, wrappers)."""
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def extend_generated(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        assert len(ids) == len(logprobs) == len(versions), (
            f"engine returned {len(ids)} ids, {len(logprobs)} logprobs, {len(versions)} versions"
        )
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


@dataclass(slots=True)
class Turn:
    """One LLM call and what followed it. `kind` is "act" (think + one action) or "read" (a summary)."""

    kind: Literal["act", "read"]
    output_text: str  # what the model wrote, after any act prefix the style opened the turn with
    action: str | None = None  # search | access | answer | None
    argument: str | None = None
    observation: str | None = None  # text appended after this turn (tool result or correction)
    parse_error: str | None = None
    tool_error: str | None = None
    stop_reason: str = "stop"
    prompt_tokens: int = 0
    output_tokens: int = 0
    versions: tuple[int, int] = (-1, -1)  # (min, max) policy version of this turn's tokens
    llm_latency_s: float = 0.0
    tool_latency_s: float = 0.0
    segment: int = 0  # index of the segment this turn's tokens live in


@dataclass(slots=True)
class Trajectory:
    id: str
    question: str
    style: str
    action_tags: list[str] = field(default_factory=list)  # what its parser read as actions; the reward's format check too
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    finish: FinishReason = "error"
    counters: dict[str, int] = field(default_factory=dict)
    # tool calls the infrastructure failed, by kind (timeout, remote, garbage: tools.INFRASTRUCTURE_ERRORS)
    infra_faults: dict[str, int] = field(default_factory=dict)
    reward: float | None = None  # what RL trains on (`metrics.reward.compute_reward`); None: not scored
    score: float | None = None  # the answer metric behind it (EM/F1/CEM), kept even when the format gate fails
    reward_reason: str | None = None  # "ok", "no answer (...)" or "format: turn k (...): ..."
    wall_s: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def count_infra_fault(self, kind: str) -> None:
        self.infra_faults[kind] = self.infra_faults.get(kind, 0) + 1

    @property
    def met_infra_fault(self) -> bool:
        """The masking rule: an episode that met any infrastructure fault is left out of the training loss
        and of accuracy (reported apart), whatever its reward. The rule never looks at the reward, so it
        favours neither right nor wrong answers; like a real outage, it drops episodes that make many tool
        calls more often than short ones (docs/rl.md)."""
        return bool(self.infra_faults)

    @property
    def num_turns(self) -> int:
        """Every LLM call, reading turns included."""
        return len(self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(s.n_generated for s in self.segments)

    @property
    def min_version(self) -> int:
        """Oldest policy version that produced any token (-1 if nothing was generated)."""
        vs = [v for s in self.segments for v, m in zip(s.versions, s.loss_mask, strict=True) if m]
        return min(vs) if vs else -1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for t in d["turns"]:
            t["versions"] = list(t["versions"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        d["turns"] = [Turn(**{**t, "versions": tuple(t.get("versions", (-1, -1)))}) for t in d.get("turns", [])]
        return cls(**d)
