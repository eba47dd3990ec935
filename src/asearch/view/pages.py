"""Server-rendered HTML of the viewer: overview (runs, curves, eval tables), trajectory browser, synthesis.

Every value from a run goes through `esc` (trajectories hold arbitrary model output and web text);
urls become links only when they are http(s). The page's script adds live charts and the turn stepper
on top; without it everything but the charts still reads.
"""

from __future__ import annotations

import difflib
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from asearch.metrics.counters import tool_calls_text
from asearch.metrics.horizon import PER_EPISODE_MEANS
from asearch.metrics.offpolicy import (
    MASKED_FRAC,
    MASKED_FRAC_BY_STALENESS,
    RATIO_HIST,
    RATIO_LABELS,
    VERSIONS_BEHIND_HIST,
    VERSIONS_BEHIND_LABELS,
)
from asearch.view.records import TrajectoryRow, outcome_of, split_record, think_text
from asearch.view.runs import answer_text, kept_edits

__all__ = ["CHARTS", "STALENESS_CHARTS", "Chart", "esc"]


def esc(x: Any) -> str:
    """HTML-escape any value (quotes too, so it is safe inside attributes); None is empty."""
    return "" if x is None else html.escape(str(x), quote=True)


def _q(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v not in (None, "")})


def _pager(path: str, params: dict[str, Any], page: int, matched: int, page_size: int, back: str, forward: str) -> str:
    """`<- back · page i / n · forward ->` for a listing at `path` (the query keeps `params`)."""
    pages = max(1, math.ceil(matched / page_size))
    nav = []
    if page > 0:
        nav.append(f'<a href="{path}?{esc(_q(**params, page=page - 1))}">← {back}</a>')
    nav.append(f"page {page + 1} / {pages}")
    if page + 1 < pages:
        nav.append(f'<a href="{path}?{esc(_q(**params, page=page + 1))}">{forward} →</a>')
    return f'<p class="pager">{" · ".join(nav)}</p>'


def safe_link(url: Any, text: Any = None) -> str:
    """A link for http(s) urls only (a `javascript:` url in model output must never become an href)."""
    if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
        return (
            f'<a href="{esc(url)}" rel="noopener noreferrer nofollow" target="_blank">{esc(text or url)}</a>'
        )
    return esc(text or url)


@dataclass(frozen=True)
class Chart:
    """One panel of training curves: exact metric names, or prefixes ending in "/" (every key below). With
    `bins`, a histogram logged as one key per bin (`keys[0]` + label): each step's counts are drawn as shares
    stacked in the bins' order, one band per bin."""

    title: str
    keys: tuple[str, ...]
    note: str = ""
    bins: tuple[str, ...] = ()


# Metric names written by `asearch.rl.loop` (`rollout_metrics`, the perf/ block), the trainer and the loss.
CHARTS: tuple[Chart, ...] = (
    Chart("Reward", ("rollout/reward_mean", "rollout/accuracy"), "mean over the step's trajectories"),
    Chart("Held-out accuracy", ("eval/heldout_acc",), "greedy, held-out questions"),
    Chart("Turns per episode", ("rollout/turns_mean", "rollout/read_turns_mean")),
    Chart("Tool calls per episode", ("rollout/tool_calls/",), "every tool's published counter"),
    Chart("Compactions per episode", ("rollout/compactions_mean",)),
    Chart("Generated tokens per episode", ("rollout/gen_tokens_mean",)),
    Chart("Staleness", ("rollout/staleness_mean", "rollout/staleness_max"), "policy versions behind"),
    Chart("Rejected groups", ("rollout/rejected/",), "running total, by cause"),
    Chart("Throughput", ("perf/trajectories_per_s",), "trajectories per second"),
    Chart(
        "Step time", ("perf/step_s", "perf/rollout_wait_s", "perf/train_s", "perf/weight_sync_s"), "seconds"
    ),
    Chart("Loss", ("loss/policy", "loss/approx_kl", "loss/clip_frac")),
    Chart("Errors per step", ("rollout/parse_errors", "rollout/tool_errors", "rollout/no_answer_rate")),
)

# The staleness lab: what the trainer counts per step (`asearch.rl.trainer`, bins in `asearch.metrics.offpolicy`)
# and the off-policy correction's own statistics (`asearch.rl.loss`).
STALENESS_CHARTS: tuple[Chart, ...] = (
    Chart(
        "Tokens by versions behind", (VERSIONS_BEHIND_HIST,), "share of the step's generated tokens",
        bins=VERSIONS_BEHIND_LABELS,
    ),
    Chart("Importance ratio π_prox / π_behav", (RATIO_HIST,), "share of the step's generated tokens", bins=RATIO_LABELS),
    Chart(
        "Masked by the correction", (MASKED_FRAC, MASKED_FRAC_BY_STALENESS, "loss/truncated_frac"),
        "share of tokens, overall and by versions behind; tis: share truncated",
    ),
    Chart(
        "Importance weights", ("loss/behav_weight_mean", "loss/is_weight_mean"),
        "mean π_prox / π_behav; mean weight the loss applies to kept tokens",
    ),
)  # fmt: skip

