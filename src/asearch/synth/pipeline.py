"""A resumable, concurrent synthesis run over many seeds, with every backend.

Per seed (`asearch.synth.synthesizer.Synthesizer`, or the agent of `asearch.synth.agentic`): base QA -> gates -> up to T rounds of INJECT or FUZZ, each edit kept only if it passes the
quality and uniqueness gates and does not get easier -> accepted once hard (at most `max_correct` of
the solver's k tool-less answers right) after at least `min_edits` kept edits. Every finished seed is
appended to `attempts.jsonl`; a rerun skips those, so a killed run continues where it stopped. The
final `questions.jsonl` (deduplicated) and the filter report are rebuilt from the attempts log.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
from asearch.synth.backend import Seed, SynthBackend, backend_kind
from asearch.synth.config import SynthConfig
from asearch.synth.dedup import NearDuplicateIndex
from asearch.synth.preflight import check_endpoints, endpoints_to_check
from asearch.synth.report import build_report, render_report
from asearch.synth.solver import DirectSolver, Grader
from asearch.synth.synthesizer import Attempt, Synthesizer

if TYPE_CHECKING:
    from asearch.engine.types import Engine

__all__ = [
    "Attempt",
    "Progress",
    "SynthSummary",
    "Synthesizer",
    "finalize",
    "run_synthesis",
    "run_synthesis_async",
]

ATTEMPTS_FILE = "attempts.jsonl"
ERRORS_FILE = "errors.jsonl"
QUESTIONS_FILE = "questions.jsonl"

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

    def why_empty(self) -> str | None:
        """None when questions were written; else why not, from the report (for a non-zero exit)."""
        if self.written:
            return None
        seeds = self.report["seeds"]
        rejected = ", ".join(f"{code} {n}" for code, n in seeds["rejected"].items() if n)
        errors = read_attempts(self.out_dir / ERRORS_FILE)
        last = f"; last error: {errors[-1]['error'].splitlines()[0]}" if errors else ""
        return (
            f"no questions written to {self.out_dir / QUESTIONS_FILE}: {seeds['finished']} seeds finished "
            f"({seeds['accepted']} accepted; rejected: {rejected or 'none'}), {seeds['errors_unresolved']} "
            f"seeds raised and are unfinished{last}. See {self.out_dir / 'filter_report.md'}"
            + (f" and {self.out_dir / ERRORS_FILE}" if errors else "")
        )


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


class SeedRunner(Protocol):
    """What the run needs per seed: `Synthesizer` (graph, llm) or `asearch.synth.agentic.AgentSynthesizer`."""

    async def synthesize(self, seed: Seed) -> Attempt: ...

    def models(self) -> dict[str, str]: ...


async def run_synthesis_async(
    cfg: SynthConfig,
    out_dir: str | Path,
    *,
    backend: SynthBackend | None = None,
    solver: DirectSolver | None = None,
    grader: Grader | None = None,
    agent_engine: Engine | None = None,
    max_errors: int = 20,
    log: Callable[[str], None] = print,
    on_progress: Callable[[Progress], None] | None = None,
) -> SynthSummary:
    """Run (or resume) synthesis into `out_dir`; parts not given are built from `cfg` (and closed here).

    The endpoints of the parts built here are reached first: one that refuses the connection fails the run
    before any seed starts, naming its config key. `agent_engine` (backend agent) is the synthesis agent's
    engine, with a `tokenizer`; default: built from `cfg.agent_engine()`. `on_progress` is called once after
    the finished seeds on disk are counted, then after every seed.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_same_run(out, cfg)
    await check_endpoints(
        endpoints_to_check(cfg, backend=backend is None, solver=solver is None, agent=agent_engine is None)
    )
    attempts_path = out / ATTEMPTS_FILE
    for log_path in (attempts_path, out / ERRORS_FILE):
        repair_jsonl_tail(log_path)  # a killed run's torn last line; its seed is done again
    done = read_attempts(attempts_path)

    owned: list[Any] = []
    try:
        runner, backend = _build_runner(cfg, backend, solver, grader, agent_engine, owned)
        seeds = backend.seeds()[: cfg.max_seeds]
        state = await _run_seeds(cfg, out, runner, seeds, done, max_errors, log, on_progress)
    finally:
        for part in reversed(owned):
            await part.aclose()
    summary = finalize(out, cfg, models=runner.models())
    summary.attempted_now, summary.resumed, summary.errors = state.attempted, len(done), state.errors
    if state.errors >= max_errors:
        raise AsearchError(
            f"synthesis stopped after {state.errors} failed seeds (see {out / ERRORS_FILE}); "
            "fix the cause and rerun the same command to continue"
        )
    return summary


