"""run_tool turns every failure into an observation; the registry builds and discovers tools."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest

from asearch.corpus.types import Page, Passage
from asearch.errors import ConfigError, RemoteError, ToolError
from asearch.retrieval.base import SearchHit
from asearch.tools import (
    AccessTool,
    EpisodeContext,
    Observation,
    SearchTool,
    Tool,
    ToolArgumentError,
    ToolsConfig,
    ToolSources,
    available_tools,
    build_tools,
    configurable_tools,
    make_tool,
    register_tool,
    registry,
    run_tool,
)


class SleepyRetriever:
    """Blocks in its worker thread for `delay_s` (test scaffolding for timeouts)."""

    name = "sleepy"

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.done = threading.Event()

    def search(self, queries, topk):
        time.sleep(self.delay_s)
        self.done.set()
        return [[SearchHit(Passage("1", "T", "text", "https://x.test/1"), 1.0)] for _ in queries]


class BrokenRetriever:
    name = "broken"

    def search(self, queries, topk):
        raise MemoryError("faiss could not allocate 60 GiB")


class OnePage:
    def get(self, url: str) -> Page | None:
        return Page(url=url, title="t", contents="c") if url == "https://x.test/1" else None

    def __len__(self) -> int:
        return 1


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- run_tool


def test_timeout_becomes_an_observation():
    retriever = SleepyRetriever(0.5)
    obs = run(run_tool(SearchTool(retriever), "anything", timeout_s=0.1))
    assert not retriever.done.is_set()  # the agent stopped waiting; the search thread still runs
    assert obs.text == "search failed: timeout after 0.1 s"
    assert obs.error == obs.text and obs.metadata["error"] == "timeout" and obs.metadata["tool"] == "search"
    assert not obs.ok
    retriever.done.wait(2)


def test_timeout_text_uses_seconds_as_written():
    obs = run(run_tool(SearchTool(SleepyRetriever(0.3)), "q", timeout_s=0.05))
    assert obs.text == "search failed: timeout after 0.05 s"


def test_no_timeout_waits_for_the_result():
    obs = run(run_tool(SearchTool(SleepyRetriever(0.05)), "q", timeout_s=None))
    assert obs.ok and obs.text.startswith("[Doc 1](https://x.test/1):")


def test_in_process_retriever_crash_is_a_tool_observation():
    obs = run(run_tool(SearchTool(BrokenRetriever()), "q"))
    assert obs.metadata["error"] == "tool"
    assert (
        obs.text == "search failed: retriever 'broken' failed: MemoryError: faiss could not allocate 60 GiB"
    )


@dataclass
class _Raising:
    exc: Exception
    name: str = "raiser"
    description: str = "raises"

    def parse(self, raw: str) -> str:
        return raw

    async def call(self, args: str, episode: EpisodeContext) -> Observation:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ToolArgumentError("bad"), "bad_arguments"),
        (RemoteError("server at http://x said no"), "remote"),
        (ToolError("quota used up"), "tool"),
    ],
)
def test_each_failure_kind_is_labelled(exc, kind):
    obs = run(run_tool(_Raising(exc), "x"))
    assert obs.metadata["error"] == kind and obs.text == f"raiser failed: {exc}" and obs.error == obs.text


def test_bugs_are_not_swallowed():
    with pytest.raises(ZeroDivisionError):
        run(run_tool(_Raising(ZeroDivisionError("bug")), "x"))


def test_successful_observation_gets_tool_and_latency():
    obs = run(run_tool(AccessTool(OnePage()), "https://x.test/1"))
    assert obs.ok and obs.metadata["tool"] == "access" and obs.metadata["latency_s"] >= 0


# --------------------------------------------------------------------------- registry


def test_builtin_tools_are_available_and_buildable():
    assert {"search", "access"} <= set(available_tools())
    tool = make_tool("search", backend=SleepyRetriever(0), config={"topk": 2})
    assert isinstance(tool, SearchTool) and tool.config.topk == 2
    assert isinstance(tool, Tool)
    assert isinstance(make_tool("access", backend=OnePage()), AccessTool)


def test_unknown_tool_suggests_the_nearest_name():
    with pytest.raises(ConfigError, match=r"unknown tool 'serch'; did you mean 'search'\?"):
        make_tool("serch", backend=None)


@pytest.fixture
def scoped_tools():
    """Tools registered in the test are gone after it."""
    with registry.TOOLS.temporary():
        yield


def test_adding_a_tool_is_one_registered_class():
    with registry.TOOLS.temporary():  # the tool is registered for this test only

        @register_tool
        class Calculator:
            name = "calculate"
            description = "calculate: evaluate a sum like 2+3"

            def parse(self, raw: str) -> list[int]:
                try:
                    return [int(x) for x in raw.split("+")]
                except ValueError:
                    raise ToolArgumentError(f"{raw.strip()!r} is not a sum of integers") from None

            async def call(self, args: list[int], episode: EpisodeContext) -> Observation:
                return Observation(text=str(sum(args)), metadata={"terms": len(args)})

        assert "calculate" in available_tools()
        calc = make_tool("calculate")
        assert run(run_tool(calc, "2+3+4")).text == "9"
        bad = run(run_tool(calc, "two"))
        assert bad.text == "calculate failed: 'two' is not a sum of integers"

        with pytest.raises(ValueError, match="tool 'calculate' is taken"):

            @register_tool("calculate")
            class Other:
                pass


def test_each_call_gets_its_episode_and_a_call_outside_one_a_fresh_one():
    seen = []

    @dataclass
    class Recorder:
        name: str = "recorder"
        description: str = "records"

        def parse(self, raw: str) -> str:
            return raw

        async def call(self, args: str, episode: EpisodeContext) -> Observation:
            seen.append(episode)
            return Observation(text=args)

    mine = EpisodeContext()
    run(run_tool(Recorder(), "a", episode=mine))
    run(run_tool(Recorder(), "b"))
    run(run_tool(Recorder(), "c"))
    assert seen[0] is mine and seen[1] is not mine and seen[1] is not seen[2]


# --------------------------------------------------------------------------- config: the registry builds the tools


def test_tools_config_has_a_section_per_configurable_tool_in_prompt_order():
    assert [t.name for t in configurable_tools()][:3] == ["search", "access", "find"]
    assert {"search", "access", "find"} <= set(ToolsConfig.model_fields)
    cfg = ToolsConfig()
    assert list(cfg.enabled_tools()) == ["search", "access"]  # find is off by default
    assert list(ToolsConfig(find={}).enabled_tools()) == ["search", "access", "find"]
    assert list(ToolsConfig(find=True, access=False).enabled_tools()) == ["search", "find"]
    assert ToolsConfig(find={"context_chars": 50}).find.context_chars == 50
    assert ToolsConfig.model_validate(ToolsConfig(find={}).model_dump(mode="json")) == ToolsConfig(find={})
    with pytest.raises(ValueError, match="give only one of"):
        ToolsConfig(index="/x", server_url="http://127.0.0.1:1")


def test_adding_a_configurable_tool_gives_it_a_config_section_and_builds_it(monkeypatch, scoped_tools):
    from asearch.config import Config
    from asearch.tools import build as build_module

    class EchoConfig(Config):
        """How `echo` repeats."""

        times: int = 2

    @register_tool
    class Echo:
        name = "echo"
        description = "<echo>text</echo> repeats the text"
        config_class = EchoConfig
        enabled_by_default = True

        def __init__(self, config: EchoConfig, pages):
            self.config, self.pages = config, pages

        @classmethod
        def from_sources(cls, sources, config):
            return cls(config, sources.pages)

        def parse(self, raw: str) -> str:
            return raw

        async def call(self, args: str, episode: EpisodeContext) -> Observation:
            return Observation(text=" ".join([args] * self.config.times))

    config_model = build_module._tools_config_model()
    cfg = config_model(index="/not/used", echo={"times": 3})
    assert "The `echo` tool" in config_model.model_fields["echo"].description
    pages = OnePage()
    monkeypatch.setattr(
        build_module, "open_sources", lambda cfg, progress: (ToolSources(search=SleepyRetriever(0), pages=pages), [])
    )
    tools, _ = build_tools(cfg, progress=False)
    assert list(tools) == ["search", "access", "echo"]  # after the built-in ones: no `order` given
    assert tools["echo"].pages is pages and run(run_tool(tools["echo"], "hi")).text == "hi hi hi"
    assert isinstance(tools["search"], SearchTool) and isinstance(tools["access"], AccessTool)
