"""The filter report: how many seeds, edits and questions each gate rejected, and what the output looks like."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from statistics import mean
from typing import Any

from asearch.synth.backend import backend_kind

REASONS = {
    "no_base": "the seed gave no base QA",
    "base_quality": "base QA failed the quality gate",
    "base_uniqueness": "base QA not unique",
    "not_hard": "not hard after T rounds (difficulty gate)",
    "too_few_edits": "hard, but fewer kept edits than min_edits",
}
# The agent backend's seeds end where its agent stops (or never does), not after T rounds.
AGENT_REASONS = {
    "no_base": REASONS["no_base"],
    "base_quality": REASONS["base_quality"],
    "base_uniqueness": REASONS["base_uniqueness"],
    "not_hard": "too easy when the agent stopped (difficulty gate)",
    "not_solvable": "the search agent with tools did not answer it (agent.min_tool_correct)",
    "no_stop": "the agent never stopped with a question (turn or context limit)",
}
AGENT_ACTIONS = ("search", "access", "inject", "fuzz", "stop", "malformed")


def reasons_for(backend: str) -> dict[str, str]:
    """Reason code -> what it means, for the seeds of a run of `backend`."""
    return AGENT_REASONS if backend_kind(backend).agentic else REASONS


def build_report(
    attempts: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    duplicates: Sequence[dict[str, Any]],
    cfg: Any,
    *,
    models: dict[str, str],
    errors_logged: int = 0,
    errors_unresolved: int = 0,
    over_target: int = 0,
) -> dict[str, Any]:
    """Counts over every finished seed (`attempts`) and the written questions (`rows`); `over_target`:
    accepted questions after the first `n_questions` distinct ones in seed order, not written."""
    codes = Counter(a["reason_code"] for a in attempts)
    steps = [s for a in attempts for s in a["history"]]
    edits = [s for s in steps if s["round"] > 0]
    base = [s for s in steps if s["round"] == 0]

    quality_reasons = Counter(_reason_kind(s["reason"]) for s in steps if s["rejected_by"] == "quality")
    final_acc = [r["direct_accuracy"] for r in rows if r.get("direct_accuracy") is not None]
    base_acc = [s["direct_accuracy"] for s in base if s["direct_accuracy"] is not None]
    structure = [a["structure"] for a in attempts if a["status"] == "accepted" and a["structure"]]
    report: dict[str, Any] = {
        "backend": cfg.backend,
        "models": models,
        "seeds": {
            "finished": len(attempts),
            "accepted": codes["accepted"],
            "rejected": {code: codes[code] for code in reasons_for(cfg.backend)},
            "errors_logged": errors_logged,  # every raise on record, including seeds a rerun then finished
            "errors_unresolved": errors_unresolved,  # seeds that raised and have not finished since
        },
        "questions": {
            "accepted": codes["accepted"],
            "near_duplicates_removed": len(duplicates),
            "over_target": over_target,
            "written": len(rows),
            "unique_verified": sum(1 for r in rows if r.get("unique_verified")),
            "unique_verified_share": _share(sum(1 for r in rows if r.get("unique_verified")), len(rows)),
            "mean_direct_accuracy": _mean(final_acc),
            "mean_kept_edits": _mean([r.get("edits", 0) for r in rows]),
            "mean_words": _mean([len(r["question"].split()) for r in rows]),
            "mean_statements": _mean([len(r["statements"]) for r in rows]),
        },
        "base_qa": {**_gate_counts(base), "mean_direct_accuracy": _mean(base_acc)},
        "edits": {
            **_gate_counts(edits),
            "inapplicable_operator_tries": sum(a.get("inapplicable", 0) for a in attempts),
            "by_action": {
                act: _gate_counts([s for s in edits if s["action"] == act]) for act in ("inject", "fuzz")
            },
        },
        "quality_rejections": dict(quality_reasons.most_common()),
        "rejections_by_reason": _rejections_by_reason(steps, attempts),
        "solver_calls": sum(a.get("solver_calls", 0) for a in attempts),
        "judge_errors": sum(a.get("judge_errors", 0) for a in attempts),
        "duplicates": list(duplicates[:20]),
        "settings": {
            "rounds": cfg.rounds,
            "min_edits": cfg.min_edits,
            "k": cfg.solver.k,
            "max_correct": cfg.gates.max_correct,
            "grading": cfg.grading.method,
            "dedup_threshold": cfg.dedup.threshold if cfg.dedup.enabled else None,
        },
    }
    if backend_kind(cfg.backend).agentic:
        report["agent"] = _agent_counts(attempts, rows)
    if structure and "facts" in structure[0]:
        report["structure"] = {
            "facts": dict(sorted(Counter(s["facts"] for s in structure).items())),
            "depth": dict(sorted(Counter(s["depth"] for s in structure).items())),
            "ask": dict(Counter(s["ask"] for s in structure).most_common()),
        }
    return report


def _gate_counts(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Proposed, kept, and rejected by each gate, over some steps (base QAs, edits, one action's edits)."""
    rejected = Counter(s["rejected_by"] for s in items if s["rejected_by"])
    reached_unique = len(items) - rejected["quality"]
    return {
        "proposed": len(items),
        "kept": sum(1 for s in items if s["kept"]),
        "rejected_by": {
            "quality": rejected["quality"],
            "uniqueness": rejected["uniqueness"],
            "difficulty": rejected["difficulty"],
        },
        "gate_checks": {
            "quality": len(items),
            "uniqueness": reached_unique,
            "difficulty": sum(1 for s in items if s["direct_accuracy"] is not None),
        },
    }


