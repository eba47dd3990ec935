"""The resumable eval runner: k passes per question, one durable result line each, summaries at the end.

`evaluate(solve, records, out_dir=...)` calls `solve(record, seed)` for every (question, pass) not
yet in `out_dir/results.jsonl`, scores it (EM/F1/CEM, optional LLM judge) and appends one line with
a single write + fsync. Killed at any moment (even kill -9), the same call resumes: finished lines
are skipped, a torn last line is cut off and redone, nothing is scored twice. It knows nothing of
engines: `solve` is any async function returning a Trajectory (see `workflow_solver`, which runs a
rollout workflow). `evaluate_workflow` is the in-memory form for held-out curves during training.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asearch.errors import AsearchError, ConfigError, DataFormatError
from asearch.eval.datasets import QARecord
from asearch.eval.report import AGGREGATED_COUNTERS, render_markdown, summarize
from asearch.files import append_jsonl, atomic_write_json, atomic_write_text, iter_jsonl, repair_jsonl_tail
from asearch.metrics.qa import qa_scores

if TYPE_CHECKING:
    from asearch.agent.workflow import RolloutWorkflow, SearchAgentWorkflow
    from asearch.engine.types import Engine, Tokenizer

__all__ = [
    "RESULTS_FILE",
    "EpisodeScores",
    "EvalSummary",
    "Solve",
    "agent_solver",
    "aggregate_only",
    "evaluate",
    "evaluate_async",
    "evaluate_workflow",
    "parse_shard",
    "read_results",
    "shard_records",
    "workflow_solver",
]

Solve = Callable[[QARecord, int], Awaitable[Any]]  # (record, seed) -> Trajectory
RESULTS_FILE = "results.jsonl"
RESULT_VERSION = 1
_REQUIRED = {"id": str, "dataset": str, "pass": int, "seed": int, "em": float, "f1": float, "cem": float}


@dataclass
class EvalSummary:
    """What one evaluate / aggregate_only call produced (`summary` is summary.json's content)."""

    out_dir: Path
    summary: dict[str, Any]
    written: int = 0  # result lines written by this call
    resumed: int = 0  # result lines found on disk and kept
    failed: int = 0  # (question, pass) whose solve or judge raised: not written, retried next run

    @property
    def k(self) -> int:
        return int(self.summary["k"])

    @property
    def datasets(self) -> dict[str, Any]:
        return self.summary["datasets"]

    @property
    def overall(self) -> dict[str, Any]:
        return self.summary["overall"]

    def metric(self, dataset: str, metric: str, kind: str = "avg_at_k") -> float | None:
        """Point estimate, e.g. metric("nq", "f1") for F1 Avg@k; dataset "*" = all pooled; None when nothing is complete."""
        group = self.overall if dataset == "*" else self.datasets[dataset]
        metrics = group.get("metrics")
        return None if metrics is None else metrics[metric][kind]["mean"]


# --------------------------------------------------------------------------- sharding


def parse_shard(text: str) -> tuple[int, int]:
    """`"2/8"` -> (2, 8); i counts from 0."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"shard {text!r} must look like i/n, e.g. 0/4") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"shard {text!r}: need n >= 1 and 0 <= i < n")
    return i, n


def shard_records(records: Sequence[QARecord], shard: tuple[int, int]) -> list[QARecord]:
    """The records of shard i of n: chosen by a hash of (dataset, id), so a record's shard depends on
    nothing else (not on order, nor on which other records are in the run)."""
    i, n = shard
    if n == 1:
        return list(records)

    def bucket(r: QARecord) -> int:
        return int.from_bytes(hashlib.sha256(f"{r.dataset}\x00{r.id}".encode()).digest()[:8], "big") % n

    return [r for r in records if bucket(r) == i]


# --------------------------------------------------------------------------- results file


def _validate_line(path: Path, line: int, obj: Mapping[str, Any]) -> None:
    for key, typ in _REQUIRED.items():
        value = obj.get(key)
        ok = (
            isinstance(value, int | float) and not isinstance(value, bool)
            if typ is float
            else isinstance(value, typ)
        )
        if not ok or isinstance(value, bool):
            raise DataFormatError(path, line, key, f"expected {typ.__name__}, got {value!r}")


def read_results(path: str | Path, *, keep_trajectory: bool = False) -> list[dict[str, Any]]:
    """Result lines of one results.jsonl (validated; a duplicate (dataset, id, pass) names both lines).

    The `trajectory` field is dropped unless asked for: summaries do not need it and it is the bulk.
    """
    path = Path(path)
    out: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int], int] = {}
    for line, obj in iter_jsonl(path, tolerate_torn_tail=True):
        _validate_line(path, line, obj)
        key = (obj["dataset"], obj["id"], obj["pass"])
        if key in seen:
            raise DataFormatError(
                path, line, "id", f"{key} is already scored at line {seen[key]}: results would count twice"
            )
        seen[key] = line
        if not keep_trajectory:
            obj.pop("trajectory", None)
        out.append(obj)
    return out


@contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """One writer per run directory: a second eval on the same --out would interleave and double count."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AsearchError(
                f"{run_dir} is in use by another eval run (lock {run_dir / '.lock'})"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [
            d
            for key in sorted(set(a) | set(b))
            for d in _diff_keys(a.get(key), b.get(key), f"{prefix}{key}.")
        ]
    return [] if a == b else [prefix.rstrip(".") or "<root>"]


def _jsonable(config: Any) -> Any:
    dump = getattr(config, "model_dump", None)
    return dump(mode="json") if callable(dump) else json.loads(json.dumps(config, default=str))


# --------------------------------------------------------------------------- evaluate


def _result_line(rec: QARecord, p: int, seed: int, traj: Any, wall_s: float, verdict: Any) -> dict[str, Any]:
    answer = getattr(traj, "answer", None)
    scores = qa_scores(answer, rec.golds)
    turns = getattr(traj, "turns", None) or []
    return {
        "v": RESULT_VERSION,
        "id": rec.id,
        "dataset": rec.dataset,
        "data_source": rec.source,  # per-source summaries group by it (eval.report)
        "pass": p,
        "seed": seed,
        "question": rec.question,
        "golds": rec.golds,
        "prediction": answer,
        "em": scores.em,
        "f1": scores.f1,
        "cem": scores.cem,
        "judge": None if verdict is None else verdict.to_dict(),
        "finish": getattr(traj, "finish", None),
        "num_turns": len(turns),
        "counters": dict(getattr(traj, "counters", {}) or {}),
        "infra_faults": dict(getattr(traj, "infra_faults", {}) or {}),  # non-empty: masked (eval.report)
        "wall_s": wall_s,
        "trajectory": traj.to_dict() if hasattr(traj, "to_dict") else None,
    }


class _Progress:
    """A rich progress bar with the running EM/F1 (or nothing, when disabled)."""

    def __init__(self, enabled: bool, total: int, done: Sequence[Mapping[str, Any]]):
        self.n = len(done)
        self.em = sum(r["em"] for r in done)
        self.f1 = sum(r["f1"] for r in done)
        self.failed = 0
        self.bar: Any = None
        if enabled:
            from asearch.progress import progress_bar

            self.bar = progress_bar("{task.fields[running]}")
            self.task = self.bar.add_task("eval", total=total, completed=self.n, running=self._text())

    def _text(self) -> str:
        if not self.n:
            return ""
        fail = f" [red]failed {self.failed}[/red]" if self.failed else ""
        return f"EM {self.em / self.n:.3f} F1 {self.f1 / self.n:.3f}{fail}"

    def add(self, line: Mapping[str, Any] | None) -> None:
        if line is None:
            self.failed += 1
        else:
            self.n += 1
            self.em += line["em"]
            self.f1 += line["f1"]
        if self.bar is not None:
            self.bar.update(self.task, advance=0 if line is None else 1, running=self._text())

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


async def evaluate_async(
    solve: Solve,
    records: Sequence[QARecord],
    *,
    out_dir: str | Path,
    k: int = 1,
    seeds: Sequence[int] | None = None,
    concurrency: int = 16,
    shard: tuple[int, int] = (0, 1),
    judge: Any = None,
    progress: bool = True,
    config: Any = None,
    max_failures: int | None = 20,
    metrics: Callable[[], Mapping[str, float]] | None = None,
) -> EvalSummary:
    """Run (or resume) an eval; see `evaluate`. For callers already inside an event loop (training)."""
    # agent_solver's solve carries its tools' counters (web cache, cost), so the CLI needs no extra wiring
    metrics = metrics or getattr(solve, "metrics", None)
    seeds = list(range(k)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != k or k < 1:
        raise ConfigError(f"need k >= 1 seeds, one per pass: k={k}, seeds={seeds}")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    keys = [(r.dataset, r.id) for r in records]
    if len(set(keys)) != len(keys):
        dup = next(key for key in keys if keys.count(key) > 1)
        raise ConfigError(f"records hold (dataset, id) {dup} more than once")
    records = shard_records(records, shard)
    run_dir = Path(out_dir)
    if shard[1] > 1:
        run_dir = run_dir / f"shard-{shard[0]}-of-{shard[1]}"  # aggregate_only(out_dir) merges the shards

    with _exclusive(run_dir):
        results_path = run_dir / RESULTS_FILE
        cfg = {
            "k": k,
            "seeds": seeds,
            "shard": list(shard),
            "concurrency": concurrency,
            "datasets": _counts(r.dataset for r in records),
            "data_sources": _counts(r.source for r in records),
            "judge": None if judge is None else type(judge).__name__,
            "run": None if config is None else _jsonable(config),
        }
        _check_same_run(run_dir, cfg)
        done: list[dict[str, Any]] = []
        for log_path in (results_path, run_dir / "errors.jsonl"):
            repair_jsonl_tail(log_path)  # a killed run's torn last line; its question is run again
        if results_path.exists():
            done = read_results(results_path)
            for r in done:
                if r["pass"] < k and r["seed"] != seeds[r["pass"]]:
                    raise ConfigError(
                        f"{results_path}: ({r['dataset']}, {r['id']}) pass {r['pass']} was run with seed "
                        f"{r['seed']}, this run gives pass {r['pass']} seed {seeds[r['pass']]}: use the same seeds "
                        "or another out dir"
                    )
        atomic_write_json(run_dir / "config.json", cfg)  # only once the results on disk are known to fit it
        wanted = {(r.dataset, r.id) for r in records}
        done = [r for r in done if (r["dataset"], r["id"]) in wanted and r["pass"] < k]
        finished = {(r["dataset"], r["id"], r["pass"]) for r in done}
        jobs = [(rec, p) for rec in records for p in range(k) if (rec.dataset, rec.id, p) not in finished]

        written, failed = await _run_jobs(
            solve, jobs, seeds, results_path, run_dir, judge, concurrency, progress, done, max_failures
        )
        summary = _write_summaries(
            run_dir,
            read_results(results_path) if results_path.exists() else [],
            k,
            records,
            run_metrics=metrics() if metrics is not None else None,
        )
    result = EvalSummary(out_dir=run_dir, summary=summary, written=written, resumed=len(done), failed=failed)
    if max_failures is not None and failed >= max_failures:
        raise AsearchError(
            f"eval stopped after {failed} failed questions (see {run_dir / 'errors.jsonl'}); "
            "fix the cause and run the same command again to resume"
        )
    return result


async def _run_jobs(
    solve: Solve,
    jobs: list[tuple[QARecord, int]],
    seeds: list[int],
    results_path: Path,
    run_dir: Path,
    judge: Any,
    concurrency: int,
    progress: bool,
    done: list[dict[str, Any]],
    max_failures: int | None,
) -> tuple[int, int]:
    queue: asyncio.Queue[tuple[QARecord, int]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    counts = {"written": 0, "failed": 0}

    async def worker(bar: _Progress) -> None:
        while not queue.empty():
            if max_failures is not None and counts["failed"] >= max_failures:
                return
            rec, p = queue.get_nowait()
            seed = seeds[p]
            try:
                t0 = time.perf_counter()
                traj = await solve(rec, seed)
                wall_s = time.perf_counter() - t0
                verdict = None
                if judge is not None:
                    verdict = await judge.judge(rec.question, getattr(traj, "answer", None), rec.golds)
                line = _result_line(rec, p, seed, traj, wall_s, verdict)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed question is logged and retried by the next run, never scored
                counts["failed"] += 1
                append_jsonl(
                    run_dir / "errors.jsonl",
                    {
                        "id": rec.id,
                        "dataset": rec.dataset,
                        "pass": p,
                        "seed": seed,
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc(),
                        "time": time.time(),
                    },
                )
                bar.add(None)
                continue
            append_jsonl(results_path, line)  # one write + fsync: the line is whole or absent
            counts["written"] += 1
            bar.add(line)

    with _Progress(progress, len(done) + len(jobs), done) as bar:
        await asyncio.gather(*(worker(bar) for _ in range(min(concurrency, len(jobs)))))
    return counts["written"], counts["failed"]


def _counts(names: Iterable[str]) -> dict[str, int]:
    """Questions per name, names sorted."""
    return dict(sorted(Counter(names).items()))


_RESULT_NEUTRAL = ("runtime.tools.record",)


def _check_same_run(run_dir: Path, cfg: Mapping[str, Any]) -> None:
    """Refuse to resume results made by another configuration (another model in the same out dir)."""
    previous_path = run_dir / "config.json"
    if not previous_path.exists() or not (run_dir / RESULTS_FILE).exists():
        return
    try:
        previous = json.loads(previous_path.read_text())
    except json.JSONDecodeError:
        return  # written atomically, so only a hand edit gets here; the result lines are still checked
    if previous.get("run") is None or cfg.get("run") is None:
        return
    # recording and replaying tool answers changes no result: a run may resume with or without them
    diff = [d for d in _diff_keys(previous["run"], cfg["run"]) if not d.startswith(_RESULT_NEUTRAL)]
    if diff:
        raise ConfigError(
            f"{run_dir} holds results of a different configuration (differs in: {', '.join(diff[:8])}); "
            "use another out dir, or delete it to start over"
        )


def _write_summaries(
    run_dir: Path,
    results: list[dict[str, Any]],
    k: int,
    records: Sequence[QARecord],
    run_metrics: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    wanted = {(r.dataset, r.id) for r in records}
    kept = [r for r in results if (r["dataset"], r["id"]) in wanted and r["pass"] < k]
    summary = summarize(
        kept,
        k=k,
        expected=_counts(r.dataset for r in records),
        expected_sources=_counts(r.source for r in records),
    )
    summary["other_results"] = len(results) - len(kept)  # lines of questions/passes not in this run
    if run_metrics:
        # counters of this invocation only (a resumed run counts what it ran); not rebuilt by aggregate_only
        summary["run_metrics"] = dict(run_metrics)
    atomic_write_json(run_dir / "summary.json", summary)
    atomic_write_text(run_dir / "summary.md", render_markdown(summary, title=f"Evaluation: {run_dir}"))
    return summary


def evaluate(
    solve: Solve,
    records: Sequence[QARecord],
    *,
    out_dir: str | Path,
    k: int = 1,
    seeds: Sequence[int] | None = None,
    concurrency: int = 16,
    shard: tuple[int, int] = (0, 1),
    judge: Any = None,
    progress: bool = True,
    config: Any = None,
    max_failures: int | None = 20,
    metrics: Callable[[], Mapping[str, float]] | None = None,
) -> EvalSummary:
    """Evaluate `solve` on `records` (k passes each, seeds[i] for pass i), resuming from `out_dir`.

    Writes into `out_dir` (or `out_dir/shard-i-of-n` when sharded): `results.jsonl` (one line per
    (question, pass)), `summary.json`, `summary.md`, `config.json` (k, seeds, shard, dataset sizes,
    and `config`, the caller's resolved configuration: resuming with a different one is refused) and
    `errors.jsonl` (questions whose solve or judge raised; they are not scored and are retried by the
    next run). Up to `concurrency` questions run at once. After `max_failures` failures it stops
    launching questions, writes the summaries and raises. `judge` is an LLMJudge (or None).
    `metrics()` (default: `solve.metrics`, which `agent_solver` sets) gives counters of this invocation,
    such as the web cache hit rate and costs, for summary.json's `run_metrics`.
    """
    return asyncio.run(
        evaluate_async(
            solve,
            records,
            out_dir=out_dir,
            k=k,
            seeds=seeds,
            concurrency=concurrency,
            shard=shard,
            judge=judge,
            progress=progress,
            config=config,
            max_failures=max_failures,
            metrics=metrics,
        )
    )


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def aggregate_only(out_dir: str | Path) -> EvalSummary:
    """Recompute summary.json / summary.md from results on disk (merging `shard-*` subdirectories).

    k and the expected question counts come from the config.json files the runs wrote (k: else the
    largest pass index seen); questions with fewer than k passes count as incomplete.
    """
    out_dir = Path(out_dir)
    paths = [
        p for p in [out_dir / RESULTS_FILE, *sorted(out_dir.glob(f"shard-*/{RESULTS_FILE}"))] if p.exists()
    ]
    if not paths:
        raise AsearchError(f"{out_dir}: no {RESULTS_FILE} here or in shard-*/ to aggregate")
    results: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int], Path] = {}
    for path in paths:
        for r in read_results(path):
            key = (r["dataset"], r["id"], r["pass"])
            if key in seen:
                raise DataFormatError(path, None, "id", f"{key} is also in {seen[key]}: shards overlap")
            seen[key] = path
            results.append(r)
    # k and the expected question counts come from the config.json beside each results file
    configs = [json.loads(c.read_text()) for c in (p.parent / "config.json" for p in paths) if c.exists()]
    ks = {int(c["k"]) for c in configs if c.get("k")}
    if len(ks) > 1:
        raise AsearchError(
            f"{out_dir}: results made with different k {sorted(ks)}; aggregate them separately"
        )
    k = ks.pop() if ks else max(r["pass"] for r in results) + 1
    expected: Counter[str] | None = None
    expected_sources: Counter[str] | None = None
    if configs and len(configs) == len(paths):
        expected = sum((Counter(c.get("datasets") or {}) for c in configs), Counter())
        # runs written before per-source counts existed: their sources are their datasets
        expected_sources = sum(
            (Counter(c.get("data_sources", c.get("datasets")) or {}) for c in configs), Counter()
        )
    summary = summarize(results, k=k, expected=expected, expected_sources=expected_sources)
    summary["other_results"] = 0
    # what the run measured while it ran (tool calls, web costs, the tool record) is not in the results: kept
    previous = _read_summary(out_dir / "summary.json")
    if previous.get("run_metrics"):
        summary["run_metrics"] = previous["run_metrics"]
    atomic_write_json(out_dir / "summary.json", summary)
    markdown = render_markdown(summary, title=f"Evaluation: {out_dir}", counters_of=AGGREGATED_COUNTERS)
    atomic_write_text(out_dir / "summary.md", markdown)
    return EvalSummary(out_dir=out_dir, summary=summary, resumed=len(results))


# --------------------------------------------------------------------------- the agent as a solve function


def workflow_solver(
    workflow: SearchAgentWorkflow, engine: Engine, *, metrics: Callable[[], Mapping[str, float]] | None = None
) -> Solve:
    """A `solve` that runs `workflow` (a `SearchAgentWorkflow`) on the record with the pass's seed. An episode
    the workflow rejects counts as a failed question (not scored, retried by the next run)."""

    async def solve(record: QARecord, seed: int) -> Any:
        traj = await workflow.arun_episode(
            engine,
            record,
            seed=seed,
            trajectory_id=f"{record.dataset}/{record.id}/seed{seed}",
            metadata={"dataset": record.dataset, "question_id": record.id},
        )
        if traj is None:
            raise AsearchError(f"the workflow rejected the episode (rejections so far: {dict(workflow.rejected)})")
        return traj

    if metrics is not None:
        solve.metrics = metrics  # type: ignore[attr-defined]
    return solve


def agent_solver(engine: Engine, tokenizer: Tokenizer, tools: Mapping[str, Any], agent_cfg: Any) -> Solve:
    """`workflow_solver` over the search agent with `tools`; its `metrics()` are the tools' run counters
    (web cache and cost, injected faults, answers recorded or replayed; {} for local tools that do none)."""
    from asearch.agent.workflow import SearchAgentWorkflow
    from asearch.tools.build import tool_metrics

    workflow = SearchAgentWorkflow(tokenizer, tools, agent_cfg)
    return workflow_solver(
        workflow, engine, metrics=lambda: tool_metrics(tools)
    )


# --------------------------------------------------------------------------- in memory (held-out curves)


@dataclass
class EpisodeScores:
    """The episodes of one in-memory evaluation, one per record (None: rejected by the workflow)."""

    trajectories: list[Any]

    @property
    def masked(self) -> int:
        """Episodes that met an infrastructure fault (`Trajectory.met_infra_fault`), left out of `mean_score`."""
        return sum(1 for t in self.trajectories if t is not None and t.met_infra_fault)

    @property
    def mean_score(self) -> float:
        """The mean answer metric (`Trajectory.score`: the workflow's reward metric) over the episodes that met
        no infrastructure fault; a rejected episode counts 0."""
        kept = [t for t in self.trajectories if t is None or not t.met_infra_fault]
        return sum((t.score or 0.0) if t is not None else 0.0 for t in kept) / max(len(kept), 1)


async def evaluate_workflow(workflow: RolloutWorkflow, engine: Engine, records: Sequence[Any], *, concurrency: int = 64) -> EpisodeScores:
    """One episode per record through `workflow` (at most `concurrency` at once), kept in memory: the
    held-out curve during RL and the demo's before/after accuracy (greedy when the workflow's agent is)."""
    from asearch.agent.workflow import run_workflow

    return EpisodeScores(await run_workflow(workflow, engine, records, concurrency=concurrency))
