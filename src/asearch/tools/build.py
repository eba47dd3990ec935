"""Tools from config: `ToolsConfig` (where the data comes from, plus one section per tool) and
`build_tools(cfg) -> (tools, closers)`, or `async with open_tools(cfg) as tools` which closes them.

The sections come from the registry: every registered tool with a `config_class` gets `tools.<name>`
(`tools.search`, `tools.access`, `tools.find`, ...), on or off by the tool's `enabled_by_default`;
null turns a tool off and `{}` (or true) turns it on with its defaults. A new tool file appears here
with no edit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import AfterValidator, Field, create_model, model_validator

from asearch.config import Config
from asearch.files import cache_dir
from asearch.retrieval.base import SEARCH_METHODS
from asearch.retrieval.index import IndexConfig
from asearch.tools.base import Tool, ToolSources
from asearch.tools.faults import FaultConfig, fault_metrics, inject_faults
from asearch.tools.registry import configurable_tools
from asearch.tools.replay import (
    RECORD_DIR,
    ToolRecord,
    ToolRecordConfig,
    record_dir_of,
    record_metrics,
    record_sources,
)
from asearch.web.sources import WebConfig


class ToolSourceConfig(Config):
    """Where the tools get their data: one of a corpus (index built and cached), an index dir, a server,
    or the web. The corpus (it has a default) is ignored when one of the others is given."""

    tool_names: ClassVar[tuple[str, ...]] = ()  # the tool sections of the subclass ToolsConfig

    corpus: str | None = Field(
        "wiki10k", description="wiki10k | world[:seed] | a jsonl path; indexed on first use."
    )
    index: Path | None = Field(None, description="A prebuilt index directory (asearch index build).")
    server_url: str | None = Field(None, description="A retrieval server (asearch serve) to query over HTTP.")
    method: Annotated[str, AfterValidator(SEARCH_METHODS.check)] = Field(  # any registered search method
        "bm25", description="Search method for local indexes: bm25, dense, hybrid or any registered one."
    )
    build: IndexConfig = Field(
        default_factory=IndexConfig, description="Settings when the index must be built."
    )
    web: WebConfig | None = Field(
        None,
        description="Search and read the open web instead (e.g. tools.web.search=serper, tools.web.reader=direct, "
        "tools.web.cache.mode=cache_only); API keys come from environment variables only (docs/web.md).",
    )
    faults: FaultConfig | None = Field(
        None,
        description="Inject failures into a fraction of search/access calls (e.g. tools.faults.server_error=0.1, "
        "tools.faults.seed=3) to test a run against a flaky infrastructure; null: none (docs/tools.md).",
    )
    record: ToolRecordConfig = Field(
        default_factory=ToolRecordConfig,
        description="Record every search/access answer in the run directory (on by default; "
        "tools.record=false: off), or replay a run from its record (tools.record.replay=RUN_DIR, or "
        "--replay RUN_DIR): docs/replay.md.",
    )

    @model_validator(mode="before")
    @classmethod
    def _switches(cls, data: Any) -> Any:
        """`tools.<name>=true` turns a tool on with its defaults, `false` turns it off (as null does)."""
        if isinstance(data, dict) and any(isinstance(data.get(n), bool) for n in cls.tool_names):
            data = dict(data)
            for name in cls.tool_names:
                if isinstance(data.get(name), bool):
                    data[name] = {} if data[name] else None
        return data

    @model_validator(mode="after")
    def _one_source(self) -> ToolSourceConfig:
        given = [k for k in ("index", "server_url", "web") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of tools.index / tools.server_url / tools.web, got {given}")
        if not given and not self.corpus:
            raise ValueError("tools need a source: set tools.corpus, tools.index or tools.server_url")
        return self

    def enabled_tools(self) -> dict[str, Config]:
        """{tool name: its options} for every tool this config turns on, in prompt order."""
        return {name: opts for name in self.tool_names if (opts := getattr(self, name)) is not None}


def _tools_config_model() -> type[ToolSourceConfig]:
    """ToolSourceConfig plus a section `<name>: <config_class> | None` for every configurable tool."""
    specs = configurable_tools()
    sections: dict[str, Any] = {
        spec.name: (
            spec.config_class | None,
            Field(default_factory=spec.config_class, description=spec.section_description)
            if spec.enabled_by_default
            else Field(None, description=spec.section_description),
        )
        for spec in specs
    }
    model = create_model(
        "ToolsConfig",
        __base__=ToolSourceConfig,
        __module__=__name__,
        __doc__=inspect.cleandoc(ToolSourceConfig.__doc__ or "")
        + f" One section per tool ({', '.join(s.name for s in specs)}); null turns one off.",
        **sections,
    )
    model.tool_names = tuple(spec.name for spec in specs)
    return model


if TYPE_CHECKING:  # built at import, a section per registered tool: the type checker sees its base

    class ToolsConfig(ToolSourceConfig):
        def __getattr__(self, name: str) -> Any: ...  # the tool sections (`search`, `access`, ...)

else:
    ToolsConfig = _tools_config_model()


def index_cache_path(source: Any, cfg: IndexConfig) -> Path:
    """Where `ensure_index` keeps the index of corpus `source` under these settings (built or not)."""
    settings = hashlib.sha256(json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
    fingerprint = hashlib.sha256(source.fingerprint().encode()).hexdigest()
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in source.name)
    return cache_dir("indexes") / f"{safe}-{fingerprint[:12]}-{settings[:10]}"


def ensure_index(corpus: str, cfg: IndexConfig, *, progress: bool = True) -> Path:
    """The cached index of `corpus` under these settings, built on first use (atomically)."""
    from asearch.corpus import open_corpus
    from asearch.retrieval.index import build_index, open_index, read_manifest

    source = open_corpus(corpus)
    path = index_cache_path(source, cfg)

    def complete() -> bool:
        if not (path / "manifest.json").exists():
            return False
        try:
            read_manifest(path)
            with open_index(path, expect_fingerprint=source.fingerprint()):
                return True
        except Exception:
            return False  # partial or stale: rebuilt (build_index replaces it only once complete)

    if complete():
        return path
    # one builder per cache entry: processes started together (a study's runs) wait for it, then reuse it,
    # instead of each swapping its own copy over an index another one has open
    with open(cache_dir("locks") / f"index-{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():
            return path
        return build_index(source, path, cfg, progress=progress, overwrite=True)


def open_sources(cfg: ToolSourceConfig, *, progress: bool = True) -> tuple[ToolSources, list[Any]]:
    """The search and page backends of the configured source, and their closers (a closer may be async)."""
    if cfg.web is not None:
        from asearch.web.sources import open_web

        web = open_web(cfg.web)
        return ToolSources(search=web.search, pages=web.pages), [web.aclose]
    if cfg.server_url:
        from asearch.retrieval.client import RetrievalClient

        client = RetrievalClient(cfg.server_url)
        return ToolSources(search=client, pages=client), [client.aclose] if hasattr(client, "aclose") else []
    from asearch.retrieval.index import open_index

    index = open_index(cfg.index or ensure_index(cfg.corpus or "", cfg.build, progress=progress))
    closers = [index.close] if hasattr(index, "close") else []
    return ToolSources(search=index.retriever(cfg.method), pages=index.pages), closers


def describe_source(cfg: ToolSourceConfig) -> str:
    """The source in a few words, for a record's manifest: `corpus wiki10k (bm25)`, `server http://...`."""
    if cfg.web is not None:
        return f"web: search {cfg.web.search}, reader {cfg.web.reader}"
    if cfg.server_url:
        return f"server {cfg.server_url}"
    return f"{'index ' + str(cfg.index) if cfg.index else 'corpus ' + str(cfg.corpus)} ({cfg.method})"


