"""A synthesis run killed mid-write resumes cleanly: a torn last line of attempts.jsonl or errors.jsonl is cut
before the next line is appended, so every line parses and every whole line is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asearch.errors import AsearchError
from asearch.synth import SynthConfig, run_synthesis


def config(max_seeds: int) -> SynthConfig:
    return SynthConfig.model_validate(
        {"backend": "graph", "n_questions": 50, "max_seeds": max_seeds, "concurrency": 1,
         "graph": {"world_seed": 5, "entities": 300}, "grading": {"method": "em"}}
    )  # fmt: skip


class BrokenSolver:
    """A solver whose endpoint is down: every seed fails and is logged to errors.jsonl."""

    name = "broken"

    async def answers(self, question: str, k: int, seed: int) -> list[str]:
        raise ConnectionError("solver endpoint is down")

    async def aclose(self) -> None:
        return None


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # a glued line would raise here


def test_a_torn_attempt_line_is_cut_and_its_seed_done_again(tmp_path, silent_solver):
    run_synthesis(config(4), tmp_path, solver=silent_solver, log=lambda _: None)
    attempts = tmp_path / "attempts.jsonl"
    whole = attempts.read_bytes()
    with open(attempts, "ab") as f:
        f.write(b'{"seed": {"key": "graph:5:300:17", "index": 4}, "status": "acc')  # a kill mid-write
    s = run_synthesis(config(8), tmp_path, solver=silent_solver, log=lambda _: None)
    assert (s.resumed, s.attempted_now) == (4, 4)
    assert attempts.read_bytes().startswith(whole)  # nothing whole was lost
    keys = [a["seed"]["key"] for a in rows(attempts)]
    assert len(keys) == 8 and len(set(keys)) == 8


def test_a_torn_error_line_is_cut_before_the_next_error_is_logged(tmp_path):
    with pytest.raises(AsearchError, match="stopped after 2 failed seeds"):
        run_synthesis(config(6), tmp_path, solver=BrokenSolver(), max_errors=2, log=lambda _: None)
    errors = tmp_path / "errors.jsonl"
    whole = errors.read_bytes()
    with open(errors, "ab") as f:
        f.write(b'{"seed": {"key": "graph:5:300:1"}, "error": "Connec')  # a kill mid-write
    with pytest.raises(AsearchError, match="stopped after 2 failed seeds"):
        run_synthesis(config(6), tmp_path, solver=BrokenSolver(), max_errors=2, log=lambda _: None)
    assert errors.read_bytes().startswith(whole)
    logged = rows(errors)
    assert len(logged) == 4 and all("solver endpoint is down" in e["error"] for e in logged)
