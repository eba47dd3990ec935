"""Turn per-(question, pass) result lines into summary.json numbers and a summary.md table.

Metrics are computed over complete questions only (all k passes present); questions are ordered by
(dataset, id) before bootstrapping, so a summary depends on the results, not on the order they were
written in — a resumed run and an uninterrupted one give identical numbers.

A question one of whose passes met an infrastructure fault (a result line with `infra_faults`: a tool
timeout, 5xx or garbled answer) is masked: left out of the metrics and stats, whatever its scores, and
reported apart under `masked` with the metrics it would give if its faulted passes counted 0.

Besides per dataset and overall, results are summarised per `data_source` when a dataset merges several
(Search-R1's merged test set). With an LLM judge, each group counts where the judge and exact match agree.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from asearch.metrics.aggregate import Estimate, avg_at_k, bootstrap_mean, pass_at_k
from asearch.metrics.counters import tool_calls_text

__all__ = ["METRICS", "STAT_COUNTERS", "data_source_of", "render_markdown", "summarize", "tool_calls_text"]

METRICS = ("em", "f1", "cem")
STAT_COUNTERS = ("generated_tokens", "parse_errors", "tool_errors", "read_turns")
# The agent's own counters (agent/loop.py, agent/openai_session.py): every other counter of a record is one a tool
# published (its `counter`: searches, accesses, finds, ...), summarized and shown under that name.
AGENT_COUNTERS = frozenset(
    {"llm_calls", "generated_tokens", "read_turns", "compactions", "auto_closed", "parse_errors", "tool_errors",
     "prompt_mismatches", "agent_errors", "tool_calls", "tool_call_parse_errors"}
)  # fmt: skip


def tool_counters_of(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tools' counters in `records`, in the order they first appear."""
    return list(dict.fromkeys(c for r in records for c in (r.get("counters") or {}) if c not in AGENT_COUNTERS))


def _estimate(e: Estimate | None) -> dict[str, float] | None:
    return None if e is None else asdict(e)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _metrics(rows: Sequence[Sequence[Mapping[str, Any]]], score: Any = None) -> dict[str, Any]:
    """Avg@k and Pass@k of every metric over `rows` (one row of k result lines per question); `score(r, m)`
    reads a line's metric (default: `r[m]`)."""
    read = score or (lambda r, m: r[m])
    return {
        m: {
            "avg_at_k": _estimate(avg_at_k([[read(r, m) for r in row] for row in rows])),
            "pass_at_k": _estimate(pass_at_k([[read(r, m) for r in row] for row in rows])),
        }
        for m in METRICS
    }


