"""A synthesis endpoint is an engine config of kind openai plus its sampling; the older flat keys load onto it."""

from __future__ import annotations

import warnings

import pytest

from asearch.config import load_config
from asearch.synth.config import EndpointConfig, SynthConfig


def test_endpoint_is_engine_kind_openai_and_old_keys_still_load() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = EndpointConfig(engine={"base_url": "http://h/v1", "model": "g"}, json_mode="json_schema")
    assert (new.engine.kind, new.engine.options.retries, new.engine.options.max_concurrency) == ("openai", 5, 16)
    with pytest.warns(FutureWarning, match=r"llm.<endpoint>.base_url, llm.<endpoint>.model: deprecated"):
        old = EndpointConfig(base_url="http://h/v1", model="g", temperature=0.2)
    assert (old.engine.base_url, old.engine.model, old.temperature) == ("http://h/v1", "g", 0.2)
    assert (old.engine.options.retries, old.engine.options.max_concurrency) == (3, 8)  # the old defaults


def test_a_flat_override_on_a_shipped_config_wins_and_the_agent_uses_that_engine() -> None:
    from pathlib import Path

    import asearch

    path = Path(asearch.__file__).parent / "configs" / "synth-agent.yaml"
    with pytest.warns(FutureWarning):
        cfg = load_config(SynthConfig, path, ["llm.generator.base_url=http://other:1/v1", "agent.engine=null"])
    assert cfg.llm.generator is not None and cfg.llm.generator.engine.base_url == "http://other:1/v1"
    assert cfg.agent_engine() is cfg.llm.generator.engine
    assert "retries" not in cfg.identity()["llm"]["generator"]["engine"]  # how patient, not what is asked
