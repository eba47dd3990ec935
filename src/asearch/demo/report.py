"""The demo's plot (reward and held-out accuracy against wall time) and its short markdown report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asearch.files import atomic_write_text


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def write_report(path: Path, summary: dict[str, Any], cfg: Any) -> None:
    s = summary
    text = f"""# asearch CPU demo (seed {s['seed']})

A {s['parameters']:,}-parameter Qwen2 model learns to answer 1-{max(cfg.hops)}-hop questions by searching a
synthetic encyclopedia with BM25 (top-{cfg.rl.tools.search.topk}, distractors included). It is warm-started on scripted
expert trajectories that stop early or copy the wrong name, then trained with fully asynchronous RL
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

![reward and held-out accuracy](curve.png)

Files: `rl/metrics.jsonl` (every step), `rl/trajectories.jsonl` (sampled episodes), `rl/checkpoints/`,
`data/` (questions), `model-sft/` (the supervised start).
"""
    atomic_write_text(path, text)
