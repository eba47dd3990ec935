"""The eval job behind `asearch eval`, as one library call: `run_eval(cfg)`.

It loads the datasets, builds the agent runtime (and, with `eval.judge.local`, the judge's own server),
evaluates every (question, pass) not yet in the run directory and writes the summaries; resuming, sharding
and the identity check are `evaluate_async`'s. The command only turns its flags into an `EvalRunConfig`
and prints what comes back; tests and scripts call `run_eval` directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field
from rich.console import Console
from rich.markup import escape

from asearch.agent import runtime as agent_runtime
from asearch.agent.openai_workflow import WorkflowConfig
from asearch.agent.runtime import Runtime, RuntimeConfig, apply_model_style_default
from asearch.config import dump_config
from asearch.eval.config import EvalConfig, build_judge, default_out_dir, local_judge_server
from asearch.eval.datasets import QARecord, load_dataset
from asearch.eval.runner import EvalSummary, Solve, agent_solver, evaluate_async, parse_shard, workflow_solver
from asearch.tools import ToolsConfig, close_all, tool_metrics
from asearch.tools.replay import RECORD_DIR

Say = Callable[[str], None]  # prints one line of rich markup


class EvalRunConfig(RuntimeConfig):
    """The YAML shape of `asearch eval -c`: the runtime's engine/tools/agent plus an `eval:` section."""

    eval: EvalConfig = Field(default_factory=EvalConfig)
    workflow: WorkflowConfig = Field(
        default_factory=WorkflowConfig, description="Which agent answers: asearch's own (search_agent) or an "
        "OpenAI-client agent function (openai_agent, docs/agents-openai.md).",
    )  # fmt: skip


@dataclass
class EvalJob:
    """What `run_eval` did: the run directory, the questions, and the summary (None when there were no
    questions and `allow_empty` let that pass)."""

    run_dir: Path
    records: list[QARecord]
    summary: EvalSummary | None = None


def run_eval(
    cfg: EvalRunConfig, *, allow_empty: bool = False, progress: bool = False, console: Console | None = None
) -> EvalJob:
    """Evaluate the agent `cfg` describes on `cfg.eval.datasets` into `cfg.eval.out` (resumable: run it again
    to continue). Lines for the user (what runs, warnings, the judge's url) go to `console` (stderr)."""
    say: Say = (console or Console(stderr=True)).print
    cfg = resolved(cfg, say)
    e = cfg.eval
    run_dir = e.out or default_out_dir(e.datasets)
    records = load_records(e, allow_empty=allow_empty)
    say(f"[bold]eval[/bold] {len(records)} questions from {', '.join(map(escape, e.datasets))}; k={e.k}, "
        f"shard {e.shard}, concurrency {e.concurrency} -> {escape(str(run_dir))}")  # fmt: skip
    if not records:  # an empty dataset is what was asked for, and there is nothing to run
        say("no questions to evaluate (--allow-empty): nothing was run")
        return EvalJob(run_dir, records)
    warn_corpus_mismatch(records, cfg.tools, say)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "eval_config.yaml")
    runtime_cfg = RuntimeConfig.model_validate(cfg.model_dump(include={"engine", "tools", "agent"}))
    runtime = agent_runtime.build_runtime(runtime_cfg, progress=progress, record_dir=run_dir / RECORD_DIR)
    # judge.local: the judge model's own server, healthy before the first question, stopped after the runtime
    with local_judge_server(e.judge, log_path=run_dir / "judge_server.log") as judge_url:
        if judge_url:
            say(f"judge: {escape(e.judge.model_name)} served at {escape(judge_url)} "
                f"(log: {escape(str(run_dir / 'judge_server.log'))})")  # fmt: skip
        summary = asyncio.run(_evaluate(cfg, runtime, records, run_dir, judge_url=judge_url, progress=progress))
    return EvalJob(run_dir, records, summary)


def resolved(cfg: EvalRunConfig, say: Say) -> EvalRunConfig:
    """A copy of `cfg` with the defaults that depend on other keys filled in (the model's agent style,
    greedy decoding for one pass)."""
    cfg = cfg.model_copy(deep=True)
    if note := apply_model_style_default(cfg):
        say(f"[dim]{escape(note)}[/dim]")
    greedy_when_one_pass(cfg)
    return cfg


