"""The Tool seam: parse the agent's raw argument text, call, return an `Observation` the agent reads.

`run_tool` is the only way the agent loop calls a tool: bad arguments, remote failures and timeouts
come back as observations with `metadata["error"]` set, never as exceptions.

    ToolError (asearch.errors)
    └── ToolArgumentError      the agent's argument text cannot be used (empty query, no url, ...)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from asearch.errors import RemoteError, ToolError

log = logging.getLogger(__name__)

ArgsT = TypeVar("ArgsT")

ErrorKind = Literal["bad_arguments", "timeout", "remote", "tool"]


class ToolArgumentError(ToolError):
    """The raw argument text the agent wrote cannot be turned into arguments; the message is shown to it."""


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


@runtime_checkable
class Tool(Protocol[ArgsT]):
    """A tool the agent can call. `description` is the text the prompt shows for it."""

    name: str

    @property
    def description(self) -> str: ...

    def parse(self, raw: str) -> ArgsT:
        """Arguments from the text the agent wrote between the tool's tags; raises ToolArgumentError."""
        ...

    async def call(self, args: ArgsT) -> Observation:
        """Run the tool; may raise ToolError or RemoteError (run_tool turns them into observations)."""
        ...


DEFAULT_TOOL_TIMEOUT_S = 20.0


async def run_tool(
    tool: Tool[Any], raw: str, *, timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S
) -> Observation:
    """Parse and call `tool` within `timeout_s` seconds (None = no limit); every failure becomes an
    observation like `search failed: timeout after 20 s` with `metadata["error"]` set to its kind.

    A timed-out in-process call keeps running in its worker thread (threads cannot be cancelled); only
    the agent stops waiting for it.
    """
    start = time.perf_counter()
    kind: ErrorKind
    try:
        args = tool.parse(raw)
        async with asyncio.timeout(timeout_s):  # unlike wait_for, no extra task per call
            obs = await tool.call(args)
    except ToolArgumentError as e:
        kind, message = "bad_arguments", str(e)
    except TimeoutError:
        kind, message = "timeout", f"timeout after {timeout_s:g} s"
    except RemoteError as e:
        kind, message = "remote", str(e)
    except ToolError as e:
        kind, message = "tool", str(e)
    else:
        obs.metadata.setdefault("tool", tool.name)
        obs.metadata.setdefault("latency_s", round(time.perf_counter() - start, 6))
        return obs
    log.info("tool %s failed (%s): %s", tool.name, kind, message)
    text = f"{tool.name} failed: {message}"
    return Observation(
        text=text,
        metadata={"tool": tool.name, "error": kind, "latency_s": round(time.perf_counter() - start, 6)},
        error=text,
    )
