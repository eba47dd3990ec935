"""Agent tools: the Tool protocol, the registry, and the built-in `search` and `access` tools."""

from asearch.tools.access import AccessArgs, AccessTool, AccessToolConfig, LocalPageBackend, PageBackend
from asearch.tools.base import DEFAULT_TOOL_TIMEOUT_S, Observation, Tool, ToolArgumentError, run_tool
from asearch.tools.registry import available_tools, make_tool, register_tool
from asearch.tools.search import LocalSearchBackend, SearchArgs, SearchBackend, SearchTool, SearchToolConfig

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "AccessArgs",
    "AccessTool",
    "AccessToolConfig",
    "LocalPageBackend",
    "LocalSearchBackend",
    "Observation",
    "PageBackend",
    "SearchArgs",
    "SearchBackend",
    "SearchTool",
    "SearchToolConfig",
    "Tool",
    "ToolArgumentError",
    "available_tools",
    "make_tool",
    "register_tool",
    "run_tool",
]
