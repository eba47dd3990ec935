"""Shared pieces of the synthesis tests: a solver that never knows, a character tokenizer, and one small
graph-synthesised question file (world seed 5, 300 entities) for the tests that consume output."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearch.synth import SynthConfig, run_synthesis

CORPUS = "world:seed=5,entities=300"


class SilentSolver:
    """A tool-less solver that never knows: every question version is hard."""

    name = "silent"

    async def answers(self, question: str, k: int, seed: int) -> list[str]:
        return ["no idea"] * k

    async def aclose(self) -> None:
        return None


@pytest.fixture
def silent_solver() -> SilentSolver:
    return SilentSolver()


@pytest.fixture(scope="session")
def graph_questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """questions.jsonl of a 20-question graph run over CORPUS."""
    out = tmp_path_factory.mktemp("synth")
    cfg = SynthConfig.model_validate(
        {"backend": "graph", "n_questions": 20, "concurrency": 4, "graph": {"world_seed": 5, "entities": 300},
         "grading": {"method": "em"}}
    )  # fmt: skip
    run_synthesis(cfg, out, solver=SilentSolver(), log=lambda _: None)
    return out / "questions.jsonl"
