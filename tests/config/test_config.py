"""The config system: YAML + overrides, and errors that name file, line and the nearest valid key."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import Field, model_validator

from asearch.config import Config, apply_overrides, dump_config, load_config
from asearch.errors import ConfigError


class Inner(Config):
    k1: float = 1.5
    method: Literal["bm25", "dense"] = "bm25"


class Outer(Config):
    name: str = "x"
    topk: int = Field(5, ge=1)
    inner: Inner = Inner()
    tags: list[str] = []


def test_defaults_yaml_and_overrides_compose(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: run\ninner:\n  k1: 0.9\n")
    cfg = load_config(Outer, p, ["inner.method=dense", "topk=7", "tags=[a, b]"])
    assert cfg.name == "run" and cfg.topk == 7
    assert cfg.inner.k1 == 0.9 and cfg.inner.method == "dense"
    assert cfg.tags == ["a", "b"]


def test_unknown_key_names_file_line_and_nearest(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: run\ninner:\n  k1: 0.9\n  methd: dense\n")
    with pytest.raises(ConfigError) as e:
        load_config(Outer, p)
    msg = str(e.value)
    assert f"{p}:4" in msg
    assert "inner.methd" in msg and "did you mean 'inner.method'" in msg


def test_unknown_override_key_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'topkk'.*did you mean 'topk'"):
        load_config(Outer, None, ["topkk=3"])


def test_bad_value_shows_value_and_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("topk: 0\n")
    with pytest.raises(ConfigError) as e:
        load_config(Outer, p)
    assert f"{p}:1" in str(e.value) and "got 0" in str(e.value)
    with pytest.raises(ConfigError, match="inner.method"):
        load_config(Outer, None, ["inner.method=tfidf"])


def test_invalid_yaml_names_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: run\ninner: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: invalid YAML"):
        load_config(Outer, p)


def test_missing_file_and_malformed_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides({}, ["novalue"])


def test_override_values_parse_as_yaml_scalars_lists_and_flow_mappings():
    data = apply_overrides({}, ["a=3", "b=true", "c=[x, y]", "d={k: 1}", "e=null", "f=query: ", "g=a: b: c", "h="])
    assert data == {"a": 3, "b": True, "c": ["x", "y"], "d": {"k": 1}, "e": None, "f": "query: ", "g": "a: b: c", "h": ""}


def test_dump_round_trip(tmp_path):
    cfg = load_config(Outer, None, ["inner.k1=2.0", "name=abc"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Outer, tmp_path / "resolved.yaml") == cfg


class WithFactoryDefault(Config):
    inner: Inner = Field(default_factory=lambda: Inner(k1=9.0))
    nested: Outer = Field(default_factory=lambda: Outer(topk=3, inner=Inner(method="dense")))


def test_a_partial_override_keeps_the_values_a_field_default_sets(tmp_path):
    """`inner.method=dense` on a field whose default is Inner(k1=9.0) keeps k1=9.0 (it used to fall back to
    Inner's class default 1.5), at any depth, from YAML as from overrides."""
    cfg = load_config(WithFactoryDefault, None, ["inner.method=dense", "nested.inner.k1=2.0"])
    assert cfg.inner == Inner(k1=9.0, method="dense")
    assert cfg.nested.topk == 3 and cfg.nested.inner == Inner(k1=2.0, method="dense")
    p = tmp_path / "c.yaml"
    p.write_text("nested:\n  name: y\n")
    cfg = load_config(WithFactoryDefault, p)
    assert (cfg.nested.name, cfg.nested.topk, cfg.nested.inner.method) == ("y", 3, "dense")
    assert cfg.inner == Inner(k1=9.0)  # untouched: the default


class Span(Config):
    whole_value = True  # one value: a mapping given for it is complete, not merged over the default
    lo: float | None = None
    hi: float | None = None


class WithWholeValue(Config):
    span: Span = Field(default_factory=lambda: Span(lo=1.0))
    inner: Inner = Field(default_factory=lambda: Inner(k1=9.0))


def test_a_whole_value_model_replaces_its_default_instead_of_merging(tmp_path):
    """A distribution-like field (`whole_value`) given as a mapping is the whole new value: `span: {hi: 2}`
    gives lo=None, not the default's lo=1.0 (a pareto with `mean` must not inherit the default `alpha`)."""
    p = tmp_path / "c.yaml"
    p.write_text("span: {hi: 2}\ninner: {method: dense}\n")
    cfg = load_config(WithWholeValue, p)
    assert cfg.span == Span(hi=2.0)
    assert cfg.inner == Inner(k1=9.0, method="dense")  # an ordinary model still merges
    assert load_config(WithWholeValue, None, ["span.hi=3"]).span == Span(hi=3.0)
    assert load_config(WithWholeValue).span == Span(lo=1.0)


class Renamed(Config):
    """A model whose validator refuses an old key name for the whole section, as TrainConfig does."""

    trainer_threads: int = 1
    inner: Inner = Inner()
    notes: str = ""

    @model_validator(mode="before")
    @classmethod
    def _threads_renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "threads" in data:
            raise ValueError("`threads` is now `trainer_threads`")
        return data


def test_a_renamed_key_error_names_key_file_line_and_nearest_without_the_config(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("notes: " + "long text " * 40 + "\ninner:\n  k1: 0.5\nthreads: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(Renamed, p)
    msg = str(e.value)
    assert f"key 'threads' at {p}:4, nearest valid key 'trainer_threads'" in msg, msg
    assert "long text" not in msg and "k1" not in msg and len(msg.replace(str(p), "F")) < 150, msg


def test_a_long_bad_value_is_shortened(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(Outer, None, ["topk=" + "x" * 300])
    assert "x" * 80 not in str(e.value) and "x" * 70 + "..." in str(e.value), str(e.value)
