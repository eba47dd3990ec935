"""Masked questions in evaluation: a question one of whose passes met an infrastructure fault is left out of the
metrics and reported apart (counts by kind, the metrics with its faulted passes as 0); then a real eval run of
the scripted world expert with 20% injected tool faults."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from asearch.eval.report import render_markdown, summarize
from asearch.eval.runner import EpisodeScores, aggregate_only, read_results


def _line(qid: str, p: int, em: float, faults: dict[str, int] | None = None) -> dict:
    return {"id": qid, "dataset": "d", "pass": p, "seed": p, "em": em, "f1": em, "cem": em,
            "prediction": "x", "counters": {}, "infra_faults": faults or {}}  # fmt: skip


def test_a_question_with_a_faulted_pass_is_masked_and_reported_apart() -> None:
    results = [
        _line("q1", 0, 1.0), _line("q1", 1, 1.0),
        _line("q2", 0, 0.0, {"timeout": 1, "remote": 1}), _line("q2", 1, 1.0),  # masked, though it scored once
        _line("q3", 0, 0.0), _line("q3", 1, 1.0),
        {k: v for k, v in _line("q4", 0, 1.0).items() if k != "infra_faults"}, _line("q4", 1, 0.0),  # older lines
    ]  # fmt: skip
    s = summarize(results, k=2)["datasets"]["d"]
    assert s["n"] == 3 and s["incomplete"] == 0
    assert s["metrics"]["em"]["avg_at_k"]["mean"] == pytest.approx((1 + 0.5 + 0.5) / 3)  # q1, q3, q4
    m = s["masked"]
    assert (m["questions"], m["episodes"]) == (1, 1)
    assert m["episodes_by_kind"] == {"remote": 1, "timeout": 1} and m["faults"] == {"remote": 1, "timeout": 1}
    # for comparison: every question, the faulted pass scored 0
    assert m["metrics_as_zero"]["em"]["avg_at_k"]["mean"] == pytest.approx((1 + 0.5 + 0.5 + 0.5) / 4)
    assert m["metrics_as_zero"]["em"]["pass_at_k"]["mean"] == pytest.approx(1.0)
    md = render_markdown(summarize(results, k=2))
    assert (
        "- d: 1 question(s), 1 episode(s) (remote 1, timeout 1); EM Avg@2 with their faulted passes as 0: 62.5"
        in md
    )


def test_nothing_masked_reports_zeros_and_no_line() -> None:
    s = summarize([_line("q1", 0, 1.0)], k=1)
    assert s["overall"]["masked"] == {"questions": 0, "episodes": 0, "episodes_by_kind": {}, "faults": {},
                                      "metrics_as_zero": None}  # fmt: skip
    assert "Masked" not in render_markdown(s)


def test_held_out_scores_leave_masked_episodes_out() -> None:
    from asearch.agent.trajectory import Trajectory

    def t(score: float, faults: dict | None = None) -> Trajectory:
        return Trajectory(id="t", question="q", style="x", score=score, infra_faults=faults or {})

    scores = EpisodeScores([t(1.0), t(0.0), t(0.0, {"remote": 1}), None])
    assert scores.masked == 1 and scores.mean_score == pytest.approx(1 / 3)  # the rejection still counts 0


# --------------------------------------------------------------------------- a real run with 20% faults

WORLD = "world:seed=1,entities=200"


def test_a_real_eval_run_with_20_percent_tool_faults_scores_clean_questions_only(tmp_path) -> None:
    from asearch.agent.expert import WORLD_STYLE, WorldExpert, plan_from_record
    from asearch.agent.loop import AgentConfig
    from asearch.corpus.world import WorldCorpus
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.eval.datasets import load_dataset
    from asearch.eval.runner import agent_solver, evaluate_async
    from asearch.models.tiny import train_bpe_tokenizer
    from asearch.tools import ToolsConfig, build_tools

    records = load_dataset(f"{WORLD},n=40,hops=1-2")
    tok = train_bpe_tokenizer(
        (d.title + "\n" + d.text for d in WorldCorpus(1, 200).documents()), vocab_size=400
    )
    faults = {"timeout": 0.07, "server_error": 0.07, "garbage": 0.06, "seed": 0}
    tools, closers = build_tools(
        ToolsConfig.model_validate({"corpus": WORLD, "access": None, "faults": faults}), progress=False
    )
    expert = WorldExpert(
        {r.question: plan_from_record(r.model_dump()) for r in records}, p_skip=0.0, p_wrong=0.0
    )
    agent = AgentConfig(style="search-r1", style_options=WORLD_STYLE, max_turns=8, max_new_tokens=64)

    async def main():
        try:
            solve = agent_solver(ScriptedEngine(tok, expert), tok, tools, agent)
            return await evaluate_async(solve, records, out_dir=tmp_path, progress=False, concurrency=4)
        finally:
            for close in closers:
                if asyncio.iscoroutine(result := close()):
                    await result

    s = asyncio.run(main())
    assert s.written == len(records) and s.failed == 0
    results = read_results(tmp_path / "results.jsonl")
    faulted = [r for r in results if r["infra_faults"]]
    clean = [r for r in results if not r["infra_faults"]]
    o, run = s.overall, s.summary["run_metrics"]
    # every injected fault was met by one episode and recorded under its kind (a 503 is `remote`)
    met = Counter()
    for r in faulted:
        met.update(r["infra_faults"])
    injected = {k: int(run[f"faults/injected/{k}"]) for k in ("timeout", "server_error", "garbage")}
    assert sum(injected.values()) == run["faults/injected"] > 0
    assert met == Counter(
        {"timeout": injected["timeout"], "remote": injected["server_error"], "garbage": injected["garbage"]}
    )
    # scored: the clean questions only; masked: reported apart, and with them as 0 the accuracy is lower
    assert o["n"] == len(clean) and o["masked"]["questions"] == o["masked"]["episodes"] == len(faulted)
    em = o["metrics"]["em"]["avg_at_k"]["mean"]
    as_zero = o["masked"]["metrics_as_zero"]["em"]["avg_at_k"]["mean"]
    assert em == pytest.approx(sum(r["em"] for r in clean) / len(clean))
    assert as_zero == pytest.approx(sum(r["em"] for r in clean) / len(results)) and as_zero < em
    assert em > 0.8  # the expert answers what its search found: only the faulted questions go wrong
    md = (tmp_path / "summary.md").read_text()
    assert f"{len(clean)}/{len(records)}" in md and "Masked questions" in md and "Injected tool faults" in md
    assert aggregate_only(tmp_path).overall["masked"] == o["masked"]  # rebuilt from the result lines alone
    print(f"faults injected {injected} of {run['faults/calls']:.0f} calls; masked {len(faulted)}/{len(results)} "
          f"questions {dict(met)}; EM clean {em:.3f}, masked as 0 {as_zero:.3f}")  # fmt: skip
