"""`asearch synth` commands (run, report) through the top-level CLI, and the shipped configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearch.cli.app import app
from asearch.config import load_config
from asearch.synth import SynthConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "backend"), [("synth-world.yaml", "graph"), ("synth-llm.yaml", "llm")])
def test_shipped_configs_validate(name, backend):
    assert load_config(SynthConfig, ROOT / "configs" / name).backend == backend


def test_run_then_report_rebuilds_the_same_outputs(tmp_path, monkeypatch, silent_solver):
    # the default solver (SmolLM2 in process) is heavy here; the command is what is under test
    monkeypatch.setattr("asearch.synth.solver.build_solver", lambda cfg: silent_solver)
    # `asearch synth CONFIG ...` is `asearch synth run CONFIG ...`
    args = ["synth", str(ROOT / "configs" / "synth-world.yaml"), "--out", str(tmp_path), "--no-progress",
            "n_questions=5", "graph.entities=300", "graph.world_seed=9", "concurrency=2"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "questions written" in result.output
    first = (tmp_path / "questions.jsonl").read_text()
    report = json.loads((tmp_path / "filter_report.json").read_text())
    assert report["questions"]["written"] == len(first.splitlines()) >= 5
    (tmp_path / "questions.jsonl").unlink()
    result = CliRunner().invoke(app, ["synth", "report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "questions.jsonl").read_text() == first
    assert "questions written" in result.output


def test_bad_override_names_the_key(tmp_path):
    config = str(ROOT / "configs" / "synth-world.yaml")
    result = CliRunner().invoke(app, ["synth", "run", config, "--out", str(tmp_path), "gates.max_corect=1"])
    assert result.exit_code != 0
    assert "max_correct" in str(result.exception) or "max_correct" in result.output


def test_bad_yaml_value_names_file_line_and_field(tmp_path):
    from asearch.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: graph\nrounds: 3\ngates:\n  max_correct: -1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:4.*gates\.max_correct"):
        load_config(SynthConfig, bad)


def test_the_docs_describe_every_config_key():
    from pydantic import BaseModel

    from asearch.synth.config import EndpointConfig

    docs = (ROOT / "docs" / "synthesis.md").read_text()

    def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            sub = next(
                (c for c in (f.annotation, *getattr(f.annotation, "__args__", ())) if isinstance(c, type)
                 and issubclass(c, BaseModel) and c is not EndpointConfig),
                None,
            )  # fmt: skip
            out += keys(sub, f"{prefix}{name}.") if sub is not None else [f"{prefix}{name}"]
        return out

    missing = [k for k in keys(SynthConfig) + keys(EndpointConfig) if f"| `{k}` |" not in docs]
    assert not missing, f"docs/synthesis.md has no row for {missing}"
