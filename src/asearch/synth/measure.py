"""Measure how hard synthesised questions are: a tool-less model answering directly vs. a search agent.

All runs go through the eval runner on the same records (read with `load_dataset`, so this also shows
the output feeds `asearch eval` as it is), scored with the same EM/F1/CEM, each resumable in its own
sub-directory of `out`:

- `direct/`: the tool-less model (SmolLM2-135M-Instruct by default), one greedy answer per question;
- `agent/`: the search agent over the questions' corpus with the real BM25 search tool, either
  `agent="expert"` (the oracle of `asearch.synth.expert`: knows the hops, must read every value; graph
  questions only) or `agent="model"` (an LLM agent, e.g. a trained checkpoint via `agent_model`);
- `measure.json` / `measure.md`: the numbers, plus how often one BM25 search with the question text
  already returns a statement's page (context for how much searching the questions need).

    asearch synth measure runs/synth/world0/questions.jsonl --out runs/synth/world0/measure
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from asearch.files import atomic_write_json, atomic_write_text
from asearch.synth.config import SolverConfig
from asearch.synth.solver import clean_answer


@dataclass
class DirectAnswer:
    """The eval runner's view of one tool-less answer (it reads `.answer`, `.turns` and `.finish`)."""

    answer: str
    turns: list[Any] = field(default_factory=list)
    finish: str = "answer"
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class MeasureSettings:
    """What `measure_difficulty` runs; the CLI's `asearch synth measure` options map onto these."""

    dataset: str
    out: Path
    limit: int | None = None  # None: every question
    direct_model: str = "smollm2-135m-instruct"
    agent: Literal["expert", "model"] = "expert"
    agent_model: str = "smollm2-135m-instruct"  # agent="model": the policy; agent="expert": its tokenizer
    corpus: str | None = None  # default: the corpus the records name
    agent_style: str = "asearcher"
    # Scaffolding for models that do not follow the action format on their own: the k-th act turn
    # opens with act_prefixes[k] (the last repeats), e.g. ("<search>", "<answer>") = search once, answer.
    act_prefixes: tuple[str, ...] = ()
    max_turns: int = 8
    max_new_tokens: int = 256
    max_context_tokens: int = 4096
    topk: int = 5
    concurrency: int = 32
    threads: int = 1
    skip_agent: bool = False


async def measure_difficulty(s: MeasureSettings, *, log: Any = print) -> dict[str, Any]:
    """Run the solvers and write `measure.json` / `measure.md` into `s.out`; returns the numbers."""
    import torch

    from asearch.eval import load_dataset

    torch.set_num_threads(s.threads)
    records = load_dataset(s.dataset, limit=s.limit, name="synth")
    corpora = sorted({str(r.metadata.get("corpus")) for r in records if r.metadata.get("corpus")})
    corpus = s.corpus or (corpora[0] if len(corpora) == 1 else None)
    log(f"measure: {len(records)} questions from {s.dataset} (corpus {corpus}) -> {s.out}")
    results: dict[str, Any] = {"dataset": str(s.dataset), "questions": len(records), "corpus": corpus}

    t0 = time.perf_counter()
    summary = await _direct(s, records)
    results["direct"] = _numbers(summary, s.direct_model, time.perf_counter() - t0)
    log(f"  tool-less {s.direct_model}: EM {results['direct']['em']:.3f}, F1 {results['direct']['f1']:.3f}")

    if corpus is not None and all(r.metadata.get("statements") for r in records):
        results["retrieval"] = evidence_recall(records, corpus, s.topk)
        log(f"  evidence in top-{s.topk} for the question text: {results['retrieval']}")

    if not s.skip_agent:
        if corpus is None:
            raise ValueError(f"records name corpora {corpora}: give the corpus the agent should search")
        t0 = time.perf_counter()
        if s.agent == "expert":
            summary, settings = await _expert_agent(s, records, corpus)
            name = "oracle expert (asearch.synth.expert)"
        else:
            summary, settings = await _model_agent(s, records, corpus)
            name = s.agent_model
        results["agent"] = _numbers(summary, name, time.perf_counter() - t0)
        results["agent"]["settings"] = settings
        log(f"  search agent {name}: EM {results['agent']['em']:.3f}, F1 {results['agent']['f1']:.3f}")
    s.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(s.out / "measure.json", results)
    atomic_write_text(s.out / "measure.md", render_measure(results))
    return results


