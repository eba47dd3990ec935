"""Launchers by name: `TrainConfig.launcher` picks one, `make_launcher` builds it.

A launcher is one file in this package that subclasses `Launcher` and registers itself:

    @register_launcher("slurm")
    class SlurmLauncher(Launcher): ...

Every module of `asearch.launch` is imported on the first lookup, so a new file here is found without
being listed anywhere; a launcher defined elsewhere registers when its module is imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from asearch.errors import ConfigError
from asearch.launch.spec import Launcher

_LAUNCHERS: dict[str, type[Launcher]] = {}
_discovered = False


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: make `cls` the launcher `launcher=<name>` starts."""

    def register(cls: type[Launcher]) -> type[Launcher]:
        if name in _LAUNCHERS and _LAUNCHERS[name] is not cls:
            raise ValueError(f"launcher {name!r} is already registered by {_LAUNCHERS[name].__qualname__}")
        _LAUNCHERS[name] = cls
        return cls

    return register


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    import asearch.launch as package

    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    _discovered = True


def launcher_names() -> list[str]:
    _discover()
    return sorted(_LAUNCHERS)


def launcher_type(name: str) -> type[Launcher]:
    """The class registered as `name`; a ConfigError lists the registered names."""
    _discover()
    if name not in _LAUNCHERS:
        raise ConfigError(f"unknown launcher {name!r}; registered launchers: {', '.join(sorted(_LAUNCHERS))}")
    return _LAUNCHERS[name]


def make_launcher(name: str, *args: Any, **kwargs: Any) -> Launcher:
    """An instance of launcher `name` (not started), built with `Launcher`'s arguments."""
    return launcher_type(name)(*args, **kwargs)