def shared_record_dir(cfg: ToolSourceConfig) -> Path:
    """The record of runs without a directory of their own (`ask`): one per source under
    $ASEARCH_CACHE/tool-record/, so two sources' answers to the same query never share an entry."""
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", describe_source(cfg)).strip("-")  # `corpus-wiki10k-bm25`
    return cache_dir(RECORD_DIR, slug[:120])


def build_tools(
    cfg: ToolSourceConfig, *, progress: bool = True, record_dir: Path | None = None
) -> tuple[dict[str, Tool[Any]], list[Any]]:
    """The tools `cfg` turns on, in prompt order, over a local index, a retrieval server or the web; returns
    (tools, closers). A closer may be async. Web tools report their cache and cost counters via
    `asearch.web.runtime.web_metrics`; with `cfg.faults` the backends fail some calls on purpose, counted
    by `asearch.tools.faults.fault_metrics`. A source no tool reads stays open until closed (e.g. the web reader
    with access off).

    `record_dir` is the run's own record (`<run dir>/tool-record`): the backends' answers are recorded there
    when `cfg.record` is on (`cfg.record.dir` overrides it; neither: nothing is recorded). With
    `cfg.record.replay` no source is opened: the backends answer from that record alone. Either way
    `asearch.tools.replay.record_metrics` counts them. Faults are injected above the record, so a replay
    with the same `tools.faults` fails the same calls."""
    rec = cfg.record
    if rec.replay is not None:
        sources, closers = record_sources(None, ToolRecord(record_dir_of(rec.replay)))
    else:
        sources, closers = open_sources(cfg, progress=progress)
        where = rec.dir or record_dir
        if rec.enabled and where is not None:
            sources, more = record_sources(sources, ToolRecord(where), source=describe_source(cfg))
            closers = [*closers, *more]
    if cfg.faults is not None:
        sources, more = inject_faults(sources, cfg.faults)
        closers = [*closers, *more]
    specs = {spec.name: spec for spec in configurable_tools()}
    tools = {name: specs[name].build(sources, options) for name, options in cfg.enabled_tools().items()}
    return tools, closers


@contextlib.asynccontextmanager
async def open_tools(
    cfg: ToolSourceConfig, *, progress: bool = True, record_dir: Path | None = None
) -> AsyncIterator[dict[str, Tool[Any]]]:
    """`build_tools` as an async context manager: `async with open_tools(cfg) as tools:` yields the tools and
    closes every source they opened when the block ends, however it ends."""
    tools, closers = build_tools(cfg, progress=progress, record_dir=record_dir)
    try:
        yield tools
    finally:
        await close_all(closers)


async def close_all(closers: Sequence[Callable[[], Any]]) -> None:
    """Call each closer, the last opened first, awaiting those that return an awaitable. Every closer runs even
    when one raises; the first error is raised at the end."""
    first: Exception | None = None
    for close in reversed(closers):
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # noqa: BLE001 - the others must still close
            first = first or e
    if first is not None:
        raise first


def tool_metrics(tools: Mapping[str, Any], *, end_step: bool = False) -> dict[str, float]:
    """What the layers a build put behind an agent's tools counted: web cache and costs (`end_step`: close the
    step's window), injected faults, the tool record; {} for each layer the build did not make."""
    from asearch.web.runtime import web_metrics

    return {**web_metrics(tools, end_step=end_step), **fault_metrics(tools), **record_metrics(tools)}