def greedy_when_one_pass(cfg: EvalRunConfig) -> None:
    """One pass per question (k=1) scores one sample, so it decodes greedily unless the config sets
    `agent.temperature`; with k > 1 the agent's own default (1.0) samples k different answers for Pass@k."""
    if cfg.eval.k == 1 and "temperature" not in cfg.agent.model_fields_set:
        cfg.agent.temperature = 0.0


def load_records(e: EvalConfig, *, allow_empty: bool) -> list[QARecord]:
    records: list[QARecord] = []
    for spec in e.datasets:
        records += load_dataset(spec, split=e.split, data_dir=e.data_dir, limit=e.limit, allow_empty=allow_empty)
    return records


def warn_corpus_mismatch(records: list[QARecord], tools_cfg: ToolsConfig, say: Say) -> None:
    """Built-in questions name the corpus they are about; searching another corpus cannot answer them."""
    if tools_cfg.index is not None or tools_cfg.server_url is not None:
        return  # cannot tell what a prebuilt index or a server holds
    wanted = sorted({r.metadata["corpus"] for r in records if isinstance(r.metadata.get("corpus"), str)})
    have = _canonical_corpus(tools_cfg.corpus)
    for corpus in wanted:
        if corpus != have:
            say(f"[yellow]warning[/yellow]: some questions are about corpus {escape(corpus)!s} but the tools search "
                f"{escape(str(tools_cfg.corpus))}; set tools.corpus={escape(corpus)}")  # fmt: skip


def _canonical_corpus(spec: str | None) -> str | None:
    """`world:1000` -> `world:seed=1000,entities=2000` (the name WorldCorpus reports); others unchanged."""
    if not spec or not (spec == "world" or spec.startswith("world:")):
        return spec
    from asearch.corpus.sources import parse_world_spec
    from asearch.corpus.world.source import WorldCorpus

    return WorldCorpus(**parse_world_spec(spec)).name  # type: ignore[arg-type]


async def _evaluate(
    cfg: EvalRunConfig, runtime: Runtime, records: list[QARecord], run_dir: Path, *, judge_url: str | None,
    progress: bool,
) -> EvalSummary:  # fmt: skip
    """Every (question, pass) not yet on disk; the runtime and the judge's client are closed however it ends."""
    e = cfg.eval
    closers: list[Callable[[], Any]] = [runtime.close]
    try:
        llm_judge, judge_client = build_judge(e.judge, url=judge_url)
        if close_judge := getattr(judge_client, "aclose", None) or getattr(judge_client, "close", None):
            closers.append(close_judge)
        solver, identity = make_solver(cfg, runtime)
        return await evaluate_async(
            solver, records, out_dir=run_dir, k=e.k, seeds=e.seeds, concurrency=e.concurrency,
            shard=parse_shard(e.shard), judge=llm_judge, progress=progress,
            config=identity,  # the agent's identity: resuming into this dir with another engine/tools/agent is refused
            max_failures=e.max_failures,
        )  # fmt: skip
    finally:
        await close_all(closers)


def make_solver(cfg: EvalRunConfig, runtime: Runtime) -> tuple[Solve, dict[str, Any]]:
    """What answers each question (asearch's agent loop, or the configured OpenAI-client agent's workflow) and
    the identity a resumed run must match."""
    runtime_cfg = RuntimeConfig.model_validate(cfg.model_dump(include={"engine", "tools", "agent"}))
    identity = {"runtime": runtime_cfg.model_dump(mode="json"), "judge": cfg.eval.judge.model_dump(mode="json")}
    if cfg.workflow.kind == "search_agent":
        return agent_solver(runtime.engine, runtime.tokenizer, runtime.tools, runtime.agent_cfg), identity
    from asearch.agent.openai_workflow import make_workflow

    workflow = make_workflow(cfg.workflow, runtime.tokenizer, runtime.tools, runtime.agent_cfg)
    solver = workflow_solver(workflow, runtime.engine, metrics=lambda: tool_metrics(runtime.tools))  # type: ignore[arg-type]
    return solver, identity | {"workflow": cfg.workflow.model_dump(mode="json")}
