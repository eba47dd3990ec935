"""The records synthesis produces: grounded statements, one edit step, and the output question row.

`SynthQuestion.to_row()` is an ASearcher-shaped jsonl line (`answer` is the list of accepted answers,
`aug_answer` the paraphrases); `asearch.eval.load_dataset` reads it as it is, putting every synthesis
field (statements, edit history, models, seed, ...) into `QARecord.metadata`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Action = Literal["base", "inject", "fuzz"]


@dataclass(frozen=True, slots=True)
class Statement:
    """A sentence that states one fact the question relies on, and the page it is on.

    `entity`, `relation` and `value` are filled in by the graph backend (the fact in structured form);
    the LLM backend leaves them empty.
    """

    text: str
    url: str
    entity: str = ""
    relation: str = ""
    value: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(slots=True)
class EditStep:
    """One proposed edit (or the base QA) and what the gates said about it."""

    round: int  # 0 = the base QA
    action: Action
    question: str
    kept: bool
    rejected_by: str | None = None  # quality | uniqueness | difficulty | None
    reason: str = ""  # why it was rejected, or what the edit did
    direct_accuracy: float | None = None  # share of the solver's k tool-less answers judged correct
    direct_answers: list[str] = field(default_factory=list)
    statements_added: list[Statement] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["statements_added"] = [s.to_dict() for s in self.statements_added]
        return d


@dataclass(slots=True)
class Uniqueness:
    """How uniqueness was established: `checked` says a check ran to completion, `held` its verdict."""

    method: Literal["graph-exact", "llm-candidates", "none"]
    checked: bool
    held: bool
    detail: str = ""

    @property
    def verified(self) -> bool:
        return self.checked and self.held


@dataclass(slots=True)
class SynthQuestion:
    """One synthesised question with everything needed to audit, train on and evaluate it."""

    id: str
    question: str
    answers: list[str]  # canonical first, then accepted variants
    paraphrases: list[str]
    statements: list[Statement]
    history: list[EditStep]
    uniqueness: Uniqueness
    models: dict[str, str]
    seed: dict[str, Any]
    backend: str
    corpus: str  # the corpus spec the tools must search to answer it
    direct_accuracy: float | None
    tool_accuracy: float | None = None  # share of the search agent's answers (with tools) judged correct

    @property
    def answer(self) -> str:
        return self.answers[0]

    @property
    def unique_verified(self) -> bool:
        return self.uniqueness.verified

    def to_row(self) -> dict[str, Any]:
        """The jsonl line: ASearcher's `question`/`answer` list/`aug_answer`, then the synthesis fields."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": list(self.answers),
            "aug_answer": list(self.paraphrases),
            "unique_verified": self.unique_verified,
            "uniqueness": asdict(self.uniqueness),
            "direct_accuracy": self.direct_accuracy,
            "tool_accuracy": self.tool_accuracy,
            "statements": [s.to_dict() for s in self.statements],
            "edit_history": [s.to_dict() for s in self.history],
            "edits": sum(1 for s in self.history if s.kept and s.action != "base"),
            "models": dict(self.models),
            "seed": dict(self.seed),
            "backend": self.backend,
            "corpus": self.corpus,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SynthQuestion:
        """Inverse of `to_row` (for resuming a run from its attempts log)."""
        return cls(
            id=row["id"],
            question=row["question"],
            answers=list(row["answer"]),
            paraphrases=list(row.get("aug_answer") or []),
            statements=[Statement(**s) for s in row["statements"]],
            history=[_step_from_dict(s) for s in row["edit_history"]],
            uniqueness=Uniqueness(**row["uniqueness"]),
            models=dict(row["models"]),
            seed=dict(row["seed"]),
            backend=row["backend"],
            corpus=row["corpus"],
            direct_accuracy=row.get("direct_accuracy"),
            tool_accuracy=row.get("tool_accuracy"),
        )


def _step_from_dict(d: dict[str, Any]) -> EditStep:
    d = dict(d)
    d["statements_added"] = [Statement(**s) for s in d.get("statements_added", [])]
    return EditStep(**d)
