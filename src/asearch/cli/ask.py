"""`asearch ask "question"`: one agent episode with a live view of every turn."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel

from asearch.cli.console import ConfigOption, OverridesArg, console
from asearch.engine.registry import engine_kind, engine_kinds

ENGINE_HELP = (
    f"Engine kind: {' | '.join(engine_kinds())}; its options are engine.<key>=value overrides "
    "(docs/engines.md)."
)
BASE_URL_HELP = (
    f"Server of a remote engine kind ({', '.join(k for k in engine_kinds() if engine_kind(k).needs_url)}): "
    "http://host:port."
)
STYLE_HELP = "asearcher | reasoning | search-r1 | guided (the default for smollm2-135m-instruct, else asearcher)"


def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    config: ConfigOption = None,
    overrides: OverridesArg = None,
    engine: Annotated[str | None, typer.Option(help=ENGINE_HELP)] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model name, directory or alias (smollm2-135m-instruct); for a server, its served name."),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help=BASE_URL_HELP)
    ] = None,
    corpus: Annotated[str | None, typer.Option(help="wiki10k | world[:seed] | jsonl path (indexed on first use).")] = None,
    index: Annotated[Path | None, typer.Option(help="A prebuilt index directory.")] = None,
    server_url: Annotated[str | None, typer.Option(help="A retrieval server url (asearch serve).")] = None,
    style: Annotated[str | None, typer.Option(help=STYLE_HELP)] = None,
    max_turns: Annotated[int | None, typer.Option(help="LLM calls, reading turns included.")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy (the default here).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole trajectory as JSON on stdout.")] = False,
) -> None:
    """Answer QUESTION with a search agent (default: SmolLM2-135M-Instruct over wiki10k with BM25)."""
    from asearch.agent.runtime import RuntimeConfig, apply_model_style_default, build_runtime
    from asearch.config import load_config

    flags = {
        "engine.kind": engine,
        "engine.model": model,
        "engine.base_url": base_url,
        "tools.corpus": corpus,
        "tools.index": index,
        "tools.server_url": server_url,
        "agent.style": style,
        "agent.max_turns": max_turns,
        "agent.temperature": temperature,
    }
    extra = [f"{k}={v}" for k, v in flags.items() if v is not None]
    if index is not None or server_url is not None:
        extra.append("tools.corpus=null")
    cfg = load_config(RuntimeConfig, config, [*extra, *(overrides or [])])
    if note := apply_model_style_default(cfg):
        console.print(f"[dim]{escape(note)}[/dim]")

    async def main():
        with console.status("loading model and index ..."):
            runtime = build_runtime(cfg)
        try:
            return await runtime.run(question, seed=seed, on_turn=None if as_json else _show_turn)
        finally:
            await runtime.close()

    traj = asyncio.run(main())
    if as_json:
        print(json.dumps(traj.to_dict(), ensure_ascii=False))
        return
    c = traj.counters
    console.print(
        f"[bold]answer:[/bold] {escape(traj.answer) if traj.answer is not None else '[red](none)[/red]'}   "
        f"[dim]finish={traj.finish} turns={traj.num_turns} searches={c.get('searches', 0)} "
        f"accesses={c.get('accesses', 0)} parse_errors={c.get('parse_errors', 0)} "
        f"tool_errors={c.get('tool_errors', 0)} tokens={traj.generated_tokens} {traj.wall_s:.1f}s[/dim]"
    )


def _show_turn(turn) -> None:
    n = getattr(_show_turn, "n", 0) + 1
    _show_turn.n = n  # type: ignore[attr-defined]
    body = escape(turn.output_text.strip())
    if turn.parse_error:
        body += f"\n[yellow]parse error:[/yellow] {escape(turn.parse_error)}"
    if turn.tool_error:
        body += f"\n[red]tool error:[/red] {escape(turn.tool_error)}"
    if turn.observation and not turn.parse_error:
        obs = turn.observation.strip()
        body += "\n[dim]" + escape(obs[:600] + (" ..." if len(obs) > 600 else "")) + "[/dim]"
    title = f"turn {n} · {turn.kind}" + (f" · {turn.action}" if turn.action else "")
    console.print(Panel(body, title=title, title_align="left", subtitle=f"{turn.output_tokens} tok, "
                        f"{turn.llm_latency_s:.2f}s", subtitle_align="right"))
