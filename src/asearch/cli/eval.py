"""`asearch eval` (run or resume an evaluation of the agent) and `asearch data fetch|list|show`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from asearch.cli.console import ConfigOption, OverridesArg, console
from asearch.errors import ConfigError

app = typer.Typer(
    help="Evaluate the agent on QA datasets (resumable; rerun the same command to continue).",
    subcommand_metavar="",  # a command of its own: no subcommands to list in the usage line
    context_settings={"allow_interspersed_args": True},  # options may follow the overrides, as in a command
)
data_app = typer.Typer(help="Fetch, list and inspect evaluation datasets.", no_args_is_help=True)
stdout = Console()


def _flag_overrides(**flags: Any) -> list[str]:
    """Explicit CLI flags as `eval.key=value` overrides (applied after the file and the positional overrides)."""
    out = []
    for key, value in flags.items():
        if value is None or value == [] or value is False:
            continue
        if isinstance(value, Path):
            value = str(value)
        out.append(f"eval.{key}={json.dumps(value)}")
    return out


def _run_config_model() -> type:
    """The YAML shape of `asearch eval -c` (`asearch.eval.job.EvalRunConfig`), imported on first use so that
    `asearch --help` does not import the agent runtime."""
    from asearch.eval.job import EvalRunConfig

    return EvalRunConfig


def _aggregate_config_model() -> type:
    """The same YAML shape with the runtime sections left unchecked (aggregating needs only `eval:`)."""
    from pydantic import Field

    from asearch.config import Config
    from asearch.eval.config import EvalConfig

    class AggregateConfig(Config):
        engine: dict[str, Any] = Field(default_factory=dict)
        tools: dict[str, Any] = Field(default_factory=dict)
        agent: dict[str, Any] = Field(default_factory=dict)
        eval: EvalConfig = Field(default_factory=EvalConfig)

    return AggregateConfig


DatasetOption = Annotated[list[str] | None, typer.Option(
    "--dataset", "-d", help="Dataset: world[:opts], wiki10k[:opts], a file, a dir, or a name under --data-dir. Repeatable."
)]  # fmt: skip
AggregateOption = Annotated[bool, typer.Option(
    "--aggregate-only", help="Recompute the summary from results on disk; run nothing."
)]  # fmt: skip
JudgeOption = Annotated[str | None, typer.Option(
    "--judge", help="local: serve the judge model (--judge-model, default smollm2-135m-instruct) for this run "
    "with `asearch engine serve` on a free loopback port, stopped at the end.",
)]  # fmt: skip
JudgeModelOption = Annotated[str | None, typer.Option(
    "--judge-model", help="Judge model: the name the --judge-url endpoint serves, or with --judge local a directory, "
    "Hugging Face name or alias.",
)]  # fmt: skip
ReplayOption = Annotated[Path | None, typer.Option(
    "--replay", help="Answer every search/access from RUN_DIR's tool record only, calling no backend; misses are "
    "refused and counted (docs/replay.md).",
)]  # fmt: skip
AllowEmptyOption = Annotated[bool, typer.Option(
    "--allow-empty", help="Accept a dataset file without questions (runs nothing)."
)]  # fmt: skip


@app.callback(invoke_without_command=True)
def eval_command(
    dataset: DatasetOption = None,
    k: Annotated[int | None, typer.Option("--k", help="Passes per question (Avg@k / Pass@k).")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="Comma-separated seed per pass (sets k).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", help="Questions in flight.")] = None,
    shard: Annotated[str | None, typer.Option("--shard", help="i/n: run one of n parts of the questions.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output dir (rerun with it to resume).")] = None,
    split: Annotated[str | None, typer.Option("--split", help="Split file under the data dir.")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Where fetched datasets live.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="First N questions of each dataset.")] = None,
    aggregate: AggregateOption = False,
    judge_url: Annotated[str | None, typer.Option("--judge-url", help="OpenAI-compatible judge base url.")] = None,
    judge: JudgeOption = None,
    judge_model: JudgeModelOption = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    replay: ReplayOption = None,
    allow_empty: AllowEmptyOption = False,
    config: ConfigOption = None,
    overrides: OverridesArg = None,
) -> None:
    """Run the agent on each question k times, score EM/F1/CEM (+ LLM judge), write results and summaries.

    Examples: `asearch eval -d world:hops=2 --k 4 tools.corpus=world:seed=1000`;
    `asearch eval -d nq -d hotpotqa --limit 500 -c configs/eval.yaml --judge-url http://127.0.0.1:8001/v1
    --judge-model Qwen2.5-72B-Instruct`; `asearch eval --out runs/eval/x --aggregate-only`.
    """
    from asearch.config import load_config

    seed_list = _parse_seeds(seeds) if seeds else None
    flags = _flag_overrides(
        datasets=dataset or None, k=len(seed_list) if seed_list else k, seeds=seed_list, concurrency=concurrency,
        shard=shard, out=out, split=split, data_dir=data_dir, limit=limit,
    )  # fmt: skip
    flags += _judge_and_replay_overrides(judge_url, judge_model, judge, replay)
    if aggregate:  # only eval.out / eval.datasets matter: skip importing (and validating) the agent runtime
        return _aggregate(load_config(_aggregate_config_model(), config, [*(overrides or []), *flags]))
    from asearch.eval.job import run_eval

    cfg = load_config(_run_config_model(), config, [*(overrides or []), *flags])
    _report(run_eval(cfg, allow_empty=allow_empty, progress=progress, console=console), cfg)


def _judge_and_replay_overrides(
    judge_url: str | None, judge_model: str | None, judge: str | None, replay: Path | None
) -> list[str]:
    """--judge-url, --judge-model, --judge local and --replay as overrides."""
    flags = []
    if judge_url:
        flags.append(f"eval.judge.engine.base_url={json.dumps(judge_url)}")
    if judge_model:  # the endpoint's served name, or (--judge local) the model to serve
        flags.append(f"eval.judge.{'engine.model' if judge_url else 'model'}={json.dumps(judge_model)}")
    if judge is not None:
        if judge != "local":
            raise ConfigError(
                f"--judge: the only value is 'local' (got {judge!r}); a server you run is --judge-url URL"
            )
        flags.append("eval.judge.local=true")
    if replay is not None:
        flags.append(f"tools.record.replay={json.dumps(str(replay))}")
    return flags


def _aggregate(light: Any) -> None:
    """--aggregate-only: the summary again from the results on disk."""
    from asearch.eval.config import default_out_dir
    from asearch.eval.report import AGGREGATED_COUNTERS
    from asearch.eval.runner import aggregate_only

    summary = aggregate_only(light.eval.out or default_out_dir(light.eval.datasets))
    _print_summary(summary.summary, summary.out_dir, counters_of=AGGREGATED_COUNTERS)


def _report(job: Any, cfg: Any) -> None:
    """The summary, the corpus coverage and the result counts; exit 1 when questions failed or none was scored."""
    summary = job.summary
    if summary is None:  # --allow-empty and no questions: run_eval said so
        return
    _print_summary(summary.summary, summary.out_dir)
    _print_coverage(job.records, cfg.tools)
    console.print(f"results: {summary.resumed} resumed, {summary.written} new, {summary.failed} failed")
    if summary.failed:
        console.print(
            f"[red]{summary.failed} questions failed[/red] (see {escape(str(summary.out_dir / 'errors.jsonl'))}); "
            "run the same command again to retry them"
        )
        raise typer.Exit(1)
    if summary.summary["overall"]["n"] == 0:  # asked to score questions, scored none
        console.print(
            f"[red]no question was scored[/red]: shard {cfg.eval.shard} holds none of the {len(job.records)} questions"
        )
        raise typer.Exit(1)


def _print_coverage(records: Any, tools_cfg: Any) -> None:
    """Beside the scores, how many gold answers the searched corpus holds, so a low score from a missing document
    is told from a bad agent (docs/retrieval.md); the scores stand whatever the check hits."""
    from asearch.eval.coverage import coverage_for_tools

    try:
        coverage = coverage_for_tools(records, tools_cfg)
        for line in coverage.lines() if coverage else []:
            console.print(escape(line), soft_wrap=True)
    except Exception as e:  # noqa: BLE001
        console.print(f"[dim]coverage not computed: {escape(str(e))}[/dim]")


def _parse_seeds(seeds: str) -> list[int]:
    """`--seeds 0,1,2` -> [0, 1, 2]; anything else is a ConfigError naming the option and the bad item."""
    out = []
    for item in seeds.split(","):
        try:
            out.append(int(item))
        except ValueError:
            raise ConfigError(f"--seeds: expected comma-separated integers, got {item!r} in {seeds!r}") from None
    return out


def _print_summary(summary: dict[str, Any], out_dir: Path, counters_of: str = "this invocation") -> None:
    from asearch.eval.report import render_markdown

    # plain: readable at any width
    print(render_markdown(summary, title=f"Evaluation: {out_dir}", counters_of=counters_of), end="")
    console.print(f"summary: {escape(str(out_dir / 'summary.json'))}, {escape(str(out_dir / 'summary.md'))}")


# --------------------------------------------------------------------------- asearch data


@data_app.command("fetch")
def data_fetch(
    name: Annotated[str, typer.Argument(help="A fetchable dataset (see `asearch data list`).")],
    out: Annotated[Path, typer.Option("--out", help="Data dir; writes <out>/<name>/test.jsonl.")] = Path(
        "data"
    ),
    source_file: Annotated[
        Path | None,
        typer.Option(
            "--from", help="Convert a local copy of the hub's files (jsonl/json/parquet/tsv/csv) instead."
        ),
    ] = None,
) -> None:
    """Download a public benchmark (needs network and `pip install datasets`) and convert it to asearch jsonl."""
    from asearch.eval.fetch import fetch_dataset

    result = fetch_dataset(name, out, source_file=source_file)
    skipped = ", ".join(f"{n} {reason}" for reason, n in result.skipped.items()) or "none"
    console.print(
        f"[green]wrote[/green] {result.count} questions to {escape(str(result.path))} (skipped: {skipped})"
    )


@data_app.command("list")
def data_list(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where fetched datasets live.")] = Path("data"),
) -> None:
    """Built-in sets, fetchable benchmarks (and whether they are in the data dir)."""
    from asearch.eval.fetch import FETCHABLE

    table = Table(title="evaluation datasets")
    for col in ("name", "source", "split", "local", "note"):
        table.add_column(col)
    table.add_row("world[:seed=,n=,hops=,entities=,qseed=]", "generated (held-out seed 1000)", "-", "built-in",
                  "k-hop questions with evidence; index the same world (tools.corpus)")  # fmt: skip
    table.add_row("wiki10k[:n=,seed=]", "generated from wiki10k", "-", "built-in",
                  "description -> article title; tools.corpus=wiki10k")  # fmt: skip
    for spec in FETCHABLE.values():
        local = data_dir / spec.name / "test.jsonl"
        n = sum(1 for _ in open(local, "rb")) if local.is_file() else None
        hub = spec.hub_id + (f" ({spec.config})" if spec.config else "")
        table.add_row(spec.name, hub, spec.split, f"{n} questions" if n is not None else "-", spec.note)
    stdout.print(table)


PREVIEW_CHARS = 300  # of each field `asearch data show` prints: a 50 MB question must not take minutes


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """`text` cut to its first `limit` characters, saying how many more there are."""
    return text if len(text) <= limit else f"{text[:limit]}… (+{len(text) - limit:,} chars)"


@data_app.command("show")
def data_show(
    spec: Annotated[str, typer.Argument(help="A dataset name, file, dir or built-in spec.")],
    n: Annotated[int, typer.Option("-n", min=0, help="How many questions to print.")] = 3,
    split: Annotated[str, typer.Option("--split")] = "test",
    data_dir: Annotated[Path, typer.Option("--data-dir")] = Path("data"),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print asearch jsonl lines, whole (the table cuts long fields).")
    ] = False,
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Report a file without questions instead of failing.")
    ] = False,
) -> None:
    """Count a dataset's questions and print the first few (validates the whole file; long fields are cut)."""
    from asearch.eval.datasets import dataset_name_for, is_builtin, load_dataset

    records = load_dataset(spec, split=split, data_dir=data_dir, allow_empty=allow_empty)
    if as_json:
        for r in records[:n]:
            print(json.dumps(r.to_jsonl_dict(), ensure_ascii=False))
        return
    name = records[0].dataset if records else spec if is_builtin(spec) else dataset_name_for(Path(spec))
    console.print(f"[bold]{escape(name)}[/bold]: {len(records)} questions")
    for r in records[:n]:
        golds = preview(" | ".join(r.golds))
        stdout.print(f"[bold]{escape(preview(r.id))}[/bold] {escape(preview(r.question))}\n  golds: {escape(golds)}")


