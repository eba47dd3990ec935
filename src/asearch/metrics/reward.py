"""The RL reward: a pure function of a finished trajectory and its gold answers.

    format gate fails            -> invalid_answer_penalty
    no answer                    -> no_answer_reward
    otherwise                    -> score = metric(answer, golds), blended with paraphrase golds:
                                    (1 - aug_weight) * m(answer, golds) + aug_weight * max(m(answer, golds), m(answer, aug))

The format gate is all-or-nothing over the turns (see `check_format`); the action tags it knows are the
agent's, recorded in the trajectory (`action_tags`: its tools' names and `answer`). A trajectory may be
a `Trajectory` or its `to_dict()` form, so rewards can be recomputed from results files.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.metrics.qa import cover_exact_match, exact_match, f1

__all__ = ["RewardConfig", "RewardResult", "check_format", "compute_reward"]

_METRICS = {"f1": f1, "em": exact_match, "cem": cover_exact_match}
_FORMAT_TAG = re.compile(r"<(/?)(think|summary)>", re.IGNORECASE)
# Trajectories recorded before they carried their action tags were all written by agents with these.
TAGS_OF_UNTAGGED_TRAJECTORIES = ("search", "access", "answer")


@functools.lru_cache(maxsize=64)
def _action_tag(tags: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"</?(" + "|".join(re.escape(t) for t in tags) + r")>", re.IGNORECASE)


class RewardConfig(Config):
    """How a finished trajectory is scored for RL."""

    metric: Literal["f1", "em", "cem"] = Field("f1", description="Answer metric (max over golds).")
    format_gate: bool = Field(
        True, description="All-or-nothing: any malformed turn gives invalid_answer_penalty."
    )
    aug_weight: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Weight of paraphrase golds (aug_golds): (1-w)*m(golds) + w*max(m(golds), m(aug)). "
        "Ignored when a question has no aug_golds.",
    )
    invalid_answer_penalty: float = Field(
        0.0, description="Reward when the format gate fails (e.g. -0.5 to push away from malformed output)."
    )
    no_answer_reward: float = Field(0.0, description="Reward when the trajectory ends without an answer.")


@dataclass(frozen=True, slots=True)
class RewardResult:
    reward: float
    score: (
        float  # the (aug-blended) metric of the answer, computed even when the gate fails; 0 without answer
    )
    format_ok: bool
    reason: str  # "ok", "no answer (finish=max_turns)", or "format: turn 3 (act): ..."


def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)


def _tag_problem(text: str) -> str | None:
    """Why `<think>` / `<summary>` tags in `text` are not properly paired, or None when they are.

    Paired = every opening tag is closed before the text ends, closings match the innermost open
    tag, and a tag is not opened again while it is open.
    """
    stack: list[str] = []
    for m in _FORMAT_TAG.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2).lower()
        if not closing:
            if tag in stack:
                return f"<{tag}> opened again before </{tag}>"
            stack.append(tag)
        elif not stack or stack[-1] != tag:
            return (
                f"</{tag}> without a matching <{tag}>"
                if tag not in stack
                else f"</{tag}> closes across <{stack[-1]}>"
            )
        else:
            stack.pop()
    return f"<{stack[-1]}> is never closed" if stack else None


def check_format(turns: Sequence[Any], action_tags: Sequence[str]) -> str | None:
    """None when every turn is well formed, else the first problem ("turn 2 (act): ...").

    `action_tags` are the agent's (`Trajectory.action_tags`: its tools' names and "answer"). An act
    turn (think + one action) is well formed when the agent loop parsed it without error (`parse_error`
    is None: exactly one complete action tag, action tags balanced, argument
    non-empty), its `<think>`/`<summary>` tags are paired, and it holds at most one `<think>` block.
    A read turn (the model's summary of one result block; the loop opens `<summary>` for it and
    stops at `</summary>`) is well formed when "<summary>" + its text has paired tags — so a summary
    cut off by the token limit fails — and it contains no action tag.
    """
    action_tag = _action_tag(tuple(action_tags))
    for i, turn in enumerate(turns, start=1):
        kind = _get(turn, "kind", "act")
        text = _get(turn, "output_text", "") or ""
        where = f"turn {i} ({kind})"
        if kind == "read":
            problem = _tag_problem("<summary>" + text)
            if problem is None and (m := action_tag.search(text)):
                problem = f"action tag {m.group(0)} inside a summary"
        else:
            problem = _get(turn, "parse_error") or _tag_problem(text)
            if problem is None and len(re.findall(r"<think>", text, re.IGNORECASE)) > 1:
                problem = "more than one <think> block"
        if problem:
            return f"{where}: {problem}"
    return None


def compute_reward(
    trajectory: Any,
    golds: str | Sequence[str],
    cfg: RewardConfig | None = None,
    aug_golds: Sequence[str] = (),
    *,
    action_tags: Sequence[str] | None = None,
) -> RewardResult:
    """Reward of one finished trajectory (a Trajectory or its dict) against its gold answers.
    `action_tags` (for the format gate): default, the trajectory's own."""
    cfg = cfg or RewardConfig()
    metric = _METRICS[cfg.metric]
    answer = _get(trajectory, "answer")
    score = 0.0
    if answer is not None:
        score = metric(answer, golds)
        if aug_golds:
            score = (1.0 - cfg.aug_weight) * score + cfg.aug_weight * max(
                score, metric(answer, list(aug_golds))
            )
    if action_tags is None:
        action_tags = _get(trajectory, "action_tags") or TAGS_OF_UNTAGGED_TRAJECTORIES
    problem = check_format(_get(trajectory, "turns", ()) or (), action_tags) if cfg.format_gate else None
    if problem is not None:
        return RewardResult(cfg.invalid_answer_penalty, score, False, f"format: {problem}")
    if answer is None:
        finish = _get(trajectory, "finish", "?")
        return RewardResult(cfg.no_answer_reward, 0.0, True, f"no answer (finish={finish})")
    return RewardResult(score, score, True, "ok")
