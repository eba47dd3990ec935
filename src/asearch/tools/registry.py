"""Tool registry: `@register_tool` on a class, `make_tool(name, **kwargs)`, `available_tools()`, and the
tools a config can turn on (`configurable_tools()`, which `ToolsConfig` and `build_tools` are made from).

Every module of the `asearch.tools` package is imported on the first lookup, so adding a tool is one
new file in this package with a registered class; nothing else to edit. A class that also declares
how it is built from config gets its own section `tools.<name>` and is built by `build_tools`:

    config_class = FindToolConfig      # its options: the section `tools.find`
    enabled_by_default = False         # off unless the config sets `tools.find` (null turns any tool off)
    order = 30                         # its place in the prompt's tool list and in the allowed actions

    @classmethod
    def from_sources(cls, sources: ToolSources, config: FindToolConfig) -> FindTool: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from asearch.config import Config
from asearch.registry import Registry
from asearch.tools.base import Tool, ToolSources

T = TypeVar("T", bound=type)

TOOLS: Registry[Callable[..., Tool[Any]]] = Registry("tool", "asearch.tools")
DEFAULT_ORDER = 100  # tools that do not say where they go are listed after the built-in ones


@overload
def register_tool(target: T, /) -> T: ...
@overload
def register_tool(target: str | None = None, /) -> Callable[[T], T]: ...
def register_tool(target: Any = None, /) -> Any:
    """Register a tool class under its `name` attribute (`@register_tool`) or an explicit name
    (`@register_tool("web_search")`). A second class under a taken name is an error."""

    def add(cls: T, name: str | None) -> T:
        key = name or getattr(cls, "name", None)
        if not isinstance(key, str) or not key:
            raise TypeError(f"{cls.__qualname__} needs a `name` class attribute or @register_tool('name')")
        TOOLS.add(key, cls, origin=cls)
        return cls

    if isinstance(target, type):
        return add(target, None)
    return lambda cls: add(cls, target)


def available_tools() -> list[str]:
    """Names `make_tool` accepts, sorted."""
    return TOOLS.names()


def argument_hints() -> dict[str, str]:
    """{registered tool name: what goes between its tags} (its `argument_hint`, default "argument"), sorted."""
    return {name: getattr(factory, "argument_hint", "argument") for name, factory in TOOLS.items()}


def tool_counters() -> list[str]:
    """The trajectory counter of every registered tool's calls (its `counter`, else its name), in prompt order:
    what the RL loop reports per episode as `rollout/tool_calls/<counter>`."""
    classes = sorted(TOOLS.items(), key=lambda item: (int(getattr(item[1], "order", DEFAULT_ORDER)), item[0]))
    return list(dict.fromkeys(str(getattr(cls, "counter", name)) for name, cls in classes))


def make_tool(name: str, **kwargs: Any) -> Tool[Any]:
    """Build the tool registered as `name`; `kwargs` go to its constructor (e.g. backend=, config=)."""
    return TOOLS.get(name)(**kwargs)


@dataclass(frozen=True, slots=True)
class ConfigurableTool:
    """A registered tool that config can turn on: its section `tools.<name>` holds a `config_class`."""

    name: str
    config_class: type[Config]
    enabled_by_default: bool
    order: int
    build: Callable[[ToolSources, Any], Tool[Any]]  # the class's from_sources(sources, config)

    @property
    def section_description(self) -> str:
        """The Field description of `tools.<name>`: the options' docstring, then how to turn it on or off."""
        doc = (self.config_class.__doc__ or "").strip().splitlines()[0] if self.config_class.__doc__ else ""
        switch = (
            "Null turns it off."
            if self.enabled_by_default
            else f"Off by default; `tools.{self.name}={{}}` (or true) turns it on."
        )
        return f"The `{self.name}` tool, for any source: {doc} {switch}".replace("  ", " ")


def configurable_tools() -> list[ConfigurableTool]:
    """The registered tools that declare `config_class` and `from_sources`, in `order` (then by name):
    the order of the prompt's tool list and of the tools `build_tools` returns."""
    out = []
    for name, cls in TOOLS.items():
        config_class = getattr(cls, "config_class", None)
        from_sources = getattr(cls, "from_sources", None)
        if config_class is None or from_sources is None:
            continue  # built in code only (make_tool / the constructor)
        out.append(
            ConfigurableTool(
                name=name,
                config_class=config_class,
                enabled_by_default=bool(getattr(cls, "enabled_by_default", False)),
                order=int(getattr(cls, "order", DEFAULT_ORDER)),
                build=from_sources,
            )
        )
    return sorted(out, key=lambda t: (t.order, t.name))
