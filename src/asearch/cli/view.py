"""`asearch view RUN_DIR...`: serve a local page with live curves, eval tables, trajectories and synthesis output."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from asearch.cli.console import console, from_options
from asearch.errors import AsearchError


def view(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories (train, eval, demo, synth) or trajectory files (`asearch ask --json` output); "
            "a directory holding runs is searched.",
            exists=True,
            show_default=False,
        ),
    ],
    host: Annotated[
        str, typer.Option(help="Bind address; anything but loopback shows your runs to the whole network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0 = any free port).")] = 8765,
    poll_s: Annotated[float, typer.Option(help="Seconds between the page's live updates.")] = 2.0,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the page in the default browser.")
    ] = False,
) -> None:
    """Serve a web page on 127.0.0.1 showing RUNS: training curves (live), eval tables, trajectories, synthesis."""
    import uvicorn

    from asearch.net import free_port, is_loopback
    from asearch.view import ViewConfig, create_app

    cfg = from_options(ViewConfig, {"host": host, "port": port, "poll_s": poll_s})
    if not is_loopback(cfg.host):
        console.print(
            Panel(
                f"Binding to [bold]{escape(cfg.host)}[/bold]: the viewer has no authentication, so anyone who can "
                "reach this machine can read every run, trajectory and config shown here.\n"
                "Use --host 127.0.0.1 (the default) and an SSH tunnel to view from elsewhere.",
                title="WARNING: not a loopback address",
                border_style="red",
            )
        )
    if cfg.port == 0:
        cfg = cfg.model_copy(update={"port": free_port(cfg.host)})
    problem = _bind_problem(cfg.host, cfg.port)
    if problem:
        raise AsearchError(
            f"cannot listen on {cfg.host}:{cfg.port} ({problem}); pick another --port (0 = any free one)"
        )
    app = create_app(runs, cfg)
    catalog = app.state.catalog

    table = Table(title="runs", show_edge=False)
    for col in ("kind", "name", "path"):
        table.add_column(col)
    for run in catalog.runs.values():
        table.add_row(run.kind, escape(run.name), escape(str(run.path)))
    console.print(table)
    for root in catalog.empty_roots:
        console.print(
            f"[yellow]no run files yet in {escape(str(root))}[/yellow] (searched again every few seconds)"
        )

    shown = cfg.host if cfg.host not in ("0.0.0.0", "::") else "<this-host>"
    url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{cfg.port}/"
    console.print(f"[bold green]asearch view[/bold green] on {url}  (Ctrl-C to stop)")
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False)


def _bind_problem(host: str, port: int) -> str | None:
    """Why uvicorn could not listen on host:port (None: it can), found before the page is announced."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None
