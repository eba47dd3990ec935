"""Launchers by name: `TrainConfig.launcher` picks one, `make_launcher` builds it.

A launcher is one file in this package that subclasses `Launcher` and registers itself:

    @register_launcher("slurm")
    class SlurmLauncher(Launcher): ...

Every module of `asearch.launch` is imported on the first lookup, so a new file here is found without
being listed anywhere; a launcher defined elsewhere registers when its module is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asearch.launch.spec import Launcher
from asearch.registry import Registry

LAUNCHERS: Registry[type[Launcher]] = Registry("launcher", "asearch.launch")


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: make `cls` the launcher `launcher=<name>` starts."""
    return LAUNCHERS.decorator(name)


def launcher_names() -> list[str]:
    return LAUNCHERS.names()


def launcher_type(name: str) -> type[Launcher]:
    """The class registered as `name`; a ConfigError names the registered ones."""
    return LAUNCHERS.get(name)


def make_launcher(name: str, *args: Any, **kwargs: Any) -> Launcher:
    """An instance of launcher `name` (not started), built with `Launcher`'s arguments."""
    return launcher_type(name)(*args, **kwargs)
