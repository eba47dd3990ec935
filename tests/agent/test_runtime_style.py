"""The style default for small instruct models is one rule, shared by `asearch ask` and `asearch eval`."""

from __future__ import annotations

import pytest

from asearch.agent.runtime import RuntimeConfig, apply_model_style_default
from asearch.config import load_config


@pytest.mark.parametrize(
    ("overrides", "style", "switched"),
    [
        ([], "guided", True),  # the default model is SmolLM2-135M: it needs its turns opened for it
        (["agent.max_turns=4"], "guided", True),  # other agent keys do not count as choosing a style
        (["agent.style=asearcher"], "asearcher", False),  # an explicit choice always wins
        (["engine.model=/models/qwen-7b"], "asearcher", False),  # other models keep the default style
    ],
)
def test_small_instruct_models_get_the_guided_style_unless_one_is_chosen(overrides, style, switched):
    cfg = load_config(RuntimeConfig, None, overrides)
    note = apply_model_style_default(cfg)
    assert cfg.agent.style == style and (note is not None) == switched
