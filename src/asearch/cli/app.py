"""Top-level `asearch` app: mounts each command group and turns AsearchError into `Type: message`, exit 1."""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from asearch import __version__
from asearch.cli import ask, configs, corpus, index, plan, serve, sim, synth, train
from asearch.cli import engine as engine_cli
from asearch.cli import eval as eval_cli
from asearch.cli import view as view_cli
from asearch.cli.console import console
from asearch.errors import AsearchError

app = typer.Typer(
    name="asearch",
    help="Train, run and evaluate long-horizon LLM search agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(corpus.app, name="corpus")
app.add_typer(index.app, name="index")
app.command("serve")(serve.serve)
app.add_typer(engine_cli.app, name="engine")
app.command("ask")(ask.ask)
app.command("train")(train.train)
app.command("demo")(train.demo)
app.command("plan")(plan.plan)
app.command("sim")(sim.sim)
app.command("view")(view_cli.view)
app.add_typer(eval_cli.app, name="eval")
app.add_typer(eval_cli.data_app, name="data")
app.add_typer(synth.app, name="synth")
app.add_typer(configs.app, name="config")


@app.command()
def version() -> None:
    """Print the asearch version."""
    print(__version__)


def main() -> None:
    if not sys.stderr.isatty():  # a log file gets no tqdm bars from transformers / huggingface_hub (one per line)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        app()
    except AsearchError as e:
        console.print(f"[red]{type(e).__name__}[/red]: {escape(str(e))}")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        raise SystemExit(130) from None