def _rejections_by_reason(
    steps: Sequence[dict[str, Any]], attempts: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """{gate: {reason kind: count}} over every rejected step, plus the agent's stops the final checks refused."""
    out: dict[str, Counter[str]] = {}
    for s in steps:
        if s["rejected_by"]:
            out.setdefault(s["rejected_by"], Counter())[_reason_kind(s["reason"])] += 1
    final_gates = {"not_hard": "difficulty at stop", "not_solvable": "difficulty with tools"}
    for a in attempts:
        if a.get("agent") and a["reason_code"] in final_gates:
            out.setdefault(final_gates[a["reason_code"]], Counter())[_reason_kind(a["reason"])] += 1
    return {gate: dict(c.most_common()) for gate, c in out.items()}


def _agent_counts(attempts: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The agent backend's own numbers: actions chosen by kind, refusals by reason, turns, tool accuracy."""
    agents = [a for a in attempts if a.get("agent")]
    actions: Counter[str] = Counter()
    for a in agents:
        actions.update(a.get("actions", {}))
    refusals = Counter(_reason_kind(r) for a in agents for r in a["agent"]["refusals"])
    bad = Counter()
    for a in agents:
        bad.update(a["agent"].get("bad_arguments", {}))
    tool_acc = [r["tool_accuracy"] for r in rows if r.get("tool_accuracy") is not None]
    return {
        "episodes": len(agents),
        "mean_turns": _mean([a["agent"]["turns"] for a in agents]),
        "actions": {k: actions[k] for k in (*AGENT_ACTIONS, *sorted(set(actions) - set(AGENT_ACTIONS)))},
        "bad_arguments": dict(bad.most_common()),
        "refusals": dict(refusals.most_common()),
        "finish": dict(Counter(a["agent"]["finish"] for a in agents).most_common()),
        "mean_tool_accuracy": _mean(tool_acc),
        "seeds": [
            {"title": a["seed"]["title"], "outcome": a["reason_code"], "reason": a["reason"][:160],
             "actions": sum(a.get("actions", {}).values())}
            for a in agents[:20]
        ],
    }  # fmt: skip


def _reason_kind(reason: str) -> str:
    """Group free-text reasons by their stem: no quoted text, urls as <url>, numbers as N, at most 10 words.

    '63 words > max_words=60' -> 'N words > max_words=N'.
    """
    stem = reason.split(": '")[0].split(' ("')[0]  # drop a quoted reply or statement at the end
    stem = re.sub(r"\(.*?\)|'[^']*'?|\"[^\"]*\"?", "", stem)  # and any other quoted or bracketed text
    stem = re.sub(r"https?://\S+", "<url>", stem)
    stem = re.sub(r"\d[\d,.]*", "N", stem)
    return " ".join(stem.split()[:10]) or "(none)"


def _mean(xs: Sequence[float]) -> float | None:
    return round(mean(xs), 4) if xs else None


def _share(n: int, total: int) -> float | None:
    return round(n / total, 4) if total else None


def render_report(r: dict[str, Any]) -> str:
    """The filter report as markdown."""
    q, s, e, b = r["questions"], r["seeds"], r["edits"], r["base_qa"]
    lines = [
        f"# Synthesis filter report ({r['backend']} backend)",
        "",
        "Models: " + (", ".join(f"{k} `{v}`" for k, v in r["models"].items()) or "not recorded (no question was written)"),
        "",
        "## Questions",
        "",
        "| | count |",
        "|---|---|",
        f"| seeds finished | {s['finished']} |",
        f"| accepted | {q['accepted']} |",
        f"| near-duplicates removed | {q['near_duplicates_removed']} |",
        f"| accepted past n_questions, not written | {q.get('over_target', 0)} |",
        f"| **written** | **{q['written']}** |",
        f"| uniqueness verified | {q['unique_verified']} ({_pct(q['unique_verified_share'])}) |",
        f"| seeds that raised and are not finished (retried on rerun) | {s['errors_unresolved']} |",
        f"| errors logged (all runs) | {s['errors_logged']} |",
        "",
        "Rejected seeds:",
        "",
        "| reason | count |",
        "|---|---|",
        *[f"| {reasons_for(r['backend'])[code]} | {n} |" for code, n in s["rejected"].items()],
        "",
        "## Gates",
        "",
        "| | proposed | kept | quality | uniqueness | difficulty |",
        "|---|---|---|---|---|---|",
    ]
    rows = [("base QA", b), ("edits", e)] + [(f"  {k}", v) for k, v in e["by_action"].items()]
    for name, c in rows:
        rej = c["rejected_by"]
        lines.append(
            f"| {name} | {c['proposed']} | {c['kept']} | {rej['quality']} | {rej['uniqueness']} | {rej['difficulty']} |"
        )
    lines += [
        "",
        f"Operator tries that found nothing to edit: {e['inapplicable_operator_tries']}. "
        f"Solver calls: {r['solver_calls']}; judge errors: {r['judge_errors']}.",
        "",
        f"Direct-answer accuracy: base QA {_fmt(b['mean_direct_accuracy'])}, written questions "
        f"{_fmt(q['mean_direct_accuracy'])} (k={r['settings']['k']}, hard = at most "
        f"{r['settings']['max_correct']} correct, grading {r['settings']['grading']}).",
        f"Written questions: {_fmt(q['mean_words'])} words, {_fmt(q['mean_kept_edits'])} kept edits and "
        f"{_fmt(q['mean_statements'])} statements on average.",
    ]
    if r.get("rejections_by_reason"):
        lines += ["", "Gate rejections by reason:", "", "| gate | reason | count |", "|---|---|---|"]
        lines += [
            f"| {gate} | {k} | {n} |"
            for gate, kinds in r["rejections_by_reason"].items()
            for k, n in kinds.items()
        ]
    if "agent" in r:
        lines += _render_agent(r["agent"])
    if "structure" in r:
        st = r["structure"]
        lines += [
            "",
            "## Structure of accepted questions",
            "",
            "Constraints: " + ", ".join(f"{k}: {n}" for k, n in st["facts"].items()),
            "",
            "Nesting depth: " + ", ".join(f"{k}: {n}" for k, n in st["depth"].items()),
            "",
            "Asked: " + ", ".join(f"{k}: {n}" for k, n in st["ask"].items()),
        ]
    if r["duplicates"]:
        lines += [
            "",
            "## Near-duplicates removed (first 20)",
            "",
            "| removed | kept | Jaccard |",
            "|---|---|---|",
        ]
        lines += [f"| {d['question']} | {d['kept_question']} | {d['similarity']} |" for d in r["duplicates"]]
    return "\n".join(lines) + "\n"


def _render_agent(a: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Synthesis agent",
        "",
        f"{a['episodes']} episodes, {_fmt(a['mean_turns'])} turns on average; finished by: "
        + ", ".join(f"{k} {n}" for k, n in a["finish"].items())
        + f". Search-agent accuracy with tools on the written questions: {_fmt(a['mean_tool_accuracy'])}.",
        "",
        "Actions chosen:",
        "",
        "| action | count |",
        "|---|---|",
        *[f"| {k} | {n} |" for k, n in a["actions"].items()],
    ]
    if a["bad_arguments"]:
        lines += [
            "",
            "Calls with unreadable arguments: "
            + ", ".join(f"{k} {n}" for k, n in a["bad_arguments"].items()),
        ]
    if a["refusals"]:
        lines += ["", "Refused calls by reason:", "", "| reason | count |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in a["refusals"].items()]
    lines += ["", "Seeds (first 20):", "", "| seed | outcome | actions | reason |", "|---|---|---|---|"]
    lines += [f"| {x['title']} | {x['outcome']} | {x['actions']} | {x['reason']} |" for x in a["seeds"]]
    return lines


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
