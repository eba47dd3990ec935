"""`asearch serve --index DIR`: serve an index over HTTP (/retrieve, /access, /health, /stats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel

from asearch.cli.console import ConfigOption, console, from_options, overrides_argument
from asearch.config import load_config


def serve(
    index: Annotated[
        Path, typer.Option("--index", help="Index directory (from `asearch index build`).", file_okay=False)
    ],
    host: Annotated[
        str | None, typer.Option(help="Bind address (default 127.0.0.1); non-loopback exposes the corpus.")
    ] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 8000).")] = None,
    method: Annotated[str, typer.Option(help="Search method: bm25 | dense | hybrid (or a registered one).")] = "bm25",
    config: ConfigOption = None,
    overrides: Annotated[list[str] | None, overrides_argument("max_batch=128 default_topk=5")] = None,
) -> None:
    """Serve an index over HTTP: Search-R1/ASearcher-compatible /retrieve and /access, plus /health, /stats."""
    from asearch.net import free_port, is_loopback
    from asearch.retrieval.server import ServerConfig, app_from_index, run_server

    base = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    cfg = load_config(ServerConfig, config, overrides or [])
    if base:  # explicit --host/--port win over the file and the overrides
        cfg = from_options(ServerConfig, base, over=cfg)
    if cfg.port == 0:  # pick the port now so the url printed below is the one that will answer
        cfg = ServerConfig.model_validate({**cfg.model_dump(), "port": free_port(cfg.host)})
    with console.status(f"opening index {escape(str(index))} ({method})"):
        app, info = app_from_index(index, method=method, cfg=cfg)

    shown_host = cfg.host if cfg.host not in ("0.0.0.0", "::") else "<this-host>"
    url = f"http://{shown_host}:{cfg.port}"
    if not is_loopback(cfg.host):
        console.print(
            Panel(
                f"Binding to [bold]{escape(cfg.host)}[/bold]: the server has no authentication, so anyone who "
                "can reach this machine can search the index and read every page.\n"
                "Use --host 127.0.0.1 (the default) unless other machines must connect.",
                title="WARNING: not a loopback address",
                border_style="red",
            )
        )
    example = json.dumps({"queries": ["who wrote hamlet"], "topk": 3, "return_scores": True})
    header = "Content-Type: application/json"
    curls = [
        f"curl -s {url}/health",
        f"curl -s -X POST {url}/retrieve -H '{header}' -d '{example}'",
        f"curl -s -X POST {url}/access -H '{header}' -d '{json.dumps({'urls': ['<url from a search hit>']})}'",
        f"curl -s {url}/stats",
    ]
    console.print(
        f"[bold green]asearch retrieval server[/bold green] at [bold]{escape(url)}[/bold]  "
        f"({info['passages']:,} passages, {info['pages']:,} pages, method {method})",
        soft_wrap=True,
    )
    console.print("\n".join(f"  {escape(c)}" for c in curls), highlight=False, soft_wrap=True)
    run_server(app, cfg)
