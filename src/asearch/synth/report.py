"""The filter report: how many seeds, edits and questions each gate rejected, and what the output looks like."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from statistics import mean
from typing import Any

REASONS = {
    "no_base": "the seed gave no base QA",
    "base_quality": "base QA failed the quality gate",
    "base_uniqueness": "base QA not unique",
    "not_hard": "not hard after T rounds (difficulty gate)",
    "too_few_edits": "hard, but fewer kept edits than min_edits",
}


def build_report(
    attempts: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    duplicates: Sequence[dict[str, Any]],
    cfg: Any,
    *,
    models: dict[str, str],
    errors_logged: int = 0,
    errors_unresolved: int = 0,
) -> dict[str, Any]:
    """Counts over every finished seed (`attempts`) and the written questions (`rows`)."""
    codes = Counter(a["reason_code"] for a in attempts)
    steps = [s for a in attempts for s in a["history"]]
    edits = [s for s in steps if s["round"] > 0]
    base = [s for s in steps if s["round"] == 0]

    def gate_counts(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
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
            "rejected": {code: codes[code] for code in REASONS},
            "errors_logged": errors_logged,  # every raise on record, including seeds a rerun then finished
            "errors_unresolved": errors_unresolved,  # seeds that raised and have not finished since
        },
        "questions": {
            "accepted": codes["accepted"],
            "near_duplicates_removed": len(duplicates),
            "written": len(rows),
            "unique_verified": sum(1 for r in rows if r.get("unique_verified")),
            "unique_verified_share": _share(sum(1 for r in rows if r.get("unique_verified")), len(rows)),
            "mean_direct_accuracy": _mean(final_acc),
            "mean_kept_edits": _mean([r.get("edits", 0) for r in rows]),
            "mean_words": _mean([len(r["question"].split()) for r in rows]),
            "mean_statements": _mean([len(r["statements"]) for r in rows]),
        },
        "base_qa": {**gate_counts(base), "mean_direct_accuracy": _mean(base_acc)},
        "edits": {
            **gate_counts(edits),
            "inapplicable_operator_tries": sum(a.get("inapplicable", 0) for a in attempts),
            "by_action": {
                act: gate_counts([s for s in edits if s["action"] == act]) for act in ("inject", "fuzz")
            },
        },
        "quality_rejections": dict(quality_reasons.most_common()),
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
    if structure and "facts" in structure[0]:
        report["structure"] = {
            "facts": dict(sorted(Counter(s["facts"] for s in structure).items())),
            "depth": dict(sorted(Counter(s["depth"] for s in structure).items())),
            "ask": dict(Counter(s["ask"] for s in structure).most_common()),
        }
    return report


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
        "Models: " + ", ".join(f"{k} `{v}`" for k, v in r["models"].items()),
        "",
        "## Questions",
        "",
        "| | count |",
        "|---|---|",
        f"| seeds finished | {s['finished']} |",
        f"| accepted | {q['accepted']} |",
        f"| near-duplicates removed | {q['near_duplicates_removed']} |",
        f"| **written** | **{q['written']}** |",
        f"| uniqueness verified | {q['unique_verified']} ({_pct(q['unique_verified_share'])}) |",
        f"| seeds that raised and are not finished (retried on rerun) | {s['errors_unresolved']} |",
        f"| errors logged (all runs) | {s['errors_logged']} |",
        "",
        "Rejected seeds:",
        "",
        "| reason | count |",
        "|---|---|",
        *[f"| {REASONS[code]} | {n} |" for code, n in s["rejected"].items()],
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
    if r["quality_rejections"]:
        lines += ["", "Quality rejections by kind:", "", "| kind | count |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in r["quality_rejections"].items()]
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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
