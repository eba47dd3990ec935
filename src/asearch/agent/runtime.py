"""Assemble a ready agent from config: engine + tokenizer + tools (+ the index they need), and close them.

`ask`, `eval` and `train` all start here, so one YAML shape (`engine`, `tools`, `agent`) drives them all.
The tools search a local corpus / index, a retrieval server, or the open web (`tools.web`, see docs/web.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from asearch.agent.loop import AgentConfig, run_episode
from asearch.agent.trajectory import Trajectory
from asearch.config import Config
from asearch.engine.inprocess import InProcessEngineConfig
from asearch.errors import ConfigError
from asearch.files import cache_dir
from asearch.retrieval.index import IndexConfig
from asearch.tools import AccessTool, AccessToolConfig, SearchTool, SearchToolConfig, Tool
from asearch.web.tools import WebConfig, build_web_tools


class EngineConfig(Config):
    """Which inference backend runs the policy."""

    kind: Literal["inprocess", "vllm", "sglang"] = Field("inprocess", description="Backend.")
    model: str = Field(
        "smollm2-135m-instruct",
        description="HF name, local directory, or built-in alias (smollm2-135m-instruct). The tokenizer comes "
        "from here too.",
    )
    base_url: str | None = Field(None, description="Server url for vllm / sglang (e.g. http://127.0.0.1:8000).")
    inprocess: InProcessEngineConfig = Field(default_factory=InProcessEngineConfig)

    @model_validator(mode="after")
    def _remote_needs_url(self) -> EngineConfig:
        if self.kind != "inprocess" and not self.base_url:
            raise ValueError(f"engine.kind={self.kind!r} needs engine.base_url (the server's http://host:port)")
        return self


class ToolsConfig(Config):
    """Where the tools get their data: one of a corpus (index built and cached), an index dir, a server, or
    the web. The corpus (it has a default) is ignored when one of the others is given."""

    corpus: str | None = Field("wiki10k", description="wiki10k | world[:seed] | a jsonl path; indexed on first use.")
    index: Path | None = Field(None, description="A prebuilt index directory (asearch index build).")
    server_url: str | None = Field(None, description="A retrieval server (asearch serve) to query over HTTP.")
    method: Literal["bm25", "dense", "hybrid"] = Field("bm25", description="Retrieval method for local indexes.")
    build: IndexConfig = Field(default_factory=IndexConfig, description="Settings when the index must be built.")
    web: WebConfig | None = Field(
        None,
        description="Search and read the open web instead (e.g. tools.web.search=serper, tools.web.reader=direct, "
        "tools.web.cache.mode=cache_only); API keys come from environment variables only (docs/web.md).",
    )
    search: SearchToolConfig = Field(
        default_factory=SearchToolConfig, description="The `search` tool (top-k, rendering), for any source."
    )
    access: AccessToolConfig | None = Field(
        default_factory=AccessToolConfig, description="The `access` tool, for any source; null disables it."
    )

    @model_validator(mode="after")
    def _one_source(self) -> ToolsConfig:
        given = [k for k in ("index", "server_url", "web") if getattr(self, k) is not None]
        if self.web is not None:
            # one place for tool options, whatever the source: the web's own copies would be ignored
            # (compared with the defaults, not fields_set, so a dumped and reloaded config still validates)
            if (self.web.search_tool, self.web.access_tool) != (SearchToolConfig(), AccessToolConfig()):
                raise ValueError("set the tool options as tools.search / tools.access, not under tools.web")
        if len(given) > 1:
            raise ValueError(f"give only one of tools.index / tools.server_url / tools.web, got {given}")
        if not given and not self.corpus:
            raise ValueError("tools need a source: set tools.corpus, tools.index or tools.server_url")
        return self


class RuntimeConfig(Config):
    engine: EngineConfig = Field(default_factory=EngineConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)


@dataclass
class Runtime:
    engine: Any
    tokenizer: Any
    tools: dict[str, Tool]
    agent_cfg: AgentConfig
    _closers: list[Any] = field(default_factory=list)

    async def run(self, question: str, **kwargs: Any) -> Trajectory:
        return await run_episode(self.engine, self.tokenizer, self.tools, question, self.agent_cfg, **kwargs)

    async def close(self) -> None:
        for c in reversed(self._closers):
            res = c()
            if hasattr(res, "__await__"):
                await res


def ensure_index(corpus: str, cfg: IndexConfig, *, progress: bool = True) -> Path:
    """The cached index of `corpus` under these settings, built on first use (atomically)."""
    from asearch.corpus import open_corpus
    from asearch.retrieval.index import build_index, open_index, read_manifest

    source = open_corpus(corpus)
    settings = hashlib.sha256(json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in source.name)
    path = cache_dir("indexes") / f"{safe}-{hashlib.sha256(source.fingerprint().encode()).hexdigest()[:12]}-{settings}"
    if (path / "manifest.json").exists():
        try:
            read_manifest(path)
            open_index(path, expect_fingerprint=source.fingerprint())
            return path
        except Exception:
            pass  # partial or stale: rebuild below (build_index replaces it only once complete)
    return build_index(source, path, cfg, progress=progress, overwrite=True)


def build_tools(cfg: ToolsConfig, *, progress: bool = True) -> tuple[dict[str, Tool], list[Any]]:
    """The search/access tools over a local index, a retrieval server or the web; returns (tools, closers).
    A closer may be async. Web tools report their cache and cost counters via `asearch.web.runtime.web_metrics`."""
    if cfg.web is not None:
        tool_cfgs = {"search_tool": cfg.search, "access_tool": cfg.access or AccessToolConfig()}
        web = build_web_tools(cfg.web.model_copy(update=tool_cfgs))
        tools = dict(web.tools)
        if cfg.access is None:
            tools.pop("access")  # the reader still exists (and is closed) but the agent cannot call it
        return tools, [web.aclose]
    if cfg.server_url:
        from asearch.retrieval.client import RetrievalClient

        client = RetrievalClient(cfg.server_url)
        search_backend: Any = client
        page_backend: Any = client
        closers: list[Any] = [client.aclose] if hasattr(client, "aclose") else []
    else:
        from asearch.retrieval.index import open_index

        path = cfg.index or ensure_index(cfg.corpus or "", cfg.build, progress=progress)
        index = open_index(path)
        search_backend, page_backend = index.retriever(cfg.method), index.pages
        closers = [index.close] if hasattr(index, "close") else []
    tools: dict[str, Tool] = {"search": SearchTool(search_backend, cfg.search)}
    if cfg.access is not None:
        tools["access"] = AccessTool(page_backend, cfg.access)
    return tools, closers


def build_engine(cfg: EngineConfig) -> tuple[Any, Any]:
    """(engine, tokenizer) for the configured backend. Heavy imports happen here, not at module import."""
    from asearch.models.loading import load_tokenizer

    if cfg.kind == "inprocess":
        from asearch.engine.inprocess import InProcessEngine

        engine = InProcessEngine.from_pretrained(cfg.model, cfg=cfg.inprocess)
        return engine, engine.tokenizer
    tokenizer = load_tokenizer(cfg.model)
    if cfg.kind == "vllm":
        from asearch.engine.vllm import VLLMEngine

        return VLLMEngine(cfg.base_url, cfg.model), tokenizer
    if cfg.kind == "sglang":
        from asearch.engine.sglang import SGLangEngine

        return SGLangEngine(cfg.base_url), tokenizer
    raise ConfigError(f"unknown engine.kind {cfg.kind!r}")


# Instruct models too small to drive the tag protocol on their own (aliases, lower case).
SMALL_INSTRUCT_MODELS = frozenset({"smollm2-135m-instruct"})


def apply_model_style_default(cfg: RuntimeConfig) -> str | None:
    """Give a small instruct model the `guided` style (it opens the model's turns for it) unless the config
    chose a style itself. Returns a note for the user when it switched, else None."""
    if "style" in cfg.agent.model_fields_set or cfg.engine.model.lower() not in SMALL_INSTRUCT_MODELS:
        return None
    cfg.agent.style = "guided"
    return f"{cfg.engine.model}: using the 'guided' agent style (set agent.style or --style to override)"


def build_runtime(cfg: RuntimeConfig, *, progress: bool = True) -> Runtime:
    """Everything one agent needs. Call `await runtime.close()` when done."""
    tools, closers = build_tools(cfg.tools, progress=progress)
    engine, tokenizer = build_engine(cfg.engine)
    return Runtime(engine, tokenizer, tools, cfg.agent, [*closers, engine.close])