async def _direct(s: MeasureSettings, records: list[Any]) -> Any:
    """The tool-less model: one greedy direct answer per question, with the difficulty gate's prompt."""
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams
    from asearch.eval import evaluate_async

    direct_cfg = SolverConfig(engine={"model": s.direct_model})
    engine_cfg = InProcessEngineConfig(threads=s.threads, max_batch=64, max_seq_len=s.max_context_tokens)
    engine = InProcessEngine.from_pretrained(s.direct_model, cfg=engine_cfg)
    stop_ids = [engine.tokenizer.eos_token_id] if engine.tokenizer.eos_token_id is not None else []

    async def direct(record: Any, seed: int) -> DirectAnswer:
        messages = [
            {"role": "system", "content": direct_cfg.system_prompt},
            {"role": "user", "content": record.question},
        ]
        sampling = SamplingParams(temperature=0.0, max_new_tokens=32, stop=["\n"], stop_token_ids=stop_ids)
        response = await engine.generate(GenerateRequest(messages=messages, sampling=sampling))
        return DirectAnswer(clean_answer(response.text))

    try:
        return await evaluate_async(
            direct, records, out_dir=s.out / "direct", concurrency=s.concurrency, progress=False,
            config={"direct_model": s.direct_model, "prompt": direct_cfg.system_prompt},
        )  # fmt: skip
    finally:
        await engine.close()


async def _expert_agent(s: MeasureSettings, records: list[Any], corpus: str) -> tuple[Any, dict[str, Any]]:
    """The oracle expert through the real agent loop and BM25 search tool (deterministic, no model)."""
    from asearch.agent import AgentConfig
    from asearch.agent.expert import WORLD_STYLE
    from asearch.agent.runtime import Runtime
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.eval import agent_solver, evaluate_async
    from asearch.models.loading import load_tokenizer
    from asearch.synth.expert import synth_expert
    from asearch.tools import ToolsConfig, build_tools
    from asearch.tools.search import SearchToolConfig

    expert, unplanned = synth_expert(
        {"question": r.question, "answer": r.golds, **r.metadata} for r in records
    )
    tools, closers = build_tools(
        ToolsConfig(corpus=corpus, search=SearchToolConfig(topk=s.topk), access=None), progress=False
    )
    tokenizer = load_tokenizer(s.agent_model)
    agent_cfg = AgentConfig(
        style="search-r1", style_options=WORLD_STYLE, max_turns=s.max_turns, max_new_tokens=64,
        max_context_tokens=100_000, temperature=0.0,
    )  # fmt: skip
    runtime = Runtime(ScriptedEngine(tokenizer, expert), tokenizer, tools, agent_cfg, closers)
    settings = {
        "agent": "expert",
        "topk": s.topk,
        "max_turns": s.max_turns,
        "questions_without_plan": unplanned,
    }
    try:
        summary = await evaluate_async(
            agent_solver(runtime.engine, tokenizer, tools, agent_cfg),
            records, out_dir=s.out / "agent", concurrency=s.concurrency, progress=False, config=settings,
        )  # fmt: skip
    finally:
        await runtime.close()
    return summary, settings


