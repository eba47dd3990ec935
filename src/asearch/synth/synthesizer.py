"""One seed's synthesis, shared by the graph and LLM backends: base QA, then INJECT/FUZZ rounds behind gates.

`Synthesizer.synthesize(seed)` runs the loop of the module `asearch.synth.pipeline` describes and returns the
seed's `Attempt` (accepted with its question, or rejected with a reason code); `start` (the base QA through
the gates), `gates` (one proposed edit through them) and `question` (the output row) are its parts, which
the agent backend (`asearch.synth.agentic`) drives from its tools instead.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from asearch.synth.backend import Draft, EditAction, Seed, SynthBackend
from asearch.synth.config import SynthConfig
from asearch.synth.records import EditStep, SynthQuestion, Uniqueness
from asearch.synth.solver import DirectResult, DirectSolver, Grader

Status = Literal["accepted", "rejected"]


@dataclass(slots=True)
class Attempt:
    """What happened to one seed: accepted with its question, or rejected with a reason code."""

    seed: Seed
    status: Status
    # accepted | no_base | base_quality | base_uniqueness | not_hard | too_few_edits (| agent: no_stop, not_solvable)
    reason_code: str
    reason: str
    history: list[EditStep]
    question: SynthQuestion | None = None
    inapplicable: int = 0  # operator tries that found nothing to edit
    solver_calls: int = 0
    judge_errors: int = 0
    elapsed_s: float = 0.0
    structure: dict[str, Any] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)  # agent backend: its turns by action kind
    agent: dict[str, Any] = field(default_factory=dict)  # agent backend: finish, refusals, transcript

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed.to_dict(),
            "status": self.status,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "history": [s.to_dict() for s in self.history],
            "question": None if self.question is None else self.question.to_row(),
            "inapplicable": self.inapplicable,
            "solver_calls": self.solver_calls,
            "judge_errors": self.judge_errors,
            "elapsed_s": round(self.elapsed_s, 4),
            "structure": self.structure,
            **({"actions": self.actions, "agent": self.agent} if self.agent else {}),
        }


class Synthesizer:
    """Runs the per-seed loop with one backend, one solver and one grader."""

    def __init__(self, backend: SynthBackend, solver: DirectSolver, grader: Grader, cfg: SynthConfig):
        self.backend, self.solver, self.grader, self.cfg = backend, solver, grader, cfg

    def models(self) -> dict[str, str]:
        judge = getattr(self.grader.judge, "client", None)
        return {
            **self.backend.models(),
            "solver": self.solver.name,
            "grader": self.grader.name + (f":{judge.model}" if judge is not None else ""),
        }

    def is_hard(self, result: DirectResult) -> bool:
        return result.n_correct <= self.cfg.gates.max_correct

    async def synthesize(self, seed: Seed) -> Attempt:
        """One seed from base QA to accepted or rejected; exceptions propagate (the runner logs them)."""
        cfg, backend = self.cfg, self.backend
        t0 = time.perf_counter()
        rng = random.Random(f"asearch-synth/{cfg.seed}/{seed.key}")
        attempt = Attempt(seed, "rejected", "", "", [])

        def finish(code: str, reason: str, status: Status = "rejected") -> Attempt:
            attempt.status, attempt.reason_code, attempt.reason = status, code, reason
            attempt.elapsed_s = time.perf_counter() - t0
            return attempt

        started = await self.start(seed, rng, attempt)
        if started is None:
            return finish(attempt.reason_code, attempt.reason)
        current, current_result, uniqueness = started
        kept_edits = 0

        for rnd in range(1, cfg.rounds + 1):
            if kept_edits >= cfg.min_edits and self.is_hard(current_result):
                break
            first: EditAction = "inject" if rng.random() < cfg.p_inject else "fuzz"
            action, draft = first, await backend.edit(current, first, rng)
            if draft is None:
                attempt.inapplicable += 1
                action = "fuzz" if first == "inject" else "inject"
                draft = await backend.edit(current, action, rng)
            if draft is None:
                attempt.inapplicable += 1
                break  # nothing left to edit
            step = edit_step(rnd, action, current, draft)
            attempt.history.append(step)
            verdict = await self.gates(current_result, draft, step, attempt, before=current)
            if verdict is None:
                continue
            step.kept = True
            current, (current_result, uniqueness) = draft, verdict
            kept_edits += 1

        attempt.structure = _structure(current)
        if not self.is_hard(current_result):
            return finish(
                "not_hard",
                f"{current_result.n_correct}/{len(current_result.correct)} direct answers still correct "
                f"after {cfg.rounds} rounds",
            )
        if kept_edits < cfg.min_edits:
            return finish("too_few_edits", f"{kept_edits} kept edits < min_edits={cfg.min_edits}")
        attempt.question = self.question(seed, current, attempt, uniqueness, current_result)
        return finish("accepted", f"hard after {kept_edits} kept edits", "accepted")

    async def start(
        self, seed: Seed, rng: random.Random, attempt: Attempt
    ) -> tuple[Draft, DirectResult, Uniqueness] | None:
        """The seed's base QA through the gates, recorded as round 0; None when there is none or it fails
        (then `attempt.reason_code` and `.reason` say why)."""
        base = await self.backend.base(seed, rng)
        if base is None:
            attempt.reason_code, attempt.reason = "no_base", "the seed offers no fact to ask about"
            return None
        step = EditStep(
            0, "base", base.question, False, reason=base.note, statements_added=list(base.statements)
        )
        attempt.history.append(step)
        verdict = await self.gates(None, base, step, attempt)
        if verdict is None:
            attempt.reason_code, attempt.reason = f"base_{step.rejected_by}", step.reason
            return None
        step.kept = True
        return base, *verdict

    def question(
        self,
        seed: Seed,
        draft: Draft,
        attempt: Attempt,
        uniqueness: Uniqueness,
        result: DirectResult,
        tool_accuracy: float | None = None,
    ) -> SynthQuestion:
        """The output row of an accepted seed."""
        cfg = self.cfg
        return SynthQuestion(
            id=f"{cfg.id_prefix}-{seed.index:06d}",
            question=draft.question,
            answers=list(draft.answers),
            paraphrases=list(draft.paraphrases),
            statements=list(draft.statements),
            history=list(attempt.history),
            uniqueness=uniqueness,
            models=self.models(),
            seed={**seed.to_dict(), "run_seed": cfg.seed},
            backend=cfg.backend,
            corpus=self.backend.corpus,
            direct_accuracy=result.accuracy,
            tool_accuracy=tool_accuracy,
        )

    async def gates(
        self,
        previous: DirectResult | None,
        draft: Draft,
        step: EditStep,
        attempt: Attempt,
        *,
        before: Draft | None = None,
    ) -> tuple[DirectResult, Uniqueness] | None:
        """Quality, then uniqueness and difficulty (the order the backend needs); None = rejected, with the gate
        and its reason in `step`."""
        quality = await self.backend.quality(before, draft)
        if not quality.passed:
            step.rejected_by, step.reason = "quality", quality.reason
            return None
        uniqueness: Uniqueness | None = None
        if not self.backend.candidates_for_uniqueness:  # exact and cheap: before spending solver calls
            uniqueness = await self.backend.uniqueness(draft, [])
            if uniqueness.checked and not uniqueness.held:
                step.rejected_by, step.reason = "uniqueness", uniqueness.detail
                return None
        result = await self._difficulty(draft, attempt)
        step.direct_accuracy, step.direct_answers = result.accuracy, list(result.answers)
        if uniqueness is None:  # the LLM backend checks the solver's wrong answers against the statements
            uniqueness = await self.backend.uniqueness(draft, result.wrong)
            if uniqueness.checked and not uniqueness.held:
                step.rejected_by, step.reason = "uniqueness", uniqueness.detail
                return None
        if previous is not None and self.cfg.gates.reject_easier and result.accuracy > previous.accuracy:
            step.rejected_by = "difficulty"
            step.reason = f"easier: direct accuracy {previous.accuracy:.2f} -> {result.accuracy:.2f}"
            return None
        return result, uniqueness

    async def _difficulty(self, draft: Draft, attempt: Attempt) -> DirectResult:
        answers = await self.solver.answers(draft.question, self.cfg.solver.k, self.cfg.seed)
        attempt.solver_calls += len(answers)
        result = await self.grader.grade(draft.question, answers, draft.answers + draft.paraphrases)
        attempt.judge_errors += result.judge_errors
        return result


def edit_step(rnd: int, action: EditAction, before: Draft, draft: Draft) -> EditStep:
    """The history entry of a proposed edit: its question, what it did, and the statements it adds."""
    seen = {(s.text, s.url) for s in before.statements}
    added = [s for s in draft.statements if (s.text, s.url) not in seen]
    return EditStep(rnd, action, draft.question, False, reason=draft.note, statements_added=added)


def _structure(draft: Draft) -> dict[str, Any]:
    """Shape of the final question for the report (graph patterns: facts, depth, named entities)."""
    state = draft.state
    out: dict[str, Any] = {"statements": len(draft.statements), "words": len(draft.question.split())}
    if hasattr(state, "to_dict") and hasattr(state, "depth"):
        out.update(
            facts=state.n_facts,
            depth=state.depth(),
            named=sum(1 for n in state.nodes if n.named),
            ask=state.ask,
            pattern=state.to_dict(),
        )
    return out
