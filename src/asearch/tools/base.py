"""The Tool seam: parse the agent's raw argument text, call, return an `Observation` the agent reads.

`run_tool` is the only way the agent loop calls a tool: bad arguments, remote failures and timeouts
come back as observations with `metadata["error"]` set, never as exceptions, and `metadata["fault"]`
saying whose failure it was: the model's, or the infrastructure's (a timeout, a 5xx, a garbled answer;
such episodes are left out of training and accuracy, docs/tools.md). One tool object serves
every concurrent episode; what it must remember about one episode lives in that episode's
`EpisodeContext`, which the loop hands to every call.

    ToolError (asearch.errors)
    ├── ToolArgumentError      the agent's argument text cannot be used (empty query, no url, ...)
    └── ReplayMiss             a replayed run asked what its record holds no answer to (tools.record.replay)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import httpx

from asearch.corpus.types import Page
from asearch.errors import RemoteError, ToolError

log = logging.getLogger(__name__)

ArgsT = TypeVar("ArgsT")
T = TypeVar("T")

ErrorKind = Literal["bad_arguments", "timeout", "remote", "garbage", "replay_miss", "tool"]
FaultSource = Literal["model", "infrastructure"]

# A service that did not answer in time, answered with an error, or answered something undecodable: the
# episode met a fault of the infrastructure, not of the model. `bad_arguments` is the model's; so is `tool`
# (a refused url, a spent budget, a retriever's own exception): deterministic answers to what it asked. A replay
# miss is the record's gap, not the model's: the recorded run was never answered that call.
INFRASTRUCTURE_ERRORS: frozenset[str] = frozenset({"timeout", "remote", "garbage", "replay_miss"})


class ToolArgumentError(ToolError):
    """The raw argument text the agent wrote cannot be turned into arguments; the message is shown to it."""


class ReplayMiss(ToolError):
    """A replayed run (`tools.record.replay`) asked a call its record has no answer to, or whose recorded
    answer is damaged; refused, never sent to a backend (asearch.tools.replay)."""


@dataclass(slots=True)
class Observation:
    """What a tool call produced: `text` goes into the agent's context; `metadata` is for logs and metrics
    (urls returned, hit count, latency_s, error kind); `error` is the failure message, None on success."""

    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class EpisodeContext:
    """What the tool calls of one episode share: the pages `access` showed it, oldest first, and how many
    chunks of each url it has shown (paging, `access.chunks_per_call`). The agent loop makes one per
    episode; `find` reads the last page from it."""

    pages: list[Page] = field(default_factory=list)
    read_chunks: dict[str, int] = field(default_factory=dict)

    @property
    def last_page(self) -> Page | None:
        return self.pages[-1] if self.pages else None


@dataclass(frozen=True, slots=True)
class ToolSources:
    """What configured tools are built on, opened once from `tools:` (a local index, a retrieval server
    or the web): `search` is a Retriever or anything with `async search(queries, topk)`; `pages` is a
    PageStore or anything with `async access(urls)`."""

    search: Any
    pages: Any


@runtime_checkable
class Tool(Protocol[ArgsT]):
    """A tool the agent can call: `name` is its action tag (`<name>argument</name>`) and its registry
    name; `description` is its line in the prompt's tool list, e.g. `<search>keywords</search> searches
    the encyclopedia ...` (the style adds the separator).

    Optional class attributes, read with defaults by the agent and `build_tools` (see `tool_argument_hint`,
    `tool_counter` and `asearch.tools.registry`): `argument_hint` ("query"; default "argument"), `counter`
    (the trajectory counter of its calls, "searches"; default its name: the counter it publishes, which the
    RL metrics (`rollout/tool_calls/<counter>`), the eval report and the viewer show with no edit of theirs),
    `order`, `config_class`, `enabled_by_default` and `from_sources`.
    """

    name: str

    @property
    def description(self) -> str: ...

    def parse(self, raw: str) -> ArgsT:
        """Arguments from the text the agent wrote between the tool's tags; raises ToolArgumentError."""
        ...

    async def call(self, args: ArgsT, episode: EpisodeContext) -> Observation:
        """Run the tool for one episode; may raise ToolError or RemoteError (run_tool turns them into
        observations)."""
        ...


def behind_tools(tools: Mapping[str, Any], attr: str, kind: type[T]) -> T | None:
    """The first `tool.backend.<attr>` that is a `kind` among an agent's tools (the fault injector, the tool
    record, the web runtime a build put behind its backends), or None."""
    for tool in tools.values():
        found = getattr(getattr(tool, "backend", None), attr, None)
        if isinstance(found, kind):
            return found
    return None


def argument_text(raw: str, key: str, tool: str) -> str:
    """What the agent wrote between a tool's tags: the text itself, or the `key` string of a JSON object
    (function-calling style, e.g. `{"query": "..."}`), stripped, without one pair of wrapping quotes."""
    text = raw.strip()
    if text.startswith("{"):
        try:
            obj: Any = json.loads(text)
        except json.JSONDecodeError:
            obj = None  # not JSON after all: the text is the argument
        if isinstance(obj, dict):
            if not isinstance(obj.get(key), str):
                raise ToolArgumentError(f'{tool} arguments as JSON need a "{key}" string')
            text = obj[key].strip()
    for quote in ('"', "'", "`"):
        if len(text) >= 2 and text[0] == quote and text[-1] == quote:
            return text[1:-1].strip()
    return text


