"""`QARecord`: one evaluation question with its gold answers, whatever file or generator it came from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["QARecord"]


class QARecord(BaseModel):
    """One evaluation question: its gold answers (any one counts) and where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Unique within its dataset.")
    question: str
    golds: list[str] = Field(description="Acceptable answers; metrics take the max over them.")
    aug_golds: list[str] = Field(
        default_factory=list,
        description="Paraphrased answers (ASearcher `aug_answer`), used by rewards only.",
    )
    dataset: str = Field("", description="Dataset name: the results and summaries are grouped by it.")
    data_source: str = Field(
        "",
        description=(
            "The source the row names itself (Search-R1/verl `data_source`), for files that merge several; "
            "summaries also break results down by it. Empty: the row named none (its source is the dataset)."
        ),
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Everything else the row carried.")

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("question is blank")
        return v

    @field_validator("golds")
    @classmethod
    def _golds_not_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("needs at least one gold answer")
        return v

    @property
    def source(self) -> str:
        """What per-source summaries group this question under: its `data_source`, else its dataset."""
        return self.data_source or self.dataset

    def to_jsonl_dict(self) -> dict[str, Any]:
        """The asearch jsonl line (`golds` key), which every reader here accepts back; `data_source` only
        when the row had one."""
        line = self.model_dump(mode="json")
        if not self.data_source:
            del line["data_source"]
        return line
