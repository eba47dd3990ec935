"""One shape for the trajectories the viewer browses, whatever wrote them.

Three producers write trajectories: training (`trajectories.jsonl`: a Trajectory dict plus `step`,
`group`), evaluation (`results.jsonl`: a scored line holding the Trajectory under `trajectory`) and
`asearch ask --json` (a bare Trajectory dict). Records are read defensively: a missing or mistyped
field shows as absent, it does not break the page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "OUTCOMES",
    "Outcome",
    "TrajectoryRow",
    "matches",
    "outcome_of",
    "row_of",
    "split_record",
    "think_text",
]

Outcome = Literal["correct", "wrong", "unscored"]
OUTCOMES: tuple[Outcome, ...] = ("correct", "wrong", "unscored")


@dataclass(slots=True)
class TrajectoryRow:
    """What the browser lists for one trajectory; the full record is read from disk when opened."""

    index: int  # position in the run's trajectory list (file order)
    id: str
    question: str
    answer: str | None
    dataset: str
    outcome: Outcome
    score: float | None  # EM (or the judge's verdict) for eval; the reward metric for training
    turns: int
    tokens: int  # generated tokens
    step: int | None  # training step that logged it
    reward: float | None
    finish: str | None
    pass_index: int | None  # eval pass

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "dataset": self.dataset,
            "outcome": self.outcome,
            "score": self.score,
            "turns": self.turns,
            "tokens": self.tokens,
            "step": self.step,
            "reward": self.reward,
            "finish": self.finish,
            "pass": self.pass_index,
        }


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _str(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def split_record(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trajectory dict, eval fields): an eval result line nests its trajectory; other records are one."""
    if isinstance(record.get("trajectory"), dict) or "em" in record:
        traj = record.get("trajectory") if isinstance(record.get("trajectory"), dict) else {}
        return traj, {k: v for k, v in record.items() if k != "trajectory"}
    return record, {}


def outcome_of(traj: dict[str, Any], result: dict[str, Any]) -> tuple[Outcome, float | None]:
    """Correct means a score of 1: the judge's verdict when one was given, else EM (eval), else the
    training reward metric (`score`; `metadata.score` in runs before it had a field); a record with none of
    these is unscored."""
    judge = result.get("judge")
    if isinstance(judge, dict) and isinstance(judge.get("correct"), bool):
        score: float | None = float(judge["correct"])
    elif result:
        score = _num(result.get("em"))
    else:
        meta = traj.get("metadata")
        score = _num(traj.get("score"))
        if score is None and isinstance(meta, dict):
            score = _num(meta.get("score"))
    if score is None:
        return "unscored", None
    return ("correct" if score >= 1.0 - 1e-9 else "wrong"), score


def _turns(traj: dict[str, Any]) -> list[dict[str, Any]]:
    turns = traj.get("turns")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def generated_tokens(traj: dict[str, Any]) -> int:
    counters = traj.get("counters")
    if isinstance(counters, dict) and _int(counters.get("generated_tokens")) is not None:
        return int(counters["generated_tokens"])
    return sum(_int(t.get("output_tokens")) or 0 for t in _turns(traj))


def row_of(index: int, record: dict[str, Any]) -> TrajectoryRow:
    traj, result = split_record(record)
    outcome, score = outcome_of(traj, result)
    meta = traj.get("metadata") if isinstance(traj.get("metadata"), dict) else {}
    dataset = _str(result.get("dataset")) or _str(meta.get("dataset")) or ""
    answer = _str(result.get("prediction")) if result else _str(traj.get("answer"))
    turns = _int(result.get("num_turns")) if result else None
    return TrajectoryRow(
        index=index,
        id=_str(traj.get("id")) or _str(result.get("id")) or f"#{index}",
        question=_str(result.get("question")) or _str(traj.get("question")) or "",
        answer=answer,
        dataset=dataset,
        outcome=outcome,
        score=score,
        turns=turns if turns is not None else len(_turns(traj)),
        tokens=generated_tokens(traj),
        step=_int(record.get("step")),
        reward=_num(traj.get("reward")),
        finish=_str(result.get("finish")) or _str(traj.get("finish")),
        pass_index=_int(result.get("pass")),
    )


def matches(
    row: TrajectoryRow,
    *,
    outcome: str = "",
    dataset: str = "",
    min_turns: int | None = None,
    max_turns: int | None = None,
    text: str = "",
) -> bool:
    """The browser's filters; an empty filter passes everything."""
    if outcome and row.outcome != outcome:
        return False
    if dataset and row.dataset != dataset:
        return False
    if min_turns is not None and row.turns < min_turns:
        return False
    if max_turns is not None and row.turns > max_turns:
        return False
    if text:
        needle = text.casefold()
        hay = f"{row.id}\n{row.question}\n{row.answer or ''}".casefold()
        if needle not in hay:
            return False
    return True


_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)


def think_text(output_text: str) -> str | None:
    """The reasoning inside <think>...</think> (an unclosed block runs to the end), or None."""
    parts = [m.group(1).strip() for m in _THINK.finditer(output_text)]
    return "\n\n".join(p for p in parts if p) or None
