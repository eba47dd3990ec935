"""`open_tools`: the tools of a config inside `async with`, every source closed when the block ends."""

from __future__ import annotations

import asyncio

import pytest

import asearch.tools.build as build
from asearch.tools import ToolsConfig, close_all, open_tools


def test_close_all_closes_in_reverse_awaits_and_raises_the_first_error() -> None:
    closed: list[str] = []

    async def async_close() -> None:
        closed.append("async")

    def failing() -> None:
        closed.append("failing")
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        asyncio.run(close_all([lambda: closed.append("first"), async_close, failing, lambda: closed.append("last")]))
    assert closed == ["last", "failing", "async", "first"]  # the error did not stop the ones before it


def test_open_tools_closes_when_the_block_raises(monkeypatch) -> None:
    closed: list[str] = []
    monkeypatch.setattr(build, "build_tools", lambda cfg, **kw: ({"search": "a tool"}, [lambda: closed.append("index")]))

    async def body() -> None:
        async with open_tools(ToolsConfig(), progress=False) as tools:
            assert tools == {"search": "a tool"}
            raise RuntimeError("episode failed")

    with pytest.raises(RuntimeError, match="episode failed"):
        asyncio.run(body())
    assert closed == ["index"]


def test_open_tools_over_a_real_index(tmp_path, build_mini_index) -> None:
    index = build_mini_index(tmp_path / "idx", "open-tools", [("Ada Varn", "Ada Varn was born in Pellow.")])

    async def search() -> str:
        async with open_tools(ToolsConfig(index=index, access=None), progress=False) as tools:
            assert list(tools) == ["search"]
            return str(await tools["search"].backend.search(["Ada Varn"], 1))

    assert "Pellow" in asyncio.run(search())
