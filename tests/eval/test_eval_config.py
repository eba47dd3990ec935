"""The judge's endpoint is an engine config of kind openai; the older flat keys load onto it with a warning."""

from __future__ import annotations

import warnings

import pytest

from asearch.config import load_config
from asearch.errors import ConfigError
from asearch.eval.config import EvalConfig, JudgeConfig, build_judge


def test_the_judge_endpoint_is_engine_kind_openai() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new shape warns about nothing
        cfg = load_config(
            EvalConfig,
            overrides=["judge.engine.base_url=http://127.0.0.1:9/v1", "judge.engine.model=m", "judge.engine.retries=1"],
        )
    engine = cfg.judge.engine
    assert engine is not None and (engine.kind, engine.base_url, engine.model) == ("openai", "http://127.0.0.1:9/v1", "m")
    assert engine.options.retries == 1 and cfg.judge.model_name == "m" and not cfg.judge.prefills_verdict
    judge, client = build_judge(cfg.judge)
    assert client.base_url == "http://127.0.0.1:9/v1" and client._http.retry.retries == 1 and judge.model == "m"


def test_old_judge_keys_map_onto_the_engine_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match=r"judge.transport_retries, judge.url: deprecated, use judge.engine"):
        old = JudgeConfig(url="http://x/v1", model="m", timeout_s=5, transport_retries=0)
    e = old.engine
    assert e is not None and (e.base_url, e.model) == ("http://x/v1", "m")
    assert (e.options.timeout_s, e.options.retries, e.options.max_concurrency) == (5, 0, 8)  # old defaults kept
    local = JudgeConfig(local=True, model="tiny")  # with local, `model` is the model to serve: not moved
    assert local.engine is None and local.model_name == "tiny"
    with pytest.raises(ConfigError, match="needs judge.engine.model"):
        load_config(JudgeConfig, overrides=["engine.base_url=http://x/v1"])
    with pytest.raises(ConfigError, match="engine kind openai"):
        load_config(JudgeConfig, overrides=["engine.kind=inprocess"])
