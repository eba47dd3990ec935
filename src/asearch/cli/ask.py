"""`asearch ask "question"`: one agent episode with a live view of every turn, then the answer beside the
evidence the agent read."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.panel import Panel

from asearch.cli.console import ConfigOption, console, overrides_argument
from asearch.engine.registry import engine_kind, engine_kinds

ENGINE_HELP = (
    f"Engine kind: {' | '.join(engine_kinds())}; its options are engine.<key>=value overrides "
    "(docs/engines.md)."
)
BASE_URL_HELP = (
    f"Server of a remote engine kind ({', '.join(k for k in engine_kinds() if engine_kind(k).needs_url)}): "
    "http://host:port."
)
STYLE_HELP = (
    "asearcher (search, access, a summary after each result) | reasoning (short notes, for large reasoning "
    "models) | search-r1 (search and answer) | guided (the loop opens <search> then <answer> for the model: "
    "the default for smollm2-135m-instruct, else asearcher). docs/agent.md."
)
REAL_ANSWERS_HINT = (
    "SmolLM2-135M checks the plumbing; it does not research. For real answers serve a capable model "
    "(`asearch engine serve MODEL_DIR`, vLLM, or any OpenAI-compatible API) and ask it with "
    "`--engine openai --base-url URL --model NAME` (docs/engines-remote.md)."
)


def ask(
    question: Annotated[str, typer.Argument(help="The question to research.")],
    config: ConfigOption = None,
    overrides: Annotated[list[str] | None, overrides_argument("agent.max_turns=8 tools.search.topk=3")] = None,
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
    replay: Annotated[
        Path | None,
        typer.Option(help="Answer every search/access from this run's (or record dir's) tool record only; "
                     "asks are recorded under $ASEARCH_CACHE/tool-record/<source> (docs/replay.md)."),
    ] = None,
) -> None:
    """Answer QUESTION with a search agent and show the evidence it read (default: SmolLM2-135M-Instruct over
    wiki10k with BM25, a plumbing check; for real answers serve a capable model with `asearch engine serve` or
    vLLM and pass --engine openai --base-url URL --model NAME)."""
    from asearch.agent.runtime import RuntimeConfig, apply_model_style_default, build_runtime
    from asearch.config import load_config
    from asearch.tools.build import shared_record_dir

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
        "tools.record.replay": replay,
    }
    extra = [f"{k}={v}" for k, v in flags.items() if v is not None]
    if index is not None or server_url is not None:
        extra.append("tools.corpus=null")
    cfg = load_config(RuntimeConfig, config, [*extra, *(overrides or [])])
    if note := apply_model_style_default(cfg):
        console.print(f"[dim]{escape(note)}[/dim]")

    async def main():
        with console.status("loading model and index ..."):
            runtime = build_runtime(cfg, record_dir=shared_record_dir(cfg.tools))  # no run dir of its own
        try:
            return await runtime.run(question, seed=seed, on_turn=None if as_json else _show_turn)
        finally:
            await runtime.close()

    traj = asyncio.run(main())
    if as_json:
        print(json.dumps(traj.to_dict(), ensure_ascii=False))
        return
    _show_result(traj, small_model=cfg.engine.kind == "inprocess" and _is_small_model(cfg.engine.model))


def _is_small_model(model: str) -> bool:
    from asearch.agent.runtime import SMALL_INSTRUCT_MODELS

    return model.lower() in SMALL_INSTRUCT_MODELS


def _show_result(traj: Any, *, small_model: bool) -> None:
    """The answer (or that there is none) with the episode's counters, the evidence, and for the default
    small model where real answers come from."""
    c = traj.counters
    stats = (
        f"[dim]finish={traj.finish} turns={traj.num_turns} searches={c.get('searches', 0)} "
        f"accesses={c.get('accesses', 0)} parse_errors={c.get('parse_errors', 0)} "
        f"tool_errors={c.get('tool_errors', 0)} tokens={traj.generated_tokens} {traj.wall_s:.1f}s[/dim]"
    )
    if traj.answer is None:
        console.print(f"[bold]no answer[/bold]: the episode ended with finish={traj.finish}   {stats}")
    else:
        console.print(f"[bold]answer:[/bold] {escape(traj.answer)}   {stats}")
    _show_evidence(read_evidence(traj.turns), traj.answer)
    if small_model:
        console.print(f"[dim]{escape(REAL_ANSWERS_HINT)}[/dim]")


# --------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class Passage:
    """One passage the agent read: a search hit (`[Doc k](url):` + title line + text) or a page chunk."""

    title: str
    url: str
    text: str


# `[Doc k](url):` then the title line and text, or `[Doc k](url) text` (compact); `[page k/n of url]` (access)
_DOC = re.compile(r"^\[Doc \d+\](?:\((\S*)\))?(:\n| )", re.M)
_PAGE = re.compile(r"^\[page \d+/\d+ of (\S+)\]\n", re.M)


def read_evidence(turns: list[Any]) -> list[Passage]:
    """The passages in the tool results an episode read (tools/render.py's formats), first seen first."""
    seen: dict[tuple[str, str], Passage] = {}
    for turn in turns:
        if not turn.observation or turn.parse_error or turn.tool_error:
            continue
        for p in _passages(turn.observation):
            seen.setdefault((p.url, p.text), p)
    return list(seen.values())


def _passages(text: str) -> list[Passage]:
    out = []
    for pattern in (_DOC, _PAGE):
        marks = list(pattern.finditer(text))
        ends = [m.start() for m in marks[1:]] + [len(text)] if marks else []
        for m, end in zip(marks, ends, strict=True):
            body = text[m.end() : end].strip()
            url = m.group(1) or ""
            titled = pattern is _DOC and m.group(2) == ":\n" and "\n" in body
            label = url.rsplit("/", 1)[-1] or m.group(0).split("]")[0] + "]"  # no title shown: the url's page name
            title, body = body.split("\n", 1) if titled else (label, body)
            out.append(Passage(title=title.strip().strip('"'), url=url, text=body.strip()))
    return out


def answer_lines(passage: Passage, answer: str | None, *, limit: int = 2) -> list[str]:
    """The sentences of `passage` that contain `answer` (case-insensitive), at most `limit`."""
    if not answer or not answer.strip():
        return []
    # a sentence ends at . ! ? after a lower-case letter or digit ("Arthur C. Clarke" stays whole)
    sentences = re.split(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z0-9\"'(])|\n+", passage.text)
    return [s.strip() for s in sentences if answer.strip().casefold() in s.casefold()][:limit]


def _show_evidence(passages: list[Passage], answer: str | None, *, shown: int = 5, width: int = 200) -> None:
    if not passages:
        console.print("[bold]evidence[/bold]: none (the agent read no search result or page)")
        return
    using = [(p, lines) for p in passages if (lines := answer_lines(p, answer))]
    if answer is not None and not using:
        console.print(f"[bold]evidence[/bold]: the answer occurs in none of the {len(passages)} passages read; they were:")
    elif answer is not None:
        verb = "contains" if len(using) == 1 else "contain"
        console.print(f"[bold]evidence[/bold]: {len(using)} of the {len(passages)} passages read {verb} the answer:")
    else:
        console.print(f"[bold]evidence[/bold]: the {len(passages)} passages read:")
    for p, lines in (using or [(p, []) for p in passages])[:shown]:
        console.print(f"  [bold]{escape(p.title)}[/bold]  [dim]{escape(p.url)}[/dim]")
        for line in lines or [p.text.split("\n", 1)[0]]:
            console.print(f"    > {escape(line if len(line) <= width else line[: width - 3] + '...')}")
    if len(using or passages) > shown:
        console.print(f"  [dim]... and {len(using or passages) - shown} more[/dim]")


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