async def _model_agent(s: MeasureSettings, records: list[Any], corpus: str) -> tuple[Any, dict[str, Any]]:
    """An LLM search agent (in process) with the asearch runtime's tools."""
    from asearch.agent.loop import AgentConfig
    from asearch.agent.runtime import RuntimeConfig, build_runtime
    from asearch.engine.local.inprocess import InProcessEngineConfig
    from asearch.engine.registry import EngineConfig
    from asearch.eval import agent_solver, evaluate_async
    from asearch.tools import ToolsConfig
    from asearch.tools.search import SearchToolConfig

    engine_cfg = InProcessEngineConfig(threads=s.threads, max_batch=64, max_seq_len=s.max_context_tokens)
    runtime_cfg = RuntimeConfig(
        engine=EngineConfig(model=s.agent_model, inprocess=engine_cfg),
        tools=ToolsConfig(corpus=corpus, search=SearchToolConfig(topk=s.topk)),
        agent=AgentConfig(
            style=s.agent_style,
            style_options={"act_prefixes": list(s.act_prefixes)} if s.act_prefixes else {},
            max_turns=s.max_turns,
            max_new_tokens=s.max_new_tokens,
            max_context_tokens=s.max_context_tokens,
            temperature=0.0,
        ),
    )
    runtime = build_runtime(runtime_cfg, progress=False)
    try:
        summary = await evaluate_async(
            agent_solver(runtime.engine, runtime.tokenizer, runtime.tools, runtime.agent_cfg),
            records, out_dir=s.out / "agent", concurrency=s.concurrency, progress=False,
            config={"runtime": runtime_cfg.model_dump(mode="json")},
        )  # fmt: skip
    finally:
        await runtime.close()
    settings = {"agent": "model", "style": s.agent_style, "act_prefixes": list(s.act_prefixes),
                "max_turns": s.max_turns, "topk": s.topk}  # fmt: skip
    return summary, settings


def evidence_recall(records: list[Any], corpus: str, topk: int) -> dict[str, float]:
    """Share of statement pages among the top-k BM25 hits of the question text, and of questions with any.

    One search with the question as typed: context for how far a single search gets, not an agent score
    (a page in the hits is not the answer read: hidden entities still have to be followed).
    """
    from asearch.retrieval.index import IndexConfig, open_index
    from asearch.tools import ensure_index

    index = open_index(ensure_index(corpus, IndexConfig(), progress=False))
    hits = index.retriever("bm25").search([r.question for r in records], topk)
    found = total = anyhit = 0
    for r, h in zip(records, hits, strict=True):
        urls = {x.passage.url for x in h}
        wanted = {st["url"] for st in r.metadata["statements"]}
        found += len(wanted & urls)
        total += len(wanted)
        anyhit += bool(wanted & urls)
    return {
        "statement_pages_found": round(found / max(total, 1), 4),
        "questions_with_a_hit": round(anyhit / len(records), 4),
    }


def _numbers(summary: Any, model: str, wall_s: float) -> dict[str, Any]:
    group = summary.datasets["synth"]
    metrics = group["metrics"]
    return {
        "model": model,
        "em": metrics["em"]["avg_at_k"]["mean"],
        "f1": metrics["f1"]["avg_at_k"]["mean"],
        "cem": metrics["cem"]["avg_at_k"]["mean"],
        "em_ci95": [metrics["em"]["avg_at_k"].get("low"), metrics["em"]["avg_at_k"].get("high")],
        "wall_s": round(wall_s, 1),
    }


def render_measure(r: dict[str, Any]) -> str:
    """measure.json as a markdown table."""
    lines = [
        "# Difficulty of synthesised questions",
        "",
        f"{r['questions']} questions from `{r['dataset']}` (corpus `{r['corpus']}`).",
        "",
        "| solver | model | EM | EM 95% CI | F1 | CEM | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in (("direct", "tool-less, one greedy answer"), ("agent", "search agent (BM25 tool)")):
        if key in r:
            x = r[key]
            ci = "–" if None in x["em_ci95"] else f"[{x['em_ci95'][0]:.3f}, {x['em_ci95'][1]:.3f}]"
            lines.append(
                f"| {label} | `{x['model']}` | {x['em']:.3f} | {ci} | {x['f1']:.3f} | {x['cem']:.3f} | {x['wall_s']} |"
            )
    if "agent" in r and "questions_without_plan" in r["agent"]["settings"]:
        lines += ["", f"The expert had no plan for {r['agent']['settings']['questions_without_plan']} questions "
                  "(no entity named in the text); they count as failures."]  # fmt: skip
    if "retrieval" in r:
        x = r["retrieval"]
        lines += [
            "",
            f"One BM25 search with the question text finds {100 * x['statement_pages_found']:.1f}% of the statement "
            f"pages in its top results; {100 * x['questions_with_a_hit']:.1f}% of questions get at least one.",
        ]
    return "\n".join(lines) + "\n"
