"""Named starting points of `asearch demo --preset NAME`: settings laid under the config file and overrides.

`default` is the demo as `DemoConfig`'s defaults describe it (search-only, 1-3 hops, `make demo`). The others
are shipped YAML configs, `src/asearch/configs/demo-<name>.yaml` (`asearch config show demo-long`): `long`
trains the whole ASearcher behaviour on long pages (access, reading turns with summaries, 1-6 hops, context
compaction), `smollm2` warm-starts the pretrained SmolLM2-135M-Instruct with LoRA. docs/demo.md explains
their values and the runs behind them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

PRESET_NAMES = ("default", "long", "smollm2")


def preset_file(name: str) -> Path | None:
    """The shipped config of preset `name` (None for `default`: the config model's own defaults)."""
    if name == "default":
        return None
    return Path(str(resources.files("asearch") / "configs" / f"demo-{name}.yaml"))


def _read(name: str) -> dict[str, Any]:
    path = preset_file(name)
    return {} if path is None else yaml.safe_load(path.read_text()) or {}


PRESETS: dict[str, dict[str, Any]] = {name: _read(name) for name in PRESET_NAMES}


def preset(name: str) -> dict[str, Any]:
    """The settings of preset `name`; ConfigError naming the known presets otherwise."""
    from asearch.errors import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"unknown demo preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
