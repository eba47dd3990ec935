"""Tool registry: `@register_tool` on a class, `make_tool(name, **kwargs)`, `available_tools()`.

Every module of the `asearch.tools` package is imported on the first lookup, so adding a tool is
one new file in this package with a registered class; nothing else to edit.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, TypeVar, overload

from asearch.errors import ConfigError
from asearch.tools.base import Tool

T = TypeVar("T", bound=type)

_FACTORIES: dict[str, Callable[..., Tool[Any]]] = {}
_discovered = False


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
        existing = _FACTORIES.get(key)
        if existing is not None and existing is not cls:
            raise ValueError(f"tool name {key!r} is taken by {existing.__module__}.{existing.__qualname__}")
        _FACTORIES[key] = cls
        return cls

    if isinstance(target, type):
        return add(target, None)
    return lambda cls: add(cls, target)


def _discover() -> None:
    """Import every module in asearch.tools once so their @register_tool decorators run."""
    global _discovered
    if _discovered:
        return
    import asearch.tools as package

    for mod in pkgutil.iter_modules(package.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{mod.name}")
    _discovered = True


def available_tools() -> list[str]:
    """Names `make_tool` accepts, sorted."""
    _discover()
    return sorted(_FACTORIES)


def make_tool(name: str, **kwargs: Any) -> Tool[Any]:
    """Build the tool registered as `name`; `kwargs` go to its constructor (e.g. backend=, config=)."""
    _discover()
    factory = _FACTORIES.get(name)
    if factory is None:
        near = difflib.get_close_matches(name, list(_FACTORIES), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown tool {name!r}{hint} (available: {', '.join(sorted(_FACTORIES))})")
    return factory(**kwargs)
