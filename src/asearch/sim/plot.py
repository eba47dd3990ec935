"""A figure of one `asearch sim` run: throughput per mode, and throughput against the rollout/trainer split."""

from __future__ import annotations

from pathlib import Path

from asearch.errors import ConfigError
from asearch.sim.model import SimResult, mode_name
from asearch.sim.run import SplitSearch


def plot_run(modes: list[SimResult], search: SplitSearch | None, path: str | Path, title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'asearch[cpu]' (or matplotlib)") from None
    fig, axes = plt.subplots(1, 2 if search else 1, figsize=(11 if search else 5.5, 3.8), squeeze=False)
    ax = axes[0][0]
    labels = [f"{r.name}\n{r.rollout_gpus}/{r.trainer_gpus} GPUs" for r in modes]
    bars = ax.bar(
        range(len(modes)), [r.trajectories_per_s for r in modes], color=[f"C{i}" for i in range(len(modes))]
    )
    for bar, r in zip(bars, modes, strict=True):
        ax.annotate(f"{r.trajectories_per_s:.2f}\nGPU idle {r.gpu_idle:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(modes)), labels, fontsize=7)
    ax.set_ylabel("trained trajectories/s")
    ax.set_ylim(0, max(r.trajectories_per_s for r in modes) * 1.3)
    ax.set_title("modes on the configured split", fontsize=9)
    if search:
        ax = axes[0][1]
        for i, (eta, rs) in enumerate(search.results.items()):
            name = mode_name(eta) + (f" (eta={eta})" if eta > 1 else "")
            ax.plot(
                [r.rollout_gpus for r in rs],
                [r.trajectories_per_s for r in rs],
                "o-",
                color=f"C{i}",
                label=name,
            )
            best = search.best[eta]
            ax.plot([best.rollout_gpus], [best.trajectories_per_s], "*", ms=14, color=f"C{i}")
        total = modes[0].rollout_gpus + modes[0].trainer_gpus
        ax.set_xlabel(f"rollout GPUs (of {total}; the rest train)")
        ax.set_ylabel("trained trajectories/s")
        ax.set_title("split search (* best split per mode)", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
