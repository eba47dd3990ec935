"""The synthesis loop shared by both backends, and a resumable, concurrent run over many seeds.

Per seed: base QA -> gates -> up to T rounds of INJECT or FUZZ, each edit kept only if it passes the
quality and uniqueness gates and does not get easier -> accepted once hard (at most `max_correct` of
the solver's k tool-less answers right) after at least `min_edits` kept edits. Every finished seed is
appended to `attempts.jsonl`; a rerun skips those, so a killed run continues where it stopped. The
final `questions.jsonl` (deduplicated) and the filter report are rebuilt from the attempts log.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from asearch.config import dump_config
from asearch.errors import AsearchError, ConfigError
from asearch.files import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    iter_jsonl,
    repair_jsonl_tail,
    write_jsonl,
)
from asearch.metrics.normalize import normalize_answer
from asearch.synth.backend import Draft, EditAction, Seed, SynthBackend
from asearch.synth.config import SynthConfig
from asearch.synth.dedup import NearDuplicateIndex
from asearch.synth.records import EditStep, SynthQuestion, Uniqueness
from asearch.synth.report import build_report, render_report
from asearch.synth.solver import DirectResult, DirectSolver, Grader

ATTEMPTS_FILE = "attempts.jsonl"
ERRORS_FILE = "errors.jsonl"
QUESTIONS_FILE = "questions.jsonl"

Status = Literal["accepted", "rejected"]


@dataclass(slots=True)
class Attempt:
    """What happened to one seed: accepted with its question, or rejected with a reason code."""

    seed: Seed
    status: Status
    reason_code: str  # accepted | no_base | base_quality | base_not_unique | not_hard | too_few_edits
    reason: str
    history: list[EditStep]
    question: SynthQuestion | None = None
    inapplicable: int = 0  # operator tries that found nothing to edit
    solver_calls: int = 0
    judge_errors: int = 0
    elapsed_s: float = 0.0
    structure: dict[str, Any] = field(default_factory=dict)

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

        base = await backend.base(seed, rng)
        if base is None:
            return finish("no_base", "the seed offers no fact to ask about")
        step = EditStep(
            0, "base", base.question, False, reason=base.note, statements_added=list(base.statements)
        )
        attempt.history.append(step)
        verdict = await self._gates(None, base, step, attempt)
        if verdict is None:
            return finish(f"base_{step.rejected_by}", step.reason)
        current, current_result, uniqueness = base, *verdict
        step.kept = True
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
            seen = {(s.text, s.url) for s in current.statements}
            step = EditStep(
                rnd,
                action,
                draft.question,
                False,
                reason=draft.note,
                statements_added=[s for s in draft.statements if (s.text, s.url) not in seen],
            )
            attempt.history.append(step)
            verdict = await self._gates(current_result, draft, step, attempt, before=current)
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
        attempt.question = SynthQuestion(
            id=f"{cfg.id_prefix}-{seed.index:06d}",
            question=current.question,
            answers=list(current.answers),
            paraphrases=list(current.paraphrases),
            statements=list(current.statements),
            history=list(attempt.history),
            uniqueness=uniqueness,
            models=self.models(),
            seed={**seed.to_dict(), "run_seed": cfg.seed},
            backend=backend.name,
            corpus=backend.corpus,
            direct_accuracy=current_result.accuracy,
        )
        return finish("accepted", f"hard after {kept_edits} kept edits", "accepted")

    async def _gates(
        self,
        previous: DirectResult | None,
        draft: Draft,
        step: EditStep,
        attempt: Attempt,
        *,
        before: Draft | None = None,
    ) -> tuple[DirectResult, Uniqueness] | None:
        """Quality, then uniqueness and difficulty (the order the backend needs); None = rejected."""
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


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class Progress:
    """Where a run stands: seeds finished (on disk included), distinct questions so far, seeds that raised."""

    target: int  # n_questions
    seeds: int  # seeds available to the run
    finished: int = 0
    distinct: int = 0
    attempted: int = 0  # seeds finished by this invocation
    errors: int = 0  # seeds that raised in this invocation (retried by the next run)


@dataclass(slots=True)
class SynthSummary:
    out_dir: Path
    report: dict[str, Any]
    written: int  # questions in questions.jsonl
    attempted_now: int  # seeds finished by this invocation
    resumed: int  # seeds found finished on disk
    errors: int  # seeds that raised this time (retried by the next run)


def _check_same_run(out_dir: Path, cfg: SynthConfig) -> None:
    identity_path = out_dir / "config.json"
    identity = cfg.identity()
    if identity_path.exists():
        old = json.loads(identity_path.read_text())
        if old != identity:
            diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            raise ConfigError(
                f"{out_dir} holds a synthesis run with other settings (differs in: {', '.join(diff)}); "
                "use another --out or the same config"
            )
    atomic_write_json(identity_path, identity)
    dump_config(cfg, out_dir / "config.yaml")


def read_attempts(path: str | Path) -> list[dict[str, Any]]:
    """Every object of a run's jsonl log: attempts (finished seeds) or errors (a line cut by a kill is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    return [obj for _, obj in iter_jsonl(path, tolerate_torn_tail=True)]