def _masked(rows: Sequence[Sequence[Mapping[str, Any]]], masked: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """What masking left out of `rows` (all complete questions): masked questions and episodes, the episodes
    by the fault kinds they met, the faults by kind, and the metrics over every question with the faulted
    passes scored 0 (None when nothing is masked: they equal `metrics`)."""
    faulted = [r for row in masked for r in row if r.get("infra_faults")]
    by_kind: Counter[str] = Counter(kind for r in faulted for kind in r["infra_faults"])
    faults: Counter[str] = Counter()
    for r in faulted:
        faults.update(r["infra_faults"])
    as_zero = (lambda r, m: 0.0 if r.get("infra_faults") else r[m]) if masked else None
    return {
        "questions": len(masked),
        "episodes": len(faulted),
        "episodes_by_kind": dict(sorted(by_kind.items())),
        "faults": dict(sorted(faults.items())),
        "metrics_as_zero": _metrics(rows, as_zero) if masked else None,
    }


def _agreement(judged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The judge's verdict against exact match over the judged passes (a failed verdict is not one):
    counts of both right, judge only, EM only, both wrong, and agreement = (both right + both wrong) / all."""
    pairs = Counter((bool(r["judge"]["correct"]), r["em"] >= 1.0) for r in judged)
    counts = {
        "both_right": pairs[(True, True)],
        "judge_only": pairs[(True, False)],
        "em_only": pairs[(False, True)],
        "both_wrong": pairs[(False, False)],
    }
    agree = counts["both_right"] + counts["both_wrong"]
    return {**counts, "agreement": agree / len(judged) if judged else None}


def summarize_group(
    results: Sequence[Mapping[str, Any]], k: int, expected: int | None = None
) -> dict[str, Any]:
    """Summary of one dataset (or all pooled): metrics over questions that have all k passes and met no
    infrastructure fault (`n`); the masked ones under `masked`."""
    by_question: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for r in results:
        by_question[(r["dataset"], r["id"])][r["pass"]] = r
    complete = sorted(q for q, passes in by_question.items() if all(p in passes for p in range(k)))
    every = [[by_question[q][p] for p in range(k)] for q in complete]
    masked = [row for row in every if any(r.get("infra_faults") for r in row)]
    rows = [row for row in every if not any(r.get("infra_faults") for r in row)]
    out: dict[str, Any] = {
        "n": len(rows),
        "expected": expected,
        "incomplete": len(by_question) - len(complete),
        "k": k,
        "masked": _masked(every, masked),
    }
    used = [r for row in rows for r in row]
    if not rows:
        out.update(metrics=None, judge=None, stats=None, timing=None)
        return out

    out["metrics"] = _metrics(rows)

    judged_rows = [
        [r["judge"]["correct"] for r in row if r.get("judge") and r["judge"]["correct"] is not None]
        for row in rows
    ]
    any_judge = any(r.get("judge") for r in used)
    if any_judge:
        per_q = [row for row in judged_rows if row]
        failures = sum(1 for r in used if r.get("judge") and r["judge"]["correct"] is None)
        verdicts = [r["judge"] for r in used if r.get("judge")]
        out["judge"] = {
            # per question: the fraction of its judged passes the judge accepted (failed verdicts are
            # left out of that question's mean, and counted below); a question with none is left out
            "accuracy": _estimate(bootstrap_mean([sum(row) / len(row) for row in per_q])) if per_q else None,
            "pass_at_k": _estimate(bootstrap_mean([float(any(row)) for row in per_q])) if per_q else None,
            "judged": sum(len(row) for row in per_q),
            "failures": failures,
            "agreement": _agreement([r for r in used if (r.get("judge") or {}).get("correct") is not None]),
            # lines judged before these were recorded carry neither; a resumed run may mix several
            "models": sorted({v["model"] for v in verdicts if v.get("model")}),
            "prompt_versions": sorted({v["prompt_version"] for v in verdicts if v.get("prompt_version")}),
        }
    else:
        out["judge"] = None

    counters, tools = [r.get("counters") or {} for r in used], tool_counters_of(used)
    out["stats"] = {
        "runs": len(used),
        "turns": _mean([r.get("num_turns", 0) for r in used]),
        **{c: _mean([float(cs.get(c, 0)) for cs in counters]) for c in (*tools, *STAT_COUNTERS)},
        "tool_counters": tools,
        "no_answer_rate": _mean([float(r.get("prediction") is None) for r in used]),
        "finish": dict(sorted(Counter(str(r.get("finish")) for r in used).items())),
    }
    walls = [float(r.get("wall_s", 0.0)) for r in used]
    out["timing"] = {"wall_s_mean": _mean(walls), "wall_s_total": math.fsum(walls)}
    return out


def data_source_of(result: Mapping[str, Any]) -> str:
    """The source a result line is summarised under: its `data_source`, else (older lines) its dataset."""
    return result.get("data_source") or result["dataset"]


def _grouped(
    results: Sequence[Mapping[str, Any]], key: Any, k: int, expected: Mapping[str, int] | None
) -> dict[str, Any]:
    """{name: summary} over the groups `key(result)` makes, names sorted (expected ones included)."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    names = sorted(set(groups) | set(expected or {}))
    return {n: summarize_group(groups.get(n, []), k, (expected or {}).get(n)) for n in names}


def summarize(
    results: Iterable[Mapping[str, Any]],
    *,
    k: int,
    expected: Mapping[str, int] | None = None,
    expected_sources: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """{"k", "datasets": {name: summary}, "overall": all questions pooled}, plus "data_sources": {name:
    summary} when some question's source differs from its dataset.

    `data_sources` groups by each line's `data_source` (`data_source_of`): the per-source breakdown of a
    file that merges several sources (Search-R1's merged test set); absent, it would equal `datasets`.
    `expected` / `expected_sources` are the question counts per dataset / per source.
    """
    results = list(results)
    out: dict[str, Any] = {"k": k, "datasets": _grouped(results, lambda r: r["dataset"], k, expected)}
    same = all(data_source_of(r) == r["dataset"] for r in results)
    if not same or (expected_sources is not None and dict(expected_sources) != dict(expected or {})):
        out["data_sources"] = _grouped(results, data_source_of, k, expected_sources)
    total = sum(expected.values()) if expected else None
    out["overall"] = summarize_group(results, k, total)
    return out


# --------------------------------------------------------------------------- markdown


def _pct(e: Mapping[str, float] | None) -> str:
    if not e:
        return "–"
    return f"{100 * e['mean']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _table(rows: Sequence[tuple[str, Mapping[str, Any]]], k: int, first: str) -> list[str]:
    """The metrics table: one row per (name, summary)."""
    lines = [
        f"| {first} | n | EM Avg@{k} | F1 Avg@{k} | CEM Avg@{k} | EM Pass@{k} | F1 Pass@{k} | judge acc. "
        "| judge fail. | turns | tool calls | gen. tokens | parse err. | no answer % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in rows:
        n = f"{s['n']}" + (f"/{s['expected']}" if s.get("expected") not in (None, s["n"]) else "")
        m = s.get("metrics") or {}
        j = s.get("judge") or {}
        st = s.get("stats") or {}
        no_answer = st.get("no_answer_rate")
        cells = [
            str(name),
            n,
            _pct((m.get("em") or {}).get("avg_at_k")),
            _pct((m.get("f1") or {}).get("avg_at_k")),
            _pct((m.get("cem") or {}).get("avg_at_k")),
            _pct((m.get("em") or {}).get("pass_at_k")),
            _pct((m.get("f1") or {}).get("pass_at_k")),
            _pct(j.get("accuracy")) if j else "–",
            str(j.get("failures", "–")) if j else "–",
            _num(st.get("turns"), 1),
            tool_calls_text(st),
            _num(st.get("generated_tokens"), 0),
            _num(st.get("parse_errors"), 2),
            "–" if no_answer is None else f"{100 * no_answer:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _with_pooled(groups: Mapping[str, Any], overall: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, summary) table rows, then the pooled row when there are several."""
    rows = [*groups.items()]
    return [*rows, ("**all**", overall)] if len(rows) > 1 else rows


# whose tool counters an aggregation shows: it calls no tool, so they are those the last evaluating run kept
AGGREGATED_COUNTERS = "the last evaluation run"


def render_markdown(summary: Mapping[str, Any], *, title: str = "Evaluation", counters_of: str = "this invocation") -> str:
    """A table per summary: one row per dataset plus the pooled row, then (when a dataset merges several
    `data_source`s) one row per source; numbers are % with 95% CIs. With a judge, its agreement with EM.
    `counters_of` names whose tool counters `run_metrics` holds (an aggregation's are the last run's)."""
    k = summary["k"]
    lines = [
        f"# {title}",
        "",
        f"k = {k} pass(es) per question; Avg@{k} / Pass@{k} in %, [95% bootstrap CI over questions].",
        "",
    ]
    lines += _table(_with_pooled(summary["datasets"], summary["overall"]), k, "dataset")
    sources = summary.get("data_sources") or {}
    if sources:
        lines += ["", "By `data_source`:", "", *_table(_with_pooled(sources, summary["overall"]), k, "data_source")]
    # what the lines below the tables go through: every dataset, every source, and the pool once
    rows = [*summary["datasets"].items(), *sources.items()]
    rows += [("**all**", summary["overall"])] if len(rows) > 1 else []
    if any(s.get("judge") for _, s in rows):
        lines += ["", *_agreement_table(rows)]
    incomplete = {name: s["incomplete"] for name, s in summary["datasets"].items() if s["incomplete"]}
    if incomplete:
        lines += ["", f"Incomplete questions (fewer than {k} passes, left out): {incomplete}"]
    masked = [_masked_line(name, s) for name, s in rows if (s.get("masked") or {}).get("questions")]
    if masked:
        lines += ["", "Masked questions (a pass met an infrastructure fault: left out of the numbers above):", ""]
        lines += masked
    for line in (_web_line, _faults_line, _replay_line):
        text = line(summary.get("run_metrics") or {}, counters_of)
        if text:
            lines += ["", text]
    return "\n".join(lines) + "\n"


def _agreement_table(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The judge against exact match, in judged passes per row, under a line naming the judge."""
    judges = [s["judge"] for _, s in rows if s.get("judge")]
    models = sorted({m for j in judges for m in j.get("models") or []})
    versions = sorted({v for j in judges for v in j.get("prompt_versions") or []})
    model, prompt = ", ".join(models) or "model not recorded", ", ".join(versions) or "not recorded"
    lines = [
        f"Judge ({model}; prompt {prompt}) against exact match, in judged passes:",
        "",
        "| | both right | judge only | EM only | both wrong | agreement % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in rows:
        a = (s.get("judge") or {}).get("agreement")
        if not a:
            continue
        agree = "–" if a["agreement"] is None else f"{100 * a['agreement']:.1f}"
        counts = [str(a[c]) for c in ("both_right", "judge_only", "em_only", "both_wrong")]
        lines.append("| " + " | ".join([str(name), *counts, agree]) + " |")
    return lines


def _masked_line(name: str, s: Mapping[str, Any]) -> str:
    """`- nq: 3 questions, 4 episodes (remote 3, timeout 1); EM Avg@1 with them as 0: 41.0 [...]`."""
    m, k = s["masked"], s["k"]
    kinds = ", ".join(f"{kind} {n}" for kind, n in m["episodes_by_kind"].items())
    as_zero = ((m.get("metrics_as_zero") or {}).get("em") or {}).get("avg_at_k")
    return (
        f"- {name}: {m['questions']} question(s), {m['episodes']} episode(s) ({kinds}); "
        f"EM Avg@{k} with their faulted passes as 0: {_pct(as_zero)}"
    )


def _faults_line(m: Mapping[str, float], of: str) -> str | None:
    """The faults `tools.faults` injected in this invocation (`FaultInjector.metrics` names), if any."""
    if "faults/calls" not in m:
        return None
    prefix = "faults/injected/"
    kinds = ", ".join(f"{key[len(prefix):]} {int(v)}" for key, v in sorted(m.items()) if key.startswith(prefix))
    return f"Injected tool faults ({of}): {int(m['faults/injected'])} of {int(m['faults/calls'])} calls ({kinds})."


def _replay_line(m: Mapping[str, float], of: str) -> str | None:
    """The tool record of this invocation (`asearch.tools.replay.Recorder.metrics`): a replay's hits and refused
    misses, or a recording's answers and new entries; None when the tools did neither."""
    if "record/answers" in m:
        changed = int(m.get("record/changed", 0))
        return (
            f"Recorded tools ({of}): {int(m['record/answers'])} answers, {int(m['record/new'])} new "
            "entries in the tool record" + (f", {changed} differed from the recorded answer (a replay gives the "
            "recorded one)" if changed else "") + "."
        )
    if "replay/hits" not in m:
        return None
    misses = ", ".join(f"{t} {int(m.get(f'replay/misses/{t}', 0))}" for t in ("search", "access"))
    damaged = int(m.get("replay/damaged", 0))
    return (
        f"Replayed tools ({of}): {int(m['replay/hits'])} answers from the record, "
        f"{int(m['replay/misses'])} misses refused ({misses})"
        + (f", {damaged} damaged entries refused" if damaged else "") + "."
    )


def _web_line(m: Mapping[str, float], of: str) -> str | None:
    """The web tools' cache and cost counters of this invocation (`WebRuntime.metrics` names), if any."""
    if "web/cache/hit_rate" not in m:
        return None
    calls = sum(int(v) for key, v in m.items() if key.startswith("web/cost/") and key.endswith("_calls"))
    return (
        f"Web tools ({of}): cache hit rate {100 * m['web/cache/hit_rate']:.1f}% "
        f"({int(m.get('web/cache/hits', 0))} hits, {int(m.get('web/cache/misses', 0))} misses), "
        f"{calls} calls sent, cost ${m.get('web/cost/total_usd', 0.0):.4f}"
        + (f", {int(m['web/cost/refused'])} refused by the budget" if m.get("web/cost/refused") else "")
        + "."
    )