def _build_runner(
    cfg: SynthConfig,
    backend: SynthBackend | None,
    solver: DirectSolver | None,
    grader: Grader | None,
    agent_engine: Engine | None,
    owned: list[Any],
) -> tuple[SeedRunner, SynthBackend]:
    """The per-seed runner and its backend; what is built here is appended to `owned` (closed by the run)."""
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
    if not backend_kind(cfg.backend).agentic:
        return synth, backend
    from asearch.synth.agentic import build_agent_synthesizer

    runner = build_agent_synthesizer(cfg, synth, engine=agent_engine)
    owned.append(runner)
    return runner, backend


async def _run_seeds(
    cfg: SynthConfig,
    out: Path,
    runner: SeedRunner,
    seeds: list[Seed],
    done: list[dict[str, Any]],
    max_errors: int,
    log: Callable[[str], None],
    on_progress: Callable[[Progress], None] | None,
) -> Progress:
    """Every seed not on disk, `concurrency` at once, in seed order, until `n_questions` distinct questions
    are in: no seed starts after that, and the seeds in flight finish (and are logged)."""
    done_keys = {a["seed"]["key"] for a in done}
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
                attempt = await runner.synthesize(seed)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one bad seed or a flaky endpoint must not end the run
                state.errors += 1
                append_jsonl(
                    out / ERRORS_FILE,
                    {"seed": seed.to_dict(), "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()},
                )  # fmt: skip
            else:
                append_jsonl(out / ATTEMPTS_FILE, attempt.to_dict())
                state.attempted += 1
                state.finished += 1
                row = attempt.question.to_row() if attempt.question is not None else None
                if row is not None and _is_new(dedup, cfg, seed.index, row):
                    state.distinct += 1
            if on_progress is not None:
                on_progress(state)

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    return state


def _is_new(dedup: NearDuplicateIndex, cfg: SynthConfig, index: int, row: dict[str, Any]) -> bool:
    if not cfg.dedup.enabled:
        return True
    group = normalize_answer(row["answer"][0]) if cfg.dedup.same_answer_only else ""
    return dedup.add(index, row["question"], group) is None


def finalize(out_dir: str | Path, cfg: SynthConfig, *, models: dict[str, str] | None = None) -> SynthSummary:
    """Rebuild questions.jsonl (seed order, near-duplicates removed, the first `n_questions`) and the filter
    report from attempts."""
    out = Path(out_dir)
    attempts = sorted(read_attempts(out / ATTEMPTS_FILE), key=lambda a: a["seed"]["index"])
    accepted = [a for a in attempts if a["status"] == "accepted"]
    duplicates: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    dedup = NearDuplicateIndex(cfg.dedup.threshold, num_perm=cfg.dedup.num_perm, bands=cfg.dedup.bands)
    over_target: list[dict[str, Any]] = []  # accepted in seed order after n_questions were written
    for a in accepted:
        row = a["question"]
        if len(rows) == cfg.n_questions:  # seeds in flight at the target finished after it
            over_target.append(row)
            continue
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
    if not models:  # `asearch synth report`: the models the written questions name
        models = {k: v for row in rows for k, v in (row.get("models") or {}).items()}
    report = build_report(
        attempts, rows, duplicates, cfg, models=models, errors_logged=len(errors),
        errors_unresolved=len(unresolved), over_target=len(over_target),
    )  # fmt: skip
    atomic_write_json(out / "filter_report.json", report)
    atomic_write_text(out / "filter_report.md", render_report(report))
    return SynthSummary(out, report, len(rows), 0, len(attempts), 0)


def build_backend(cfg: SynthConfig) -> SynthBackend:
    """The backend `cfg.backend` names, built by its registered function (graph, llm; agent: the LLM backend,
    which writes its base QA and runs its gates)."""
    return backend_kind(cfg.backend).build(cfg)


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
