"""Injected tool faults (`tools.faults`): reproducible per seed, counted by kind, each kind raising what the real
RetrievalClient raises against a real misbehaving server, and recorded as the infrastructure's, not the model's."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from asearch.agent import AgentConfig, run_episode
from asearch.agent.trajectory import Trajectory
from asearch.engine.local.scripted import ScriptedEngine
from asearch.errors import RemoteError
from asearch.retrieval.client import RetrievalClient
from asearch.tools import (
    FaultConfig,
    FaultInjector,
    SearchTool,
    ToolsConfig,
    build_tools,
    fault_metrics,
    run_tool,
)
from asearch.tools.base import remote_error_kind
from asearch.tools.faults import FaultySearchBackend

# --------------------------------------------------------------------------- which calls fail


def _kinds(cfg: FaultConfig, keys: list[str], backend: str = "search") -> list[str | None]:
    injector = FaultInjector(cfg)
    return [injector.draw(backend, key) for key in keys]


def test_the_same_seed_fails_the_same_calls_at_the_configured_rates() -> None:
    cfg = FaultConfig(timeout=0.1, server_error=0.05, garbage=0.05, seed=7)
    keys = [f"query {i}" for i in range(4000)]
    first = _kinds(cfg, keys)
    assert _kinds(cfg, keys) == first  # reproducible
    assert _kinds(cfg.model_copy(update={"seed": 8}), keys) != first  # another seed, other calls
    counts = Counter(first)
    for kind, rate in (("timeout", 0.1), ("server_error", 0.05), ("garbage", 0.05)):
        assert abs(counts[kind] / len(keys) - rate) < 4 * (rate * (1 - rate) / len(keys)) ** 0.5, counts
    # concurrent episodes make calls in any order: a call's fate does not depend on it
    assert list(reversed(_kinds(cfg, list(reversed(keys))))) == first


def test_a_repeated_call_gets_a_fresh_draw_and_counts_follow_the_kinds() -> None:
    injector = FaultInjector(FaultConfig(server_error=0.5, seed=1))
    drawn = [injector.draw("search", "the same query") for _ in range(200)]
    assert 60 < drawn.count("server_error") < 140 and drawn.count(None) > 60
    assert injector.counts() == {"timeout": 0, "server_error": drawn.count("server_error"), "garbage": 0}
    m = injector.metrics()
    assert m["faults/calls"] == 200 and m["faults/injected"] == m[
        "faults/injected/server_error"
    ] == drawn.count("server_error")


def test_only_the_named_backends_fail() -> None:
    injector = FaultInjector(FaultConfig(garbage=1.0, tools=("access",)))
    assert [injector.draw("search", f"q{i}") for i in range(20)] == [None] * 20
    assert [injector.draw("access", f"u{i}") for i in range(20)] == ["garbage"] * 20
    assert injector.metrics()["faults/calls"] == 40 and injector.metrics()["faults/injected"] == 20


def test_rates_that_add_up_to_more_than_one_are_refused_with_the_numbers() -> None:
    with pytest.raises(
        ValidationError, match=r"add up to 1\.2 \(timeout 0\.6 \+ server_error 0 \+ garbage 0\.6\)"
    ):
        ToolsConfig.model_validate({"faults": {"timeout": 0.6, "garbage": 0.6}})
    with pytest.raises(ValidationError, match="tools"):
        FaultConfig(tools=("find",))


# --------------------------------------------------------------------------- what a fault raises


class _Misbehaving(BaseHTTPRequestHandler):
    """/slow/* answers too late, /down/* answers 503, /garbled/* answers 200 with a body that is not JSON."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/slow/"):
            time.sleep(1.0)
            body, status = b'{"result": []}', 200
        elif self.path.startswith("/down/"):
            body, status = json.dumps({"detail": "overloaded"}).encode(), 503
        else:
            body, status = b"<html>502 Bad Gateway from the proxy</html>", 200
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (/slow)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def misbehaving_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def _raised(call) -> RemoteError:
    with pytest.raises(RemoteError) as info:
        await call
    return info.value


def _cause(e: BaseException) -> type | None:
    under = e.__cause__ or e.__context__
    return None if under is None else type(under)


@pytest.mark.parametrize(
    ("kind", "path", "error_kind", "phrase"),
    [
        ("timeout", "slow", "timeout", "timed out after"),
        ("server_error", "down", "remote", "(last: HTTP 503: "),
        ("garbage", "garbled", "garbage", "answered data that is not a "),
    ],
)
def test_each_kind_raises_what_the_real_client_raises_from_a_real_server(
    misbehaving_server, kind, path, error_kind, phrase
) -> None:
    async def main():
        real = RetrievalClient(f"{misbehaving_server}/{path}", timeout=0.3, retries=0)
        injector = FaultInjector(FaultConfig(**{kind: 1.0}))
        try:
            for call_real, call_injected in (
                (real.search(["who?"], 2), injector.search(kind, ["who?"], 2)),
                (real.access(["https://x.test/1"]), injector.access(kind, ["https://x.test/1"])),
            ):
                got_real, got_injected = await _raised(call_real), await _raised(call_injected)
                assert type(got_real) is type(got_injected) is RemoteError
                assert _cause(got_real) is _cause(
                    got_injected
                )  # ReadTimeout / none (retries spent) / ValidationError
                assert phrase in str(got_real) and phrase in str(got_injected)
                assert remote_error_kind(got_real) == remote_error_kind(got_injected) == error_kind
            # through the tool seam: the same observation kind, and it is the infrastructure's
            for backend in (real, FaultySearchBackend(_NeverCalled(), injector)):
                obs = await run_tool(SearchTool(backend), "who?")
                assert obs.metadata["error"] == error_kind and obs.metadata["fault"] == "infrastructure"
        finally:
            await real.aclose()
            await injector.aclose()

    asyncio.run(main())


class _NeverCalled:
    async def search(self, queries, topk):
        raise AssertionError("a faulted call must not reach the backend")


def test_mistakes_of_the_model_are_not_the_infrastructures() -> None:
    obs = asyncio.run(run_tool(SearchTool(_NeverCalled()), "   "))
    assert obs.metadata["error"] == "bad_arguments" and obs.metadata["fault"] == "model"
    assert remote_error_kind(RemoteError("POST http://x/retrieve was rejected (HTTP 400): bad")) == "remote"


def test_the_wrapper_keeps_the_backends_other_attributes() -> None:
    class WebSearch:
        runtime = object()

        async def search(self, queries, topk):
            return [[] for _ in queries]

    inner = WebSearch()
    wrapped = FaultySearchBackend(inner, FaultInjector(FaultConfig()))
    assert wrapped.runtime is inner.runtime  # web_metrics finds a web backend's counters through it
    assert asyncio.run(wrapped.search(["q"], 3)) == [[]]


# --------------------------------------------------------------------------- built from config, in an episode

DOCS = [
    ("Ada Varn", "Ada Varn is a chemist. Ada Varn was born in Oslen."),
    ("Oslen", "Oslen is a city in Tarnia. Oslen has a harbour."),
]


@pytest.fixture(scope="module")
def mini_index(tmp_path_factory, build_mini_index):
    return build_mini_index(tmp_path_factory.mktemp("faults") / "mini", "faults-mini", DOCS)


def _close(closers) -> None:
    async def close_all():
        for close in closers:
            if asyncio.iscoroutine(result := close()):
                await result

    asyncio.run(close_all())


def test_build_tools_injects_into_the_named_backends_and_counts(mini_index) -> None:
    cfg = ToolsConfig.model_validate(
        {"index": str(mini_index), "faults": {"server_error": 1.0, "tools": ["search"]}}
    )
    tools, closers = build_tools(cfg, progress=False)
    try:

        async def calls():
            return await run_tool(tools["search"], "Ada Varn"), await run_tool(tools["access"], DOCS_URL)

        searched, accessed = asyncio.run(calls())
        assert searched.metadata["error"] == "remote" and "HTTP 503" in searched.text
        assert accessed.ok and "born in Oslen" in accessed.text  # access is not in tools.faults.tools
        assert fault_metrics(tools) == {
            "faults/calls": 2.0, "faults/injected": 1.0, "faults/injected/timeout": 0.0,
            "faults/injected/server_error": 1.0, "faults/injected/garbage": 0.0,
        }  # fmt: skip
    finally:
        _close(closers)
    plain, plain_closers = build_tools(ToolsConfig.model_validate({"index": str(mini_index)}), progress=False)
    assert fault_metrics(plain) == {}
    _close(plain_closers)


DOCS_URL = "https://mini.example/wiki/Ada_Varn"


def test_an_episode_counts_the_infrastructure_faults_it_met(mini_index, make_tokenizer) -> None:
    """search fails (garbled answer), then the model writes unusable arguments (its own mistake), then answers."""
    cfg = ToolsConfig.model_validate({"index": str(mini_index), "access": None, "faults": {"garbage": 1.0}})
    tools, closers = build_tools(cfg, progress=False)
    tok = make_tokenizer([x for _, x in DOCS] * 20 + ["<search></search><answer></answer>"] * 20)
    replies = iter(["<search>Ada Varn</search>", '<search>{"query": 3}</search>', "<answer>Oslen</answer>"])
    try:
        traj = asyncio.run(
            run_episode(
                ScriptedEngine(tok, lambda prompt: next(replies)), tok, tools, "Where?", AgentConfig()
            )
        )
    finally:
        _close(closers)
    assert traj.counters["tool_errors"] == 2 and traj.answer == "Oslen"
    assert traj.infra_faults == {"garbage": 1} and traj.met_infra_fault
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))).infra_faults == {"garbage": 1}
