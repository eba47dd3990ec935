"""Measure how hard synthesised questions are: a tool-less model answering directly vs. the search agent.

Both runs go through the eval runner on the same records (read with `load_dataset`, so this also
shows the output feeds `asearch eval` as it is), scored with the same EM/F1/CEM, each resumable in
its own sub-directory. Rerun with a trained agent (`agent_model=` its directory) to update the numbers:

    python -m asearch.synth.measure runs/synth/questions.jsonl --out runs/synth/measure --limit 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    dataset: str
    out: Path
    limit: int | None = 200
    direct_model: str = "smollm2-135m-instruct"
    agent_model: str = "smollm2-135m-instruct"
    corpus: str | None = None  # default: the corpus the records name
    agent_style: str = "asearcher"
    # Scaffolding for models that do not follow the action format on their own: the k-th act turn
    # opens with act_prefixes[k] (the last repeats), e.g. ("<search>", "<answer>") = search once, answer.
    act_prefixes: tuple[str, ...] = ()
    max_turns: int = 8
    max_new_tokens: int = 256
    max_context_tokens: int = 4096
    topk: int = 3
    concurrency: int = 32
    threads: int = 1
    skip_agent: bool = False


async def measure_difficulty(s: MeasureSettings, *, log: Any = print) -> dict[str, Any]:
    """Run both solvers and write `measure.json` / `measure.md` into `s.out`; returns the numbers."""
    import torch

    from asearch.agent.loop import AgentConfig
    from asearch.agent.runtime import EngineConfig, RuntimeConfig, ToolsConfig, build_runtime
    from asearch.engine.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams
    from asearch.eval import agent_solver, evaluate_async, load_dataset
    from asearch.tools.search import SearchToolConfig

    torch.set_num_threads(s.threads)
    records = load_dataset(s.dataset, limit=s.limit, name="synth")
    corpora = sorted({str(r.metadata.get("corpus")) for r in records if r.metadata.get("corpus")})
    corpus = s.corpus or (corpora[0] if len(corpora) == 1 else None)
    log(f"measure: {len(records)} questions from {s.dataset} (corpus {corpus}) -> {s.out}")
    results: dict[str, Any] = {"dataset": s.dataset, "questions": len(records), "corpus": corpus}
    engine_cfg = InProcessEngineConfig(threads=s.threads, max_batch=64, max_seq_len=s.max_context_tokens)

    # ---- 1. the tool-less model: one greedy direct answer per question
    t0 = time.perf_counter()
    direct_cfg = SolverConfig(model=s.direct_model)
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
        summary = await evaluate_async(
            direct, records, out_dir=s.out / "direct", concurrency=s.concurrency, progress=False,
            config={"direct_model": s.direct_model, "prompt": direct_cfg.system_prompt},
        )  # fmt: skip
    finally:
        await engine.close()
    results["direct"] = _numbers(summary, s.direct_model, time.perf_counter() - t0)
    log(f"  tool-less {s.direct_model}: EM {results['direct']['em']:.3f}, F1 {results['direct']['f1']:.3f}")

    # ---- 2. the search agent over the questions' corpus
    if not s.skip_agent:
        if corpus is None:
            raise ValueError(f"records name corpora {corpora}: give the corpus the agent should search")
        t0 = time.perf_counter()
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
        results["agent"] = _numbers(summary, s.agent_model, time.perf_counter() - t0)
        results["agent"]["settings"] = {
            "style": s.agent_style,
            "act_prefixes": list(s.act_prefixes),
            "max_turns": s.max_turns,
            "topk": s.topk,
        }
        log(f"  search agent {s.agent_model}: EM {results['agent']['em']:.3f}, F1 {results['agent']['f1']:.3f}")
    s.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(s.out / "measure.json", results)
    atomic_write_text(s.out / "measure.md", render_measure(results))
    return results


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
    lines = [
        "# Difficulty of synthesised questions",
        "",
        f"{r['questions']} questions from `{r['dataset']}` (corpus `{r['corpus']}`).",
        "",
        "| solver | model | EM | F1 | CEM | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (("direct", "tool-less, one greedy answer"), ("agent", "search agent (tools)")):
        if key in r:
            x = r[key]
            lines.append(
                f"| {label} | `{x['model']}` | {x['em']:.3f} | {x['f1']:.3f} | {x['cem']:.3f} | {x['wall_s']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset", help="questions.jsonl of a synthesis run (or any dataset spec)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--direct-model", default="smollm2-135m-instruct")
    ap.add_argument("--agent-model", default="smollm2-135m-instruct")
    ap.add_argument("--corpus", default=None, help="corpus the agent searches (default: the records' own)")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-agent", action="store_true")
    ap.add_argument(
        "--act-prefixes",
        default="",
        help="comma-separated openings of the agent's act turns, e.g. '<search>,<answer>' (search once, answer)",
    )
    a = ap.parse_args(argv)
    settings = MeasureSettings(
        dataset=a.dataset, out=a.out, limit=a.limit, direct_model=a.direct_model, agent_model=a.agent_model,
        corpus=a.corpus, max_turns=a.max_turns, topk=a.topk, concurrency=a.concurrency, threads=a.threads,
        skip_agent=a.skip_agent, act_prefixes=tuple(p for p in a.act_prefixes.split(",") if p),
    )  # fmt: skip
    print(json.dumps(asyncio.run(measure_difficulty(settings)), indent=2))


if __name__ == "__main__":
    main()
