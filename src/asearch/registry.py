"""Named parts that register themselves, one `Registry` each: tools, engine kinds, launchers, agent styles,
advantage estimators, loss corrections, search methods, web search providers and readers, synth backends.

    LAUNCHERS = Registry("launcher", "asearch.launch")
    LAUNCHERS.add("slurm", SlurmLauncher, origin=SlurmLauncher)    # what @register_launcher does
    LAUNCHERS.get("slurm")          # imports every module of asearch.launch first, once
    launcher: Annotated[str, AfterValidator(LAUNCHERS.check)] = "local"   # a config field: any registered name,
        # checked on validation (`LAUNCHERS.name_type()` is the same type, but a call is no annotation to mypy)

A new part is one new module in the registry's package or a subpackage of it: every module is imported on
the first lookup, so its registration runs without being listed anywhere. Lookups of unknown names raise a
ConfigError naming the nearest registered one.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from asearch.errors import ConfigError

T = TypeVar("T")
E = TypeVar("E")  # what a `decorator` registers: an entry of the registry, as decorated


def _qualified(origin: object) -> str:
    if isinstance(origin, str):  # an entry that is a value (a style), named by its module and name
        return origin
    return f"{getattr(origin, '__module__', '?')}.{getattr(origin, '__qualname__', repr(origin))}"


class Registry(Generic[T]):
    """Entries of one kind by name, filled by the modules of `package` when they are imported.

    `wants(source)` filters the modules to import by their source text (e.g. only those that register
    something), so that listing the names need not import heavy helper modules."""

    def __init__(self, what: str, package: str, *, wants: Callable[[str], bool] | None = None):
        self.what, self.package, self.wants = what, package, wants
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._discovered = self._discovering = False

    def add(self, name: str, entry: T, *, origin: object) -> None:
        """Register `entry` as `name`; `origin` (the class or function) says who registered it, so a module
        imported twice re-registers quietly while a second part under a taken name is an error."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{_qualified(origin)}: a {self.what} needs a non-empty name, got {name!r}")
        taken = self._origins.get(name)
        if taken is not None and taken != _qualified(origin):
            raise ValueError(f"{self.what} {name!r} is taken by {taken}")
        self._entries[name], self._origins[name] = entry, _qualified(origin)

    def decorator(self, name: str) -> Callable[[E], E]:
        """A decorator registering what it decorates (a function or class, its own origin) as `name`."""

        def add(entry: E) -> E:
            self.add(name, entry, origin=entry)  # type: ignore[arg-type]
            return entry

        return add

    def discover(self) -> None:
        """Import every module of the package and its subpackages once. A module that looks entries up while
        it is being imported sees those registered so far (the flag only stops the imports from starting over)."""
        if self._discovered or self._discovering:
            return
        package = importlib.import_module(self.package)
        self._discovering = True
        try:
            for module in pkgutil.walk_packages(package.__path__, prefix=f"{self.package}."):
                leaf = module.name.rsplit(".", 1)[-1]
                if not module.ispkg and not leaf.startswith("_") and self._wanted(module.name):
                    importlib.import_module(module.name)
        finally:
            self._discovering = False
        self._discovered = True

    def _wanted(self, module: str) -> bool:
        if self.wants is None:
            return True
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if not origin or not origin.endswith(".py"):
            return True
        with open(origin, encoding="utf-8") as f:
            return self.wants(f.read())

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        self.discover()
        return iter(sorted(self._entries.items()))

    def find(self, name: str) -> T | None:
        self.discover()
        return self._entries.get(name)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def check(self, name: str) -> str:
        """`name` if it is registered; else a pydantic error with `unknown`'s message (for config fields)."""
        if self.find(name) is None:
            raise PydanticCustomError("registry_name", self.unknown(name))
        return name

    def name_type(self) -> Any:
        """The type of a config field naming an entry: a `str` checked against the registry on validation, so
        a part registered by a new module is accepted with no edit to the config class."""
        return Annotated[str, AfterValidator(self.check)]

    def get(self, name: str) -> T:
        """The entry registered as `name`; a ConfigError naming the nearest one if there is none."""
        found = self.find(name)
        if found is None:
            raise ConfigError(self.unknown(name))
        return found

    def unknown(self, name: str) -> str:
        """The message for an unknown `name`: the nearest registered name and all of them."""
        self.discover()
        near = difflib.get_close_matches(str(name), list(self._entries), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"unknown {self.what} {name!r}{hint} (registered: {', '.join(sorted(self._entries))})"

    @contextlib.contextmanager
    def temporary(self, *, rediscover: bool = False) -> Iterator[Registry[T]]:
        """Entries added inside the block are gone after it (tests); `rediscover` imports the package's
        modules again on the next lookup (e.g. after a test put a new module on the package's path)."""
        self.discover()
        saved = dict(self._entries), dict(self._origins), self._discovered
        if rediscover:
            self._discovered = False
        try:
            yield self
        finally:
            self._entries, self._origins = dict(saved[0]), dict(saved[1])
            self._discovered = saved[2]