_KIND_LABEL = {
    "train": "train",
    "eval": "eval",
    "demo": "demo",
    "trajectories": "trajectories",
    "synth": "synth",
}


# --------------------------------------------------------------------------- layout


def document(title: str, body: str, *, active: str, poll_ms: int) -> str:
    nav = "".join(
        f'<a href="{href}"{" class=active" if key == active else ""}>{label}</a>'
        for key, href, label in (
            ("overview", "/", "Overview"),
            ("trajectories", "/trajectories", "Trajectories"),
            ("synth", "/synth", "Synthesis"),
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · asearch view</title>
<link rel="stylesheet" href="/static/viewer.css">
<script src="/static/viewer.js" defer></script>
</head>
<body data-poll-ms="{int(poll_ms)}">
<header class="top"><span class="brand">asearch view</span><nav>{nav}</nav>
<span id="live" class="live" title="polling the run files">●</span></header>
<main>{body}</main>
</body></html>
"""


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
            return f"{x:.3g}"
        s = f"{x:.{digits}f}"
        return s.rstrip("0").rstrip(".") if "." in s else s
    return str(x)


def _kv_table(d: Mapping[str, Any], *, depth: int = 0) -> str:
    """A mapping as a two-column table; nested mappings become nested tables, long lists JSON."""
    rows = []
    for k, v in d.items():
        if isinstance(v, Mapping) and depth < 2 and v:
            cell = _kv_table(v, depth=depth + 1)
        elif isinstance(v, list | dict):
            text = json.dumps(v, ensure_ascii=False)
            cell = f"<code>{esc(text[:400] + ('…' if len(text) > 400 else ''))}</code>"
        else:
            cell = esc(_fmt(v))
        rows.append(f"<tr><th>{esc(k)}</th><td>{cell}</td></tr>")
    return f'<table class="kv">{"".join(rows)}</table>'


def _age(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 90:
        return f"{s:.0f}s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _status_cell(info: Mapping[str, Any]) -> str:
    counts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in info["counts"].items())
    bad = ""
    if info["bad_lines"]:
        tip = "\n".join(info["problems"])
        bad = f' <span class="badge warn" title="{esc(tip)}">{info["bad_lines"]} bad lines skipped</span>'
    state = info["state"]
    return (
        (f'<span class="state state-{esc(state)}">{esc(state)}</span> ' if state else "")
        + f'<span class="muted">updated {esc(_age(info["updated_s_ago"]))}</span><br>'
        f'<span class="muted">{esc(counts)}</span>{bad}'
    )


# --------------------------------------------------------------------------- overview


def overview(
    infos: Sequence[Mapping[str, Any]],
    *,
    train: Sequence[Mapping[str, str]],
    evals: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, str]],
    details: Mapping[str, str],
    empty_roots: Sequence[str],
    metric: str,
    estimate: str,
) -> str:
    parts = ["<h1>Runs</h1>", _runs_table(infos, details)]
    if empty_roots:
        parts.append(
            '<p class="notice">No run files yet in '
            + ", ".join(f"<code>{esc(r)}</code>" for r in empty_roots)
            + " (searched again every few seconds).</p>"
        )
    if train:
        runs_json = json.dumps([{"id": r["id"], "name": r["name"]} for r in train])
        lab_keys = "|".join(c.keys[0] for c in STALENESS_CHARTS if c.bins)  # the section shows once a run logs one
        parts.append(
            '<section id="curves"><h1>Training curves</h1>'
            '<div class="chart-controls"><label>x axis <select id="x-axis">'
            '<option value="step">step</option><option value="wall_s">wall time (min)</option></select></label>'
            '<label>smoothing <select id="smooth"><option value="0">none</option><option value="0.6">0.6</option>'
            '<option value="0.9">0.9</option></select></label></div>'
            f'<div id="charts" class="charts" data-runs="{esc(runs_json)}">{"".join(map(_figure, CHARTS))}'
            '<figure class="chart chart-any" data-title="Any metric" data-keys="">'
            '<figcaption>Any metric <select id="any-metric"></select></figcaption></figure>'
            "</div>"
            f'<section id="staleness" hidden data-prefixes="{esc(lab_keys)}"><h2>Staleness and off-policy correction</h2>'
            '<p class="muted">How far behind the trained policy each step\'s tokens were sampled, how their importance '
            "ratios spread and what the correction (<code>loss.correction</code>) dropped.</p>"
            f'<div class="charts">{"".join(map(_figure, STALENESS_CHARTS))}</div></section>'
            "</section>"
        )
    if evals:
        parts.append(_eval_section(evals, metric, estimate))
    return "".join(parts)


def _figure(c: Chart) -> str:
    bins = f' data-bins="{esc("|".join(c.bins))}"' if c.bins else ""
    return (
        f'<figure class="chart" data-title="{esc(c.title)}" data-keys="{esc(",".join(c.keys))}"{bins}>'
        f"<figcaption>{esc(c.title)}" + (f' <span class="muted">{esc(c.note)}</span>' if c.note else "")
        + "</figcaption></figure>"
    )  # fmt: skip


def _runs_table(infos: Sequence[Mapping[str, Any]], details: Mapping[str, str]) -> str:
    if not infos:
        return '<p class="notice">No runs found.</p>'
    rows = []
    for info in infos:
        rid, kind = info["id"], info["kind"]
        links = []
        if kind in ("train", "eval", "trajectories"):
            links.append(f'<a href="/trajectories?{_q(run=rid)}">trajectories</a>')
        if kind == "synth":
            links.append(f'<a href="/synth?{_q(run=rid)}">questions</a>')
        more = details.get(rid, "")
        rows.append(
            f'<tr data-run="{esc(rid)}"><td><b>{esc(info["name"])}</b><br><code class="muted">{esc(info["path"])}</code>'
            + (f"<details><summary>details</summary>{more}</details>" if more else "")
            + f'</td><td><span class="kind kind-{esc(kind)}">{esc(_KIND_LABEL.get(kind, kind))}</span></td>'
            f'<td class="status" data-status="{esc(rid)}">{_status_cell(info)}</td>'
            f"<td>{' · '.join(links)}</td></tr>"
        )
    return (
        '<table class="runs"><thead><tr><th>run</th><th>kind</th><th>status</th><th></th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def run_details(run: Any) -> str:
    """The collapsible extras of one run row: summary, plot, report, checkpoints, config."""
    kind = run.kind
    out = []
    horizon = run.horizon() if kind == "demo" else None
    if horizon:
        out.append(horizon_section(horizon["after"], horizon["before"]))
    value = run.summary.get() if kind in ("train", "demo") else None  # eval summaries have their own tables
    if isinstance(value, dict) and value:
        out.append("<h4>summary.json</h4>" + _kv_table(value))
    for name in run.images():
        out.append(f'<img class="plot" alt="{esc(name)}" src="/file/{esc(run.id)}/{esc(name)}">')
    if kind == "demo":
        report = run.report.get()
        if report:
            out.append(f'<h4>report.md</h4><pre class="report">{esc(report)}</pre>')
    if kind == "eval" and isinstance(run.config.get(), dict):
        out.append("<h4>config.json</h4>" + _kv_table(run.config.get()))
    if kind == "train":
        ckpts = run.checkpoints()
        if ckpts:
            out.append(f'<p class="muted">checkpoints: {esc(", ".join(ckpts))}</p>')
        cfg = run.config_text.get()
        if cfg:
            out.append(f'<h4>config.yaml</h4><pre class="report">{esc(cfg)}</pre>')
    return "".join(out)


def _columns_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table with a header row; cells are escaped and numbers formatted."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="horizon"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _hop_cell(stats: Mapping[str, Any] | None, hops: str) -> str:
    cell = (stats or {}).get("accuracy_by_hops", {}).get(hops)
    return f"{_fmt(cell['acc'])} (n={cell['n']})" if cell else "–"


def horizon_section(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> str:
    """The demo's held-out episodes over a long horizon (`asearch.metrics.horizon.horizon_stats` of
    heldout_after.jsonl, and of heldout_before.jsonl when present): turn histogram, means per episode,
    accuracy by hop count, compactions per episode."""
    runs = [("before RL", before), ("after RL", after)] if before else [("after RL", after)]
    names = [name for name, _ in runs]
    hist = [[b, *(s["turn_histogram"].get(b, 0) for _, s in runs)] for b in after["turn_histogram"]]
    means = [[label, *(s[key] for _, s in runs)] for label, key in PER_EPISODE_MEANS]
    hops = sorted({h for _, s in runs for h in s["accuracy_by_hops"]}, key=int)
    by_hops = [[h, *(_hop_cell(s, h) for _, s in runs)] for h in hops]
    counts = sorted({n for _, s in runs for n in s["compaction_histogram"]}, key=int)
    compactions = [[n, *(s["compaction_histogram"].get(n, 0) for _, s in runs)] for n in counts]
    access = after["access_rate_correct"]
    return (
        f"<h4>Long horizon: {esc(after['episodes'])} held-out episodes</h4>"
        f'<p class="muted">mean turns after RL {esc(_fmt(after["mean_turns"]))}; correct episodes that opened '
        f"a page {esc('–' if access is None else _fmt(access))}</p>"
        + _columns_table(["turns", *names], hist)
        + "<h4>per episode (mean)</h4>"
        + _columns_table(["", *names], means)
        + "<h4>accuracy by hop count</h4>"
        + _columns_table(["hops", *names], by_hops)
        + "<h4>compactions per episode</h4>"
        + _columns_table(["compactions", *(f"episodes {n}" for n in names)], compactions)
    )


_METRICS = (("em", "EM"), ("f1", "F1"), ("cem", "CEM"), ("judge", "judge"))
_ESTIMATES = (("avg_at_k", "Avg@k"), ("pass_at_k", "Pass@k"))


def _pct(e: Any) -> str:
    if not isinstance(e, Mapping) or not isinstance(e.get("mean"), int | float):
        return '<span class="muted">–</span>'
    ci = ""
    if isinstance(e.get("low"), int | float) and isinstance(e.get("high"), int | float):
        ci = f' <span class="ci">[{100 * e["low"]:.1f}, {100 * e["high"]:.1f}]</span>'
    return f"{100 * e['mean']:.1f}{ci}"


def _estimate(group: Mapping[str, Any], metric: str, estimate: str) -> Any:
    if metric == "judge":
        j = group.get("judge") or {}
        return j.get("accuracy" if estimate == "avg_at_k" else "pass_at_k")
    return ((group.get("metrics") or {}).get(metric) or {}).get(estimate)


def _groups(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    ds = summary.get("datasets")
    groups = [(str(k), v) for k, v in ds.items() if isinstance(v, Mapping)] if isinstance(ds, Mapping) else []
    if len(groups) > 1 and isinstance(summary.get("overall"), Mapping):
        groups.append(("all", summary["overall"]))
    return groups


def _eval_section(
    evals: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, str]], metric: str, estimate: str
) -> str:
    datasets: list[str] = []
    for _, summary, _ in evals:
        for name, _g in _groups(summary or {}):
            if name not in datasets and name != "all":
                datasets.append(name)
    switch = " ".join(
        f'<a class="pill{" on" if (m, e) == (metric, estimate) else ""}" href="/?{_q(metric=m, estimate=e)}#evaluation">'
        f"{label} {elabel}</a>"
        for m, label in _METRICS
        for e, elabel in _ESTIMATES
    )
    label = dict(_METRICS).get(metric, metric) + " " + dict(_ESTIMATES).get(estimate, estimate)
    head = "".join(f"<th>{esc(d)}</th>" for d in datasets)
    pivot_rows = []
    for info, summary, source in evals:
        by_name = dict(_groups(summary or {}))
        k = (summary or {}).get("k", "?")
        cells = "".join(
            f"<td>{_pct(_estimate(by_name[d], metric, estimate)) if d in by_name else '<span class=muted>–</span>'}</td>"
            for d in datasets
        )
        live = ' <span class="badge live">live</span>' if source == "live" else ""
        pivot_rows.append(f"<tr><th>{esc(info['name'])}{live}</th><td>{esc(k)}</td>{cells}</tr>")
    pivot = (
        f'<table class="eval pivot"><caption>{esc(label)} in % [95% bootstrap CI over questions]</caption>'
        f"<thead><tr><th>run</th><th>k</th>{head}</tr></thead><tbody>{''.join(pivot_rows)}</tbody></table>"
    )
    detail_rows = []
    for info, summary, _source in evals:
        if not summary:
            detail_rows.append(
                f"<tr><th>{esc(info['name'])}</th><td colspan=14 class=muted>no summary yet</td></tr>"
            )
            continue
        k = summary.get("k", "?")
        for name, g in _groups(summary):
            n = g.get("n", "?")
            if g.get("expected") not in (None, n):
                n = f"{n}/{g['expected']}"
            st = g.get("stats") or {}
            j = g.get("judge") or {}
            href = f"/trajectories?{_q(run=info['id'], dataset='' if name == 'all' else name)}"
            no_answer = st.get("no_answer_rate")
            detail_rows.append(
                f'<tr><th>{esc(info["name"])}</th><td><a href="{esc(href)}">{esc(name)}</a></td>'
                f"<td>{esc(n)}</td><td>{esc(k)}</td>"
                + "".join(
                    f"<td>{_pct(_estimate(g, m, e))}</td>" for m in ("em", "f1", "cem") for e, _ in _ESTIMATES
                )
                + f"<td>{_pct(j.get('accuracy'))}</td><td>{esc(j.get('failures', '–'))}</td>"
                f"<td>{esc(_num(st.get('turns')))}</td><td>{esc(tool_calls_text(st))}</td>"
                f"<td>{esc(_num(st.get('generated_tokens'), 0))}</td>"
                f"<td>{esc('–' if no_answer is None else f'{100 * no_answer:.1f}')}</td></tr>"
            )
    metric_heads = "".join(f"<th>{m} {e}</th>" for m in ("EM", "F1", "CEM") for e in ("Avg@k", "Pass@k"))
    detail = (
        '<table class="eval detail"><caption>All metrics, % [95% CI]</caption><thead><tr><th>run</th><th>dataset</th>'
        f"<th>n</th><th>k</th>{metric_heads}<th>judge acc.</th><th>judge fail.</th><th>turns</th>"
        "<th>tool calls</th><th>gen. tokens</th><th>no answer %</th></tr></thead>"
        f"<tbody>{''.join(detail_rows)}</tbody></table>"
    )
    return (
        f'<section id="evaluation"><h1>Evaluation</h1><div class="pills">{switch}</div>'
        f'<div class="scroll">{pivot}</div><div class="scroll">{detail}</div></section>'
    )


def _num(x: Any, digits: int = 2) -> str:
    return "–" if not isinstance(x, int | float) else f"{x:.{digits}f}"


# --------------------------------------------------------------------------- trajectory browser


@dataclass
class TrajectoryFilters:
    outcome: str = ""
    dataset: str = ""
    min_turns: int | None = None
    max_turns: int | None = None
    text: str = ""

    def params(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "dataset": self.dataset,
            "min_turns": self.min_turns,
            "max_turns": self.max_turns,
            "q": self.text,
        }


def _outcome_badge(outcome: str, score: float | None) -> str:
    label = {"correct": "✓ correct", "wrong": "✗ wrong", "unscored": "unscored"}.get(outcome, outcome)
    tip = "" if score is None else f' title="score {score:.3f}"'
    return f'<span class="badge {esc(outcome)}"{tip}>{esc(label)}</span>'


def nothing(title: str, message: str) -> str:
    """A page whose runs have nothing of its kind."""
    return f'<h1>{esc(title)}</h1><p class="notice">{esc(message)}</p>'


def trajectories_page(
    *,
    runs: Sequence[tuple[str, str]],
    run_id: str | None,
    rows: Sequence[TrajectoryRow],
    matched: int,
    total: int,
    page: int,
    page_size: int,
    datasets: Sequence[str],
    filters: TrajectoryFilters,
    detail: str,
    open_index: int | None,
) -> str:
    run_opts = "".join(
        f'<option value="{esc(rid)}"{" selected" if rid == run_id else ""}>{esc(name)}</option>'
        for rid, name in runs
    )
    outcome_opts = "".join(
        f'<option value="{v}"{" selected" if v == filters.outcome else ""}>{label}</option>'
        for v, label in (("", "any"), ("correct", "correct"), ("wrong", "wrong"), ("unscored", "unscored"))
    )
    ds_opts = '<option value="">any</option>' + "".join(
        f'<option value="{esc(d)}"{" selected" if d == filters.dataset else ""}>{esc(d)}</option>'
        for d in datasets
    )
    form = (
        '<form class="filters" method="get" action="/trajectories">'
        f'<label>run <select name="run">{run_opts}</select></label>'
        f'<label>outcome <select name="outcome">{outcome_opts}</select></label>'
        f'<label>dataset <select name="dataset">{ds_opts}</select></label>'
        f'<label>turns <input name="min_turns" type="number" min="0" value="{esc(filters.min_turns)}" placeholder="min">'
        f' – <input name="max_turns" type="number" min="0" value="{esc(filters.max_turns)}" placeholder="max"></label>'
        f'<label>text <input name="q" type="search" value="{esc(filters.text)}" placeholder="question or answer"></label>'
        '<button type="submit">filter</button></form>'
    )
    base = {"run": run_id, **filters.params()}
    items = []
    for r in rows:
        href = f"/trajectories?{_q(**base, page=page, open=r.index)}"
        active = " active" if r.index == open_index else ""
        meta = [f"{r.turns} turns", f"{r.tokens} tok"]
        if r.step is not None:
            meta.append(f"step {r.step}")
        if r.dataset:
            meta.append(r.dataset)
        if r.pass_index is not None:
            meta.append(f"pass {r.pass_index}")
        if r.reward is not None:
            meta.append(f"reward {r.reward:.2f}")
        items.append(
            f'<li class="traj-item{active}"><a class="traj-link" data-run="{esc(run_id)}" data-index="{r.index}" '
            f'data-id="{esc(r.id)}" href="{esc(href)}">'
            f'<span class="q">{esc(_clip(r.question, 140))}</span>'
            f"{_outcome_badge(r.outcome, r.score)}"
            f'<span class="a">→ {esc(_clip(r.answer, 60)) if r.answer is not None else "<i>no answer</i>"}</span>'
            f'<span class="meta">{esc(" · ".join(meta))}</span></a></li>'
        )
    listing = (
        f'<p class="muted">{matched} of {total} trajectories match <span id="new-trajectories" '
        f'data-run="{esc(run_id)}" data-total="{total}"></span></p>'
        f'<ol class="traj-list">{"".join(items) or "<li class=muted>nothing matches</li>"}</ol>'
        + _pager("/trajectories", base, page, matched, page_size, "newer", "older")
    )
    empty = '<p class="muted">Pick a trajectory on the left.</p>'
    return (
        f"<h1>Trajectories</h1>{form}"
        f'<div class="browser"><div class="list">{listing}</div>'
        f'<div id="detail" class="detail">{detail or empty}</div></div>'
    )


def _clip(s: Any, n: int) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def _versions(traj: Mapping[str, Any]) -> str | None:
    vs = []
    for t in traj.get("turns") or []:
        v = t.get("versions") if isinstance(t, Mapping) else None
        if isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(x, int) and x >= 0 for x in v):
            vs += list(v)
    return None if not vs else (f"v{min(vs)}" if min(vs) == max(vs) else f"v{min(vs)}–v{max(vs)}")


def trajectory_detail(run_id: str, index: int, record: Mapping[str, Any]) -> str:
    """One trajectory: its facts, then every turn (reasoning, tool call, result, summary, tokens, versions)."""
    traj, result = split_record(dict(record))
    outcome, score = outcome_of(traj, result)
    facts: list[tuple[str, str]] = [("id", esc(traj.get("id") or result.get("id")))]
    answer = result.get("prediction") if result else traj.get("answer")
    facts.append(("answer", esc(answer) if answer is not None else "<i>no answer</i>"))
    if result.get("golds"):
        golds = result["golds"] if isinstance(result["golds"], list) else [result["golds"]]
        facts.append(("gold", " | ".join(esc(g) for g in golds)))
    facts.append(("outcome", _outcome_badge(outcome, score)))
    if result:
        facts.append(
            ("scores", esc(" ".join(f"{m.upper()} {_fmt(result.get(m))}" for m in ("em", "f1", "cem"))))
        )
        judge = result.get("judge")
        if isinstance(judge, Mapping):
            verdict = {True: "correct", False: "incorrect"}.get(
                judge.get("correct"), f"failed: {judge.get('error')}"
            )
            facts.append(
                (
                    "judge",
                    f"{esc(verdict)} <span class=muted>{esc(_clip(judge.get('rationale'), 300))}</span>",
                )
            )
        if result.get("dataset"):
            facts.append(
                (
                    "dataset",
                    esc(f"{result['dataset']} · pass {result.get('pass')} · seed {result.get('seed')}"),
                )
            )
    elif isinstance(traj.get("metadata"), Mapping) and traj["metadata"].get("dataset"):
        facts.append(("dataset", esc(traj["metadata"]["dataset"])))
    for key in ("step", "group"):
        if record.get(key) is not None and not result:
            facts.append((key, esc(record[key])))
    if traj.get("reward") is not None:
        facts.append(("reward", esc(_fmt(traj.get("reward")))))
    facts.append(("finish", esc(result.get("finish") or traj.get("finish"))))
    turns = [t for t in traj.get("turns") or [] if isinstance(t, Mapping)]
    segs = [s for s in traj.get("segments") or [] if isinstance(s, Mapping)]
    tokens = ", ".join(
        f"{len(s.get('token_ids') or [])} ({sum(s.get('loss_mask') or [])} generated)" for s in segs
    )
    facts.append(("turns", esc(len(turns))))
    if tokens:
        facts.append(("segments", esc(f"{len(segs)}: {tokens}")))
    v = _versions(traj)
    if v:
        facts.append(("policy", esc(v)))
    if isinstance(traj.get("wall_s"), int | float):
        facts.append(("wall", esc(f"{traj['wall_s']:.2f} s")))
    counters = traj.get("counters")
    if isinstance(counters, Mapping) and counters:
        facts.append(("counters", esc(", ".join(f"{k} {v}" for k, v in counters.items()))))
    facts_html = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    turns_html = "".join(_turn(i, t) for i, t in enumerate(turns, start=1))
    return (
        f'<article class="trajectory" data-run="{esc(run_id)}" data-index="{index}">'
        f'<h2 class="question">{esc(traj.get("question") or result.get("question"))}</h2>'
        f'<dl class="facts">{facts_html}</dl>'
        f'<div class="stepper" hidden><button type="button" class="prev">◀ prev</button>'
        f'<span class="pos"></span><button type="button" class="next">next ▶</button><span class="chips"></span>'
        f'<label><input type="checkbox" class="all"> show all turns</label></div>'
        f'<ol class="turns">{turns_html or "<li class=muted>no turns</li>"}</ol></article>'
    )


def _turn(n: int, t: Mapping[str, Any]) -> str:
    kind = t.get("kind") if t.get("kind") in ("act", "read") else "act"
    action, arg, out = t.get("action"), t.get("argument"), str(t.get("output_text") or "")
    head = [f"Turn {n}", "reading" if kind == "read" else "act"]
    if action:
        head.append(str(action))
    head.append(f"{t.get('output_tokens', 0)} tokens out")
    if t.get("prompt_tokens"):
        head.append(f"{t['prompt_tokens']} in context")
    v = t.get("versions")
    if isinstance(v, list | tuple) and len(v) == 2 and isinstance(v[0], int) and v[0] >= 0:
        head.append(f"policy v{v[0]}" + (f"–v{v[1]}" if v[1] != v[0] else ""))
    for key, label in (("llm_latency_s", "LLM"), ("tool_latency_s", "tool")):
        if isinstance(t.get(key), int | float) and t[key]:
            head.append(f"{t[key]:.2f}s {label}")
    if t.get("stop_reason") not in (None, "stop"):
        head.append(f"stopped: {t['stop_reason']}")
    label = "read" if kind == "read" else str(action or "no action")
    body = []
    if kind == "read":
        summary = out.removesuffix("</summary>").strip()  # the loop stops the reading turn at its closing tag
        body.append(
            f'<section class="summary"><h4>The model\'s summary</h4><pre>{esc(summary)}</pre></section>'
        )
    else:
        reasoning = think_text(out)
        if reasoning:
            body.append(f'<section class="reasoning"><h4>Reasoning</h4><pre>{esc(reasoning)}</pre></section>')
        if action == "answer":
            body.append(f'<section class="call"><h4>Answer</h4><code>{esc(arg)}</code></section>')
        elif action:
            body.append(
                f'<section class="call"><h4>Tool call</h4><code>{esc(action)}({esc(json.dumps(arg, ensure_ascii=False))})</code></section>'
            )
    if t.get("parse_error"):
        body.append(f'<p class="error">parse error: {esc(t["parse_error"])}</p>')
    if t.get("tool_error"):
        body.append(f'<p class="error">tool error: {esc(t["tool_error"])}</p>')
    obs = t.get("observation")
    if obs:
        heading = "Result" if action in ("search", "access") and not t.get("parse_error") else "Observation"
        body.append(f'<section class="observation"><h4>{heading}</h4><pre>{esc(obs)}</pre></section>')
    body.append(f"<details class=raw><summary>raw output</summary><pre>{esc(out)}</pre></details>")
    return (
        f'<li class="turn turn-{kind}" data-turn="{n}" data-label="{esc(label)}"><div class="turn-head">'
        + " · ".join(f"<span>{esc(h)}</span>" for h in head)
        + f"</div>{''.join(body)}</li>"
    )


# --------------------------------------------------------------------------- synthesis


# The fields of `asearch.synth` output rows (`SynthQuestion.to_row`) and of their steps (`EditStep.to_dict`);
# anything else in a record is listed under "other", so nothing a producer wrote is hidden.
_STEP_SHOWN = {
    "round", "action", "question", "kept", "rejected_by", "reason",
    "direct_accuracy", "direct_answers", "statements_added",
}  # fmt: skip
_STATEMENT_SHOWN = {"text", "url", "entity", "relation", "value"}
_SHOWN_SYNTH = {
    "id", "question", "answer", "aug_answer", "qa", "statements", "edit_history", "edits",
    "unique_verified", "direct_accuracy",
}  # fmt: skip


def word_diff(before: str, after: str) -> str:
    """`after` with words added marked <ins> and words removed shown as <del> (escaped)."""
    a, b = before.split(), after.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(esc(" ".join(b[j1:j2])))
            continue
        if op in ("replace", "delete"):
            out.append(f"<del>{esc(' '.join(a[i1:i2]))}</del>")
        if op in ("replace", "insert"):
            out.append(f"<ins>{esc(' '.join(b[j1:j2]))}</ins>")
    return " ".join(out)


def _accuracy(x: Any) -> str | None:
    return _fmt(float(x)) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _statement(s: Any) -> str:
    if not isinstance(s, Mapping):
        return f"<li>{esc(s)}</li>"
    text, url = s.get("text"), s.get("url")
    # the graph backend also records the fact itself; the LLM backend leaves these empty
    fact = [str(s[k]) for k in ("entity", "relation", "value") if s.get(k) not in (None, "")]
    shown = _STATEMENT_SHOWN if len(fact) == 3 else {"text", "url"}  # a partial fact is listed as it is
    rest = {k: v for k, v in s.items() if k not in shown and not (k in _STATEMENT_SHOWN and v in (None, ""))}
    return (
        f"<li>{esc(text if text is not None else json.dumps(dict(s), ensure_ascii=False))}"
        + (f' <span class="src">{safe_link(url, _clip(url, 80))}</span>' if url else "")
        + (f' <span class="muted fact">{esc(" · ".join(fact))}</span>' if len(fact) == 3 else "")
        + (f' <span class="muted">{esc(json.dumps(rest, ensure_ascii=False))}</span>' if rest else "")
        + "</li>"
    )


def _statements(items: Any) -> str:
    if not isinstance(items, list) or not items:
        return ""
    return (
        f"<details open><summary>Statements ({len(items)})</summary>"
        f'<ol class="statements">{"".join(_statement(s) for s in items)}</ol></details>'
    )


def _verdict(step: Mapping[str, Any]) -> str:
    kept = step.get("kept")
    if kept is True:
        return '<span class="badge correct">kept</span>'
    if kept is False:
        gate = step.get("rejected_by")
        return f'<span class="badge wrong">rejected{esc(f" by {gate}" if gate else "")}</span>'
    return '<span class="muted">–</span>'  # a producer that does not record the gates' verdict


def _edit_history(steps: Any) -> str:
    """Every step with its operator, the gates' verdict and the direct-answer accuracy. Each step's changes
    are shown against the last KEPT version, the one the operator edited: a rejected proposal changed
    nothing, so it is never the "before" of the next step."""
    if not isinstance(steps, list) or not steps:
        return ""
    rows: list[str] = []
    base: tuple[int, str] | None = None  # (step number, question) of the last kept version
    for i, step in enumerate(steps, start=1):
        if not isinstance(step, Mapping):
            rows.append(f"<tr><td>{i}</td><td colspan=5>{esc(step)}</td></tr>")
            continue
        rejected = step.get("kept") is False
        question = step.get("question")
        if not isinstance(question, str):
            changes = '<span class="muted">(no question)</span>'
        elif base is None:
            changes = esc(question)
        else:
            changes = word_diff(base[1], question)
            if base[0] != i - 1:  # the row above is not what this step edited
                changes += f' <span class="muted against">(changes vs. #{base[0]})</span>'
        if isinstance(question, str) and not rejected:
            base = (i, question)
        reason = step.get("reason")
        if reason:
            changes += f'<div class="muted reason">{esc(reason)}</div>'
        action = esc(step.get("action"))
        if isinstance(step.get("round"), int):
            action += f' <span class="muted">round {step["round"]}</span>'
        acc = _accuracy(step.get("direct_accuracy"))
        acc_cell = esc(acc) if acc is not None else '<span class="muted" title="not measured">–</span>'
        answers = step.get("direct_answers")
        other = []
        if isinstance(answers, list) and answers:
            other.append(f'<div class="answers">direct answers: {esc(" | ".join(map(str, answers)))}</div>')
        added = step.get("statements_added")
        if isinstance(added, list) and added:
            other.append(f'<ol class="statements added">{"".join(_statement(s) for s in added)}</ol>')
        rest = {k: v for k, v in step.items() if k not in _STEP_SHOWN}
        if rest:
            other.append(_kv_table(rest))
        rows.append(
            f'<tr class="{"rejected" if rejected else "kept"}"><td>{i}</td><td><b>{action}</b></td>'
            f"<td>{_verdict(step)}</td><td>{changes}</td><td>{acc_cell}</td><td>{''.join(other)}</td></tr>"
        )
    kept = kept_edits(steps)
    rejected_n = sum(1 for s in steps if isinstance(s, Mapping) and s.get("kept") is False)
    counts = f"{kept} kept edit{'' if kept == 1 else 's'}" + (
        f", {rejected_n} rejected" if rejected_n else ""
    )
    return (
        f"<details open><summary>Edit history: {esc(counts)}</summary>"
        '<table class="edits"><thead><tr><th>#</th><th>action</th><th>gates</th><th>question (changes)</th>'
        f"<th>direct-answer acc.</th><th>other</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
    )


def synth_card(number: int, rec: Mapping[str, Any], question: str, answer: str) -> str:
    """One synthesised question: answers and paraphrases as text, badges, statements, edit history."""
    badges = []
    verified = rec.get("unique_verified")
    if isinstance(verified, bool):
        how = rec.get("uniqueness") if isinstance(rec.get("uniqueness"), Mapping) else {}
        tip = " · ".join(str(how[k]) for k in ("method", "detail") if how.get(k))
        title = f' title="{esc(tip)}"' if tip else ""
        badges.append(
            f'<span class="badge correct"{title}>unique ✓ verified</span>'
            if verified
            else f'<span class="badge wrong"{title}>not verified unique</span>'
        )
    history = rec.get("edit_history") if isinstance(rec.get("edit_history"), list) else []
    # the accuracy of the question as written: the row's own, else that of the last kept version (a
    # rejected proposal's accuracy belongs to a question that was thrown away)
    acc = _accuracy(rec.get("direct_accuracy"))
    if acc is None:
        kept = [s for s in history if isinstance(s, Mapping) and s.get("kept") is not False]
        acc = _accuracy(kept[-1].get("direct_accuracy")) if kept else None
    if acc is not None:
        badges.append(f'<span class="badge">direct-answer acc. {esc(acc)}</span>')
    if history:
        n = kept_edits(history)
        badges.append(f'<span class="badge">{n} kept edit{"" if n == 1 else "s"}</span>')
    paraphrases = answer_text(rec.get("aug_answer"))
    rest = {k: v for k, v in rec.items() if k not in _SHOWN_SYNTH}
    extra = (
        f"<details><summary>Other fields ({len(rest)})</summary>"
        f"<pre>{esc(_clip(json.dumps(rest, indent=1, ensure_ascii=False), 20000))}</pre></details>"
        if rest
        else ""
    )
    rid = rec.get("id")
    return (
        f'<article class="synth-card"><h3><span class="muted">#{number}'
        + (f" {esc(rid)}" if isinstance(rid, str) else "")
        + f"</span> {esc(question)}</h3>"
        f'<p class="answer"><b>Answer:</b> <span class="answers">{esc(answer)}</span>'
        + (f' <span class="paraphrases"><b>paraphrases:</b> {esc(paraphrases)}</span>' if paraphrases else "")
        + f" {' '.join(badges)}</p>"
        f"{_statements(rec.get('statements'))}{_edit_history(history)}{extra}</article>"
    )


def synth_page(
    *,
    runs: Sequence[tuple[str, str]],
    run_id: str | None,
    cards: Sequence[str],
    matched: int,
    total: int,
    verified: int,
    page: int,
    page_size: int,
    text: str,
    only_verified: bool,
    report: Any,
) -> str:
    run_opts = "".join(
        f'<option value="{esc(rid)}"{" selected" if rid == run_id else ""}>{esc(name)}</option>'
        for rid, name in runs
    )
    form = (
        '<form class="filters" method="get" action="/synth">'
        f'<label>run <select name="run">{run_opts}</select></label>'
        f'<label>text <input name="q" type="search" value="{esc(text)}" placeholder="question or answer"></label>'
        f'<label><input type="checkbox" name="verified" value="1"{" checked" if only_verified else ""}> verified only</label>'
        '<button type="submit">filter</button></form>'
    )
    base = {"run": run_id, "q": text, "verified": "1" if only_verified else ""}
    head = f'<p class="muted">{matched} of {total} questions shown ({verified} verified unique)</p>'
    filters = (
        f"<details><summary>Filter report (filter_report.json)</summary>{_kv_table(report)}</details>"
        if isinstance(report, dict)
        else ""
    )
    return (
        f"<h1>Synthesis</h1>{form}{head}{filters}"
        f'<div class="synth">{"".join(cards) or "<p class=muted>nothing matches</p>"}</div>'
        + _pager("/synth", base, page, matched, page_size, "previous", "next")
    )