def tool_argument_hint(tool: Tool[Any]) -> str:
    """What goes between the tool's tags, for the agent's corrections ("put the query between the tags")."""
    return getattr(tool, "argument_hint", "argument")


def tool_counter(tool: Tool[Any]) -> str:
    """The trajectory counter of the tool's calls: `counter` ("searches"), else its name."""
    return getattr(tool, "counter", tool.name)


DEFAULT_TOOL_TIMEOUT_S = 20.0


async def run_tool(
    tool: Tool[Any],
    raw: str,
    *,
    timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
    episode: EpisodeContext | None = None,
) -> Observation:
    """Parse and call `tool` within `timeout_s` seconds (None = no limit) for `episode` (None: a fresh
    one, as for a call outside any episode); every failure becomes an observation like
    `search failed: timeout after 20 s` with `metadata["error"]` set to its kind and `metadata["fault"]`
    to "infrastructure" (kinds in INFRASTRUCTURE_ERRORS) or "model".

    A timed-out in-process call keeps running in its worker thread (threads cannot be cancelled); only
    the agent stops waiting for it.
    """
    start = time.perf_counter()
    kind: ErrorKind
    try:
        args = tool.parse(raw)
        async with asyncio.timeout(timeout_s):  # unlike wait_for, no extra task per call
            obs = await tool.call(args, episode if episode is not None else EpisodeContext())
    except ToolArgumentError as e:
        kind, message = "bad_arguments", str(e)
    except TimeoutError:
        kind, message = "timeout", f"timeout after {timeout_s:g} s"
    except RemoteError as e:
        kind, message = remote_error_kind(e), str(e)
    except ReplayMiss as e:
        kind, message = "replay_miss", str(e)
    except ToolError as e:
        kind, message = "tool", str(e)
    else:
        obs.metadata.setdefault("tool", tool.name)
        obs.metadata.setdefault("latency_s", round(time.perf_counter() - start, 6))
        return obs
    log.info("tool %s failed (%s): %s", tool.name, kind, message)
    text = f"{tool.name} failed: {message}"
    fault: FaultSource = "infrastructure" if kind in INFRASTRUCTURE_ERRORS else "model"
    latency_s = round(time.perf_counter() - start, 6)
    return Observation(
        text=text,
        metadata={"tool": tool.name, "error": kind, "fault": fault, "latency_s": latency_s},
        error=text,
    )


def remote_error_kind(error: RemoteError) -> ErrorKind:
    """The kind of a RemoteError, read off the exception chain the client raised it with (`raise ... from`,
    or raised while handling): a read timeout under it makes "timeout"; a JSON, validation or decoding
    error (all ValueErrors) makes "garbage"; anything else (a 5xx after the retries, a refused connection,
    a 4xx) is "remote"."""
    link: BaseException | None = error
    seen: set[int] = set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, TimeoutError | httpx.TimeoutException):
            return "timeout"
        if isinstance(link, ValueError):
            return "garbage"
        link = link.__cause__ or link.__context__
    return "remote"