async def run_synthesis_async(
    cfg: SynthConfig,
    out_dir: str | Path,
    *,
    backend: SynthBackend | None = None,
    solver: DirectSolver | None = None,
    grader: Grader | None = None,
    max_errors: int = 20,
    log: Callable[[str], None] = print,
    on_progress: Callable[[Progress], None] | None = None,
) -> SynthSummary:
    """Run (or resume) synthesis into `out_dir`; parts not given are built from `cfg` (and closed here).

    `on_progress` is called once after the finished seeds on disk are counted, then after every seed.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_same_run(out, cfg)
    attempts_path = out / ATTEMPTS_FILE
    for log_path in (attempts_path, out / ERRORS_FILE):
        repair_jsonl_tail(log_path)  # a killed run's torn last line; its seed is done again
    done = read_attempts(attempts_path)
    done_keys = {a["seed"]["key"] for a in done}

    owned: list[Any] = []
    if backend is None:
        backend = build_backend(cfg)
        owned.append(backend)
    if solver is None:
        from asearch.synth.solver import build_solver

        solver = build_solver(cfg.solver)
        owned.append(solver)
    if grader is None:
        grader = build_grader(cfg, backend)
        owned.append(grader)
    synth = Synthesizer(backend, solver, grader, cfg)

    seeds = backend.seeds()[: cfg.max_seeds]
    dedup = NearDuplicateIndex(cfg.dedup.threshold, num_perm=cfg.dedup.num_perm, bands=cfg.dedup.bands)
    distinct = 0
    for a in sorted(done, key=lambda a: a["seed"]["index"]):
        if a["status"] == "accepted" and _is_new(dedup, cfg, a["seed"]["index"], a["question"]):
            distinct += 1
    todo = iter([s for s in seeds if s.key not in done_keys])
    log(
        f"synth: {len(seeds)} seeds, {len(done)} done ({distinct} distinct questions), "
        f"target {cfg.n_questions}, concurrency {cfg.concurrency} -> {out}"
    )
    state = Progress(target=cfg.n_questions, seeds=len(seeds), finished=len(done), distinct=distinct)
    if on_progress is not None:
        on_progress(state)

    async def worker() -> None:
        while state.distinct < cfg.n_questions and state.errors < max_errors:
            seed = next(todo, None)
            if seed is None:
                return
            try:
                attempt = await synth.synthesize(seed)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one bad seed or a flaky endpoint must not end the run
                state.errors += 1
                append_jsonl(
                    out / ERRORS_FILE,
                    {
                        "seed": seed.to_dict(),
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc(),
                    },
                )
                if on_progress is not None:
                    on_progress(state)
                continue
            append_jsonl(attempts_path, attempt.to_dict())
            state.attempted += 1
            state.finished += 1
            if attempt.question is not None and _is_new(dedup, cfg, seed.index, attempt.question.to_row()):
                state.distinct += 1
            if on_progress is not None:
                on_progress(state)

    try:
        await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    finally:
        for part in owned:
            await part.aclose()
    summary = finalize(out, cfg, models=synth.models())
    summary.attempted_now, summary.resumed, summary.errors = state.attempted, len(done), state.errors
    if state.errors >= max_errors:
        raise AsearchError(
            f"synthesis stopped after {state.errors} failed seeds (see {out / ERRORS_FILE}); "
            "fix the cause and rerun the same command to continue"
        )
    return summary


def _is_new(dedup: NearDuplicateIndex, cfg: SynthConfig, index: int, row: dict[str, Any]) -> bool:
    if not cfg.dedup.enabled:
        return True
    group = normalize_answer(row["answer"][0]) if cfg.dedup.same_answer_only else ""
    return dedup.add(index, row["question"], group) is None


def finalize(out_dir: str | Path, cfg: SynthConfig, *, models: dict[str, str] | None = None) -> SynthSummary:
    """Rebuild questions.jsonl (seed order, near-duplicates removed) and the filter report from attempts."""
    out = Path(out_dir)
    attempts = sorted(read_attempts(out / ATTEMPTS_FILE), key=lambda a: a["seed"]["index"])
    accepted = [a for a in attempts if a["status"] == "accepted"]
    duplicates: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    dedup = NearDuplicateIndex(cfg.dedup.threshold, num_perm=cfg.dedup.num_perm, bands=cfg.dedup.bands)
    for a in accepted:
        row = a["question"]
        group = normalize_answer(row["answer"][0]) if cfg.dedup.same_answer_only else ""
        dup = dedup.add(a["seed"]["index"], row["question"], group) if cfg.dedup.enabled else None
        if dup is None:
            rows.append(row)
        else:
            kept = next(r for r in rows if r["seed"]["index"] == dup.of)
            duplicates.append(
                {"id": row["id"], "question": row["question"], "duplicate_of": kept["id"],
                 "kept_question": kept["question"], "similarity": round(dup.similarity, 3)}
            )  # fmt: skip
    write_jsonl(out / QUESTIONS_FILE, rows)
    errors = read_attempts(out / ERRORS_FILE)  # same log format: one object per line, torn tail ignored
    finished = {a["seed"]["key"] for a in attempts}
    unresolved = {e["seed"]["key"] for e in errors} - finished
    report = build_report(
        attempts, rows, duplicates, cfg, models=models or {}, errors_logged=len(errors),
        errors_unresolved=len(unresolved),
    )  # fmt: skip
    atomic_write_json(out / "filter_report.json", report)
    atomic_write_text(out / "filter_report.md", render_report(report))
    return SynthSummary(out, report, len(rows), 0, len(attempts), 0)


def build_backend(cfg: SynthConfig) -> SynthBackend:
    if cfg.backend == "graph":
        from asearch.synth.graph_backend import GraphBackend

        return GraphBackend(cfg.graph, cfg.gates, cfg.seed)
    from asearch.synth.llm_backend import LLMBackend

    return LLMBackend(cfg.llm, cfg.gates, cfg.seed)


def build_grader(cfg: SynthConfig, backend: SynthBackend) -> Grader:
    """EM/F1 graders need nothing; a judge grader uses the backend's judge, or its own client to llm.judge."""
    if cfg.grading.method != "judge":
        return Grader(cfg.grading)
    judge = getattr(backend, "judge", None)
    if judge is not None:
        return Grader(cfg.grading, judge)
    from asearch.metrics.judge import LLMJudge
    from asearch.synth.solver import chat_client

    assert cfg.llm.judge is not None  # the config validator guarantees it
    return Grader(cfg.grading, LLMJudge(chat_client(cfg.llm.judge)), owns_client=True)


def run_synthesis(cfg: SynthConfig, out_dir: str | Path, **kwargs: Any) -> SynthSummary:
    """Blocking form of `run_synthesis_async`."""
    return asyncio.run(run_synthesis_async(cfg, out_dir, **kwargs))
