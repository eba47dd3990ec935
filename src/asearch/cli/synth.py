"""`asearch synth CONFIG`: synthesise hard QA (resumable), and `asearch synth report|measure` on its output.

`asearch synth CONFIG [OVERRIDES] --out DIR` is short for `asearch synth run CONFIG ...`: the first
argument is taken as the config unless it names a subcommand.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

from asearch.cli.console import OverridesArg, config_argument, console, progress
from asearch.errors import AsearchError


class _RunByDefault(TyperGroup):
    """A command group whose first argument, unless it names a subcommand (or is an option), goes to `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_RunByDefault,
    help="Synthesise hard, grounded QA with INJECT/FUZZ edits behind quality, difficulty and uniqueness gates. "
    "`asearch synth CONFIG` runs (or resumes) a synthesis; see `asearch synth run --help`.",
    no_args_is_help=True,
)


@app.command("run")
def run(
    config: Annotated[Path, config_argument("Synthesis YAML (configs/synth-*.yaml).")],
    overrides: OverridesArg = None,
    out: Annotated[Path | None, typer.Option(help="Output dir (rerun with it to resume).")] = None,
    show_progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")
    ] = True,
) -> None:
    """Run (or resume) a synthesis: writes questions.jsonl, attempts.jsonl and filter_report.{json,md}.

    Exits non-zero when a server it calls cannot be reached (before any seed starts) or when no question
    was written.

    Examples: `asearch synth configs/synth-world.yaml --out runs/synth/world0`;
    `asearch synth configs/synth-llm.yaml llm.generator.engine.base_url=http://127.0.0.1:8000/v1`;
    `asearch synth configs/synth-agent.yaml` (an agent picks each edit; docs/synthesis.md).
    Killed, the same command continues where it stopped.
    """
    from asearch.config import load_config
    from asearch.synth import SynthConfig, run_synthesis

    cfg = load_config(SynthConfig, config, [*(overrides or []), *([f"out={out}"] if out else [])])
    out_dir = cfg.out or Path("runs") / "synth" / f"{config.stem}-seed{cfg.seed}"
    with progress() if show_progress else contextlib.nullcontext() as bar:
        task = bar.add_task("synth", total=cfg.n_questions, rate="") if bar is not None else None

        def on_progress(p: Any) -> None:  # an asearch.synth.pipeline.Progress
            if bar is not None:
                rate = f"{p.finished}/{p.seeds} seeds" + (f", {p.errors} raised" if p.errors else "")
                bar.update(task, completed=min(p.distinct, p.target), rate=rate)

        summary = run_synthesis(cfg, out_dir, log=console.print, on_progress=on_progress)
    _print_summary(summary.report, summary.out_dir)
    empty = summary.why_empty()
    if empty is not None:  # a run that produced nothing is a failure, whatever the reason
        raise AsearchError(empty)


@app.command("report")
def report(
    out_dir: Annotated[Path, typer.Argument(help="A synthesis output dir.", exists=True, file_okay=False)],
) -> None:
    """Rebuild questions.jsonl and the filter report from a run's attempts log (no model is called)."""
    from asearch.config import load_config
    from asearch.synth import SynthConfig, finalize

    cfg = load_config(SynthConfig, out_dir / "config.yaml")
    summary = finalize(out_dir, cfg)
    _print_summary(summary.report, out_dir)


@app.command("measure")
def measure(
    dataset: Annotated[str, typer.Argument(help="questions.jsonl of a run (or any dataset spec).")],
    out: Annotated[Path, typer.Option(help="Output dir (rerun with it to resume).")],
    limit: Annotated[int | None, typer.Option(help="First N questions (default: all).")] = None,
    direct_model: Annotated[
        str, typer.Option(help="Tool-less model (HF dir or alias).")
    ] = "smollm2-135m-instruct",
    agent: Annotated[
        str,
        typer.Option(
            help="expert: the oracle that knows the hops but must read each value through BM25 search "
            "(graph questions); model: an LLM agent (--agent-model)."
        ),
    ] = "expert",
    agent_model: Annotated[
        str, typer.Option(help="The agent's model (HF dir or alias); for the expert, only its tokenizer.")
    ] = "smollm2-135m-instruct",
    corpus: Annotated[
        str | None, typer.Option(help="Corpus the agent searches (default: the records').")
    ] = None,
    max_turns: Annotated[int, typer.Option(help="Agent LLM calls per question.")] = 8,
    topk: Annotated[int, typer.Option(help="Search results per query.")] = 5,
    act_prefixes: Annotated[
        str,
        typer.Option(
            help="--agent model: openings of the act turns, e.g. '<search>,<answer>' (search once, answer)."
        ),
    ] = "",
    concurrency: Annotated[int, typer.Option(help="Questions in flight.")] = 32,
    threads: Annotated[int, typer.Option(help="Torch threads.")] = 1,
    skip_agent: Annotated[bool, typer.Option(help="Only the tool-less model.")] = False,
) -> None:
    """How hard are the questions: a tool-less model vs. a search agent, same questions, same metrics."""
    import asyncio

    from asearch.errors import ConfigError
    from asearch.synth.measure import MeasureSettings, measure_difficulty

    if agent not in ("expert", "model"):
        raise ConfigError(f"--agent must be expert or model, got {agent!r}")
    kind: Literal["expert", "model"] = "expert" if agent == "expert" else "model"
    settings = MeasureSettings(
        dataset=dataset, out=out, limit=limit, direct_model=direct_model, agent=kind, agent_model=agent_model,
        corpus=corpus, max_turns=max_turns, topk=topk, concurrency=concurrency, threads=threads,
        skip_agent=skip_agent, act_prefixes=tuple(p for p in act_prefixes.split(",") if p),
    )  # fmt: skip
    results = asyncio.run(measure_difficulty(settings, log=console.print))
    print(json.dumps(results, indent=2))


def _print_summary(report: dict, out_dir: Path) -> None:
    q, s = report["questions"], report["seeds"]
    console.print(
        f"[bold]synth[/bold] {q['written']} questions written ({q['accepted']} accepted, "
        f"{q['near_duplicates_removed']} near-duplicates removed) from {s['finished']} seeds; "
        f"uniqueness verified for {q['unique_verified']}; report: {escape(str(out_dir / 'filter_report.md'))}"
    )

