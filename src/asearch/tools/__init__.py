"""Agent tools: the Tool protocol, the registry, `ToolsConfig` / `build_tools`, and the built-in tools
`search` and `access`. Every other tool lives in its own module here (`asearch.tools.find`), found by the
registry with no edit to this file."""

from asearch.tools.access import AccessArgs, AccessTool, AccessToolConfig, LocalPageBackend, PageBackend
from asearch.tools.base import (
    DEFAULT_TOOL_TIMEOUT_S,
    INFRASTRUCTURE_ERRORS,
    EpisodeContext,
    Observation,
    ReplayMiss,
    Tool,
    ToolArgumentError,
    ToolSources,
    run_tool,
    tool_argument_hint,
    tool_counter,
)
from asearch.tools.build import (
    ToolsConfig,
    ToolSourceConfig,
    build_tools,
    close_all,
    ensure_index,
    open_sources,
    open_tools,
    tool_metrics,
)
from asearch.tools.faults import FaultConfig, FaultInjector, fault_metrics, inject_faults
from asearch.tools.registry import (
    argument_hints,
    available_tools,
    configurable_tools,
    make_tool,
    register_tool,
)
from asearch.tools.replay import ToolRecord, ToolRecordConfig, record_metrics
from asearch.tools.search import LocalSearchBackend, SearchArgs, SearchBackend, SearchTool, SearchToolConfig

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "INFRASTRUCTURE_ERRORS",
    "AccessArgs",
    "AccessTool",
    "AccessToolConfig",
    "EpisodeContext",
    "FaultConfig",
    "FaultInjector",
    "LocalPageBackend",
    "LocalSearchBackend",
    "Observation",
    "PageBackend",
    "ReplayMiss",
    "SearchArgs",
    "SearchBackend",
    "SearchTool",
    "SearchToolConfig",
    "Tool",
    "ToolArgumentError",
    "ToolRecord",
    "ToolRecordConfig",
    "ToolSourceConfig",
    "ToolSources",
    "ToolsConfig",
    "argument_hints",
    "available_tools",
    "build_tools",
    "tool_metrics",
    "close_all",
    "configurable_tools",
    "ensure_index",
    "fault_metrics",
    "inject_faults",
    "make_tool",
    "open_sources",
    "open_tools",
    "record_metrics",
    "register_tool",
    "run_tool",
    "tool_argument_hint",
    "tool_counter",
]