@data_app.command("check")
def data_check(
    spec: Annotated[str, typer.Argument(help="A dataset name, file, dir or built-in spec.")],
    index: Annotated[Path, typer.Option("--index", help="Index directory (asearch index build / import).")],
    k: Annotated[int, typer.Option("--k", min=1, help="Retrieved passages per question.")] = 5,
    method: Annotated[str, typer.Option("--method", help="bm25 | dense | hybrid.")] = "bm25",
    limit: Annotated[int | None, typer.Option("--limit", help="First N questions.")] = None,
    split: Annotated[str, typer.Option("--split")] = "test",
    data_dir: Annotated[Path, typer.Option("--data-dir")] = Path("data"),
) -> None:
    """Per data_source: how many gold answers appear in the corpus at all, and in the top-k for the question."""
    from asearch.eval.coverage import check_coverage
    from asearch.eval.datasets import load_dataset
    from asearch.retrieval.index import open_index

    records = load_dataset(spec, split=split, data_dir=data_dir, limit=limit)
    with open_index(index) as opened:
        report = check_coverage(records, opened, k=k, method=method)
    console.print(f"{len(records)} questions against {escape(report.index)} ({report.passages:,} passages, "
                  f"{method} top-{k}), {report.seconds:.1f}s")  # fmt: skip
    for line in report.lines() + report.miss_lines():
        stdout.print(escape(line), soft_wrap=True)
