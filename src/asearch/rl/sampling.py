"""Pass-rate-aware sampling: spend generation on the questions whose group will have reward variance.

A group whose samples all got the same reward (every one right, or every one wrong) gives GRPO no
signal: the controller rejects it and its generation is wasted. The sampler remembers each question's
last `window` groups and, when the data stream offers a question that was settled in all of them,
admits it only with probability `recheck`, the floor that re-checks what the policy may since have
learned or forgotten:

    P(admit q) = recheck   if q's last `window` groups all had zero reward variance
               = 1         otherwise (a question not yet seen `window` times included)

A skipped question costs no generation; it is counted by cause: `solved` (its last group's pass rate,
the mean answer score, was at least 1/2) or `unsolved`.

A stream of fresh questions (each seen about once) has no history to skip on. With `prior_key` (a field of
the record, e.g. `metadata.hops`) the sampler also remembers, per value c of that field, whether each of its
class's last `prior_window` groups had reward variance, and admits a question it has no history for with

    P(admit q in class c) = max(recheck, v_c / max_c' v_c'),   v_c = share of class c's groups with variance

once every class in play has `prior_min` groups (before that: 1). Generation shifts toward the classes whose
groups teach, at the rate the best one does; skips by this rule are counted as `prior`.

`probe` = k is a per-question prediction for questions never seen: the controller generates k of the group's
n samples first and drops the group (cause `probe_settled`, costing k episodes instead of n) when their
rewards are all equal; otherwise it generates the other n - k and judges the whole group as usual. A group
whose k probes disagree always has variance. Like dropping zero-variance groups, this conditions which
questions are trained on their sampled outcomes: it favours questions the policy solves about half the time.
A settled probe is not recorded here (k samples agree far more often than n).
"""

from __future__ import annotations

import json
import random
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from typing import Any

from pydantic import Field

from asearch.config import Config


class SamplingConfig(Config):
    """`rollout.sampling`: which questions the controller spends generation on."""

    pass_rate: bool = Field(
        False,
        description="Pass-rate-aware sampling: a question whose last `window` groups all had equal rewards is "
        "admitted only with probability `recheck`. Needs drop_zero_variance and group_size >= 2.",
    )
    window: int = Field(1, ge=1, description="Groups of a question remembered (all must be settled to skip it).")
    recheck: float = Field(
        0.2, gt=0.0, le=1.0, description="Probability of admitting a settled question anyway (the re-check floor)."
    )
    prior_key: str | None = Field(
        None,
        description="A record field (dotted, e.g. metadata.hops) whose value classes questions: a question with no "
        "history of its own is admitted with its class's share of groups with variance relative to the best "
        "class's (floored at recheck). None: unseen questions are always admitted.",
    )
    prior_window: int = Field(64, ge=1, description="Groups remembered per class of `prior_key`.")
    prior_min: int = Field(8, ge=1, description="Groups every class needs before the class prior is used.")
    probe: int = Field(
        0,
        ge=0,
        description="k >= 2: generate k of a group's samples first and drop the group (cause probe_settled) when "
        "their rewards are all equal; otherwise generate the rest. 0: off. Needs drop_zero_variance and "
        "group_size > k.",
    )


def question_key(sample: Any) -> Hashable:
    """What identifies a question across epochs and resumes: its `id` field, else its JSON text."""
    if isinstance(sample, dict) and isinstance(sample.get("id"), str | int):
        return sample["id"]
    return json.dumps(sample, sort_keys=True, default=str)


class PassRateSampler:
    """Decides, question by question, whether the data stream's next question is worth a group."""

    def __init__(self, cfg: SamplingConfig, seed: int = 0, state: dict[str, Any] | None = None):
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.history: dict[Hashable, deque[tuple[bool, float]]] = {}  # key -> (settled, pass rate), oldest first
        self.skipped: Counter[str] = Counter()
        self.classes: dict[str, deque[bool]] = {}  # prior_key value -> had variance, per recent group
        if state:
            self.skipped.update(state.get("skipped", {}))
            for key, groups in state.get("history", []):
                self.history[key] = deque(((bool(s), float(p)) for s, p in groups), maxlen=cfg.window)
            for c, flags in (state.get("classes") or {}).items():
                self.classes[c] = deque((bool(f) for f in flags), maxlen=cfg.prior_window)

    def admit(self, sample: Any) -> bool:
        """True to generate a group for `sample`; False skips it (counted by cause)."""
        groups = self.history.get(question_key(sample))
        if groups is None:
            return self._admit_unseen(sample)
        if len(groups) < self.cfg.window or not all(settled for settled, _ in groups):
            return True
        if self.rng.random() < self.cfg.recheck:
            return True
        self.skipped["solved" if groups[-1][1] >= 0.5 else "unsolved"] += 1
        return False

    def _admit_unseen(self, sample: Any) -> bool:
        """A question with no history: its class's variance share against the best class's (see the module)."""
        shares = self.class_variance()
        c = self.class_of(sample)
        if c is None or c not in shares or not all(len(f) >= self.cfg.prior_min for f in self.classes.values()):
            return True
        best = max(shares.values())
        p = max(self.cfg.recheck, shares[c] / best) if best > 0 else 1.0
        if self.rng.random() < p:
            return True
        self.skipped["prior"] += 1
        return False

    def class_of(self, sample: Any) -> str | None:
        """The value of `prior_key` in `sample` as text (None: no prior, or the record lacks the field)."""
        if self.cfg.prior_key is None:
            return None
        value: Any = sample
        for part in self.cfg.prior_key.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return str(value)

    def class_variance(self) -> dict[str, float]:
        """v_c: per class, the share of its remembered groups that had reward variance."""
        return {c: sum(flags) / len(flags) for c, flags in self.classes.items() if flags}

    def record(self, sample: Any, rewards: Sequence[float], scores: Sequence[float]) -> None:
        """A finished group of `sample`: settled when every reward is equal; pass rate = mean score."""
        settled = max(rewards) - min(rewards) < 1e-9
        pass_rate = sum(scores) / max(len(scores), 1)
        groups = self.history.setdefault(question_key(sample), deque(maxlen=self.cfg.window))
        groups.append((settled, pass_rate))
        c = self.class_of(sample)
        if c is not None:
            self.classes.setdefault(c, deque(maxlen=self.cfg.prior_window)).append(not settled)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: keys kept with their types as [key, groups] pairs."""
        return {
            "skipped": dict(self.skipped),
            "history": [[k, list(g)] for k, g in self.history.items()],
            "classes": {c: list(f) for c, f in self.classes.items()},
        }
