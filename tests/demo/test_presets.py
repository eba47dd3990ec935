"""The demo's presets are shipped YAML configs (configs/demo-<name>.yaml) that `DemoConfig` validates;
`--preset NAME` and `-c demo-NAME` are the same settings."""

from __future__ import annotations

import pytest

from asearch.agent.expert import READING_STYLE
from asearch.cli.console import shipped_configs
from asearch.config import load_config
from asearch.demo.pipeline import DemoConfig
from asearch.demo.presets import PRESET_NAMES, preset, preset_file
from asearch.errors import ConfigError


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_a_preset_is_a_shipped_config_the_demo_model_validates(name: str) -> None:
    as_preset = load_config(DemoConfig, None, ["seed=1"], base=preset(name))
    assert as_preset.preset == name
    path = preset_file(name)
    if path is None:  # default: the model's own defaults
        assert as_preset == DemoConfig(seed=1)
        return
    assert shipped_configs()[f"demo-{name}"] == path
    assert load_config(DemoConfig, path, ["seed=1"]) == as_preset


def test_the_long_preset_writes_as_the_reading_expert_does() -> None:
    """The YAML spells out the reading expert's format: the expert's SFT episodes and the RL prompts must agree."""
    options = load_config(DemoConfig, None, [], base=preset("long")).rl.agent.style_options
    extra = {"compact_read_blocks": 0, "compact_when": "full", "read_max_new_tokens": 24}
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in {**READING_STYLE, **extra}.items()} == options


def test_an_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="default, long, smollm2"):
        preset("longer")
