"""Web search providers (`tools.web.search`) and page readers (`tools.web.reader`) by name.

A provider or reader is one module of `asearch.web` whose backend class registers itself with its options:

    @register_search_provider("brave", options=BraveConfig)
    class BraveBackend(CachedSearchBackend): ...      # __init__(options, *, runtime) ; async search(queries, topk)

Its options become the section `tools.web.<name>` (`section=` keeps an older key, as the direct reader's
`tools.web.fetch`); every module of the package is imported on the first lookup, so nothing else is edited.
A module that registers must not import `asearch.web.sources` (that module builds `WebConfig` from these).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asearch.config import Config
from asearch.registry import Registry

B = TypeVar("B", bound=type)


@dataclass(frozen=True)
class WebPart:
    """A registered provider or reader: its backend class, options model and config section."""

    name: str
    backend: type
    options: type[Config]
    section: str  # the key of its options under `tools.web`

    def build(self, options: Config, *, runtime: Any, resolver: Any = None) -> Any:
        """The backend over `options`, sharing `runtime` (cache, costs); `resolver` goes to those that take one."""
        extra = {"resolver": resolver} if "resolver" in inspect.signature(self.backend).parameters else {}
        return self.backend(options, runtime=runtime, **extra)


SEARCH_PROVIDERS: Registry[WebPart] = Registry(
    "web search provider", "asearch.web", wants=lambda source: "@register_search_provider(" in source
)
READERS: Registry[WebPart] = Registry("web reader", "asearch.web", wants=lambda source: "@register_reader(" in source)


def _register(registry: Registry[WebPart], name: str, options: type[Config], section: str | None) -> Callable[[B], B]:
    def add(cls: B) -> B:
        registry.add(name, WebPart(name, cls, options, section or name), origin=cls)
        return cls

    return add


def register_search_provider(name: str, *, options: type[Config], section: str | None = None) -> Callable[[B], B]:
    """Class decorator: the backend `tools.web.search=<name>` builds, from the section `tools.web.<section>`."""
    return _register(SEARCH_PROVIDERS, name, options, section)


def register_reader(name: str, *, options: type[Config], section: str | None = None) -> Callable[[B], B]:
    """Class decorator: the page backend `tools.web.reader=<name>` builds, from `tools.web.<section>`."""
    return _register(READERS, name, options, section)
