"""The demo's plots (reward and held-out accuracy against wall time; the long-horizon turn histogram and
accuracy by hops) and its short markdown report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asearch.files import atomic_write_text
from asearch.metrics.horizon import PER_EPISODE_MEANS


def write_plot(rows: list[dict[str, Any]], path: Path, *, before: float, after: float, temperature: float = 1.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t_r = [r["perf/rl_wall_s"] for r in rows if r.get("rollout/reward_mean") is not None]
    reward = [r["rollout/reward_mean"] for r in rows if r.get("rollout/reward_mean") is not None]
    t_e = [r["perf/rl_wall_s"] for r in rows if r.get("eval/heldout_acc") is not None]
    acc = [r["eval/heldout_acc"] for r in rows if r.get("eval/heldout_acc") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(t_r, reward, color="tab:blue", alpha=0.6, label=f"rollout reward (EM with format gate, sampled at T={temperature:g})")
    ax.plot(t_e, acc, "o-", color="tab:red", label="held-out accuracy (greedy, other world)")
    ax.axhline(before, color="grey", ls=":", label=f"held-out before RL ({before:.2f})")
    ax.axhline(after, color="tab:green", ls="--", label=f"held-out after RL ({after:.2f})")
    ax.set_xlabel("RL wall time (s)")
    ax.set_ylabel("reward / accuracy (exact match)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    """Save a figure as `path` through a temp file beside it (a reader never sees half a png), then close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def _bars(ax: Any, labels: list[str], columns: list[tuple[str, list[float], str]]) -> None:
    """Grouped bars: one group per label, one bar per (name, values, colour) column."""
    width = 0.8 / len(columns)
    for i, (name, values, color) in enumerate(columns):
        xs = [x + (i - (len(columns) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, values, width, label=name, color=color)
    ax.set_xticks(range(len(labels)), labels)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def _hop_keys(*stats: dict[str, Any] | None) -> list[str]:
    """The hop counts of `accuracy_by_hops` over all the given stats, in numeric order."""
    keys = {k for s in stats if s for k in s["accuracy_by_hops"]}
    return sorted(keys, key=int)


def _acc(stats: dict[str, Any] | None, hops: str) -> float | None:
    cell = (stats or {}).get("accuracy_by_hops", {}).get(hops)
    return cell["acc"] if cell else None


def write_horizon_plot(path: Path, before_stats: dict[str, Any] | None, after_stats: dict[str, Any]) -> None:
    """Two panels from `horizon_stats` dicts: the turn-count histogram (share of episodes per bin) and
    held-out accuracy by hop count, before RL (when given) beside after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [("before RL", before_stats, "grey"), ("after RL", after_stats, "tab:green")]
    runs = [r for r in runs if r[1] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    bins = list(after_stats["turn_histogram"])
    share = lambda s, b: s["turn_histogram"].get(b, 0) / max(1, s["episodes"])  # noqa: E731
    _bars(left, bins, [(name, [share(s, b) for b in bins], c) for name, s, c in runs])
    left.set_xlabel("turns per episode (reading turns included)")
    left.set_ylabel("share of held-out episodes")
    hops = _hop_keys(before_stats, after_stats)
    _bars(right, hops, [(name, [_acc(s, h) or 0.0 for h in hops], c) for name, s, c in runs])
    right.set_xlabel("hops of the question")
    right.set_ylabel("held-out accuracy (exact match)")
    right.set_ylim(0, 1)
    fig.tight_layout()
    _save(fig, path)


def _task(cfg: Any) -> str:
    if getattr(cfg, "pages", None) != "long":
        return ""
    return (", opening pages with `access` and reading them chunk by chunk, writing a summary of each "
            "(search results state no fact)")


def _mistakes(cfg: Any) -> str:
    if getattr(cfg, "pages", None) == "long":
        return "skip a hop, stop reading too early or summarise a distractor line"
    return "stop early or copy the wrong name"


def _waste(s: dict) -> str:
    generated = s.get("episodes_generated") or 0
    return f"{1 - s.get('episodes_kept', 0) / generated:.0%}" if generated else "-"


def _model_line(s: dict[str, Any], cfg: Any) -> str:
    model = getattr(cfg, "model", None)
    lora = getattr(getattr(cfg.rl, "trainer", None), "lora", None)
    adapters = f" with LoRA adapters (r={lora.r})" if lora is not None and lora.enabled else ""
    return f"{model} ({s['parameters']:,} parameters){adapters}" if model else f"A {s['parameters']:,}-parameter tiny Qwen2 model"


def write_report(path: Path, summary: dict[str, Any], cfg: Any) -> None:
    s = summary
    preset = getattr(cfg, "preset", "default")
    text = f"""# asearch CPU demo{'' if preset == 'default' else f' ({preset} preset)'} (seed {s['seed']})

{_model_line(s, cfg)} learns to answer 1-{max(cfg.hops)}-hop questions by searching a
synthetic encyclopedia with BM25 (top-{cfg.rl.tools.search.topk}, distractors included){_task(cfg)}. It is warm-started on scripted
expert trajectories that {_mistakes(cfg)}, then trained with fully asynchronous RL
(decoupled PPO, eta={cfg.rl.rollout.max_staleness}). Held-out questions come from another world.

| | value |
|---|---|
| held-out accuracy before RL | {s['heldout_acc_before']:.3f} |
| held-out accuracy after RL | {s['heldout_acc_after']:.3f} |
| change | {s['heldout_acc_after'] - s['heldout_acc_before']:+.3f} |
| RL wall time | {s['rl_wall_seconds']:.0f} s ({s['rl_steps']} steps) |
| SFT time | {s['sft_seconds']:.0f} s |
| total wall time | {s['wall_seconds']:.0f} s |
| rejected groups | {s['rejected_groups']} |
| episodes generated / in kept groups | {s.get('episodes_generated', 0)} / {s.get('episodes_kept', 0)} ({_waste(s)} wasted) |

![reward and held-out accuracy](curve.png)

Files: `rl/metrics.jsonl` (every step), `rl/trajectories.jsonl` (sampled episodes), `rl/checkpoints/`,
`data/` (questions), `model-sft/` (the supervised start).
"""
    if "horizon" in s:
        text += horizon_markdown(s["horizon"], s.get("horizon_before"))
    atomic_write_text(path, text)


def _num(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def horizon_markdown(after: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The long-horizon section of the report from `horizon_stats` dicts of the held-out episodes after RL
    (and before): turn histogram, tool calls and reading per episode, accuracy by hop count."""
    runs = [("before RL", before), ("after RL", after)] if before is not None else [("after RL", after)]
    names = [name for name, _ in runs]
    hist = [[b] + [str(s["turn_histogram"].get(b, 0)) for _, s in runs] for b in after["turn_histogram"]]
    means = [[label] + [_num(s[key]) for _, s in runs] for label, key in PER_EPISODE_MEANS]
    by_hops = []
    for h in _hop_keys(before, after):
        cells = [s["accuracy_by_hops"].get(h) for _, s in runs]
        by_hops.append([h] + [f"{_num(c['acc'], 3)} (n={c['n']})" if c else "–" for c in cells])
    headline = [
        ["heldout_mean_turns_after", _num(after["mean_turns"])],
        ["heldout_access_rate_correct", _num(after["access_rate_correct"], 3)],
        ["share of 4+ hop questions", _num(after["share_4plus_hops"], 3)],
    ]
    return f"""
## Long horizon ({after['episodes']} held-out episodes)

{_table(["", "value"], headline)}
Turns per episode (reading turns included), episodes per bin:

{_table(["turns", *names], hist)}
Per episode (mean):

{_table(["", *names], means)}
Held-out accuracy by hop count:

{_table(["hops", *names], by_hops)}
![turn histogram and accuracy by hops](horizon.png)
"""
