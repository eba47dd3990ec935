"""The YAML configs ship inside the package: `asearch config list | show`, config names in place of files,
the wheel carries them, and `asearch train` of a shipped config stops before the demo has run, creating
nothing and naming the command to run first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearch.cli.app import app
from asearch.cli.console import resolve_config, shipped_configs
from asearch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_configs_dir_of_a_clone_is_the_shipped_configs() -> None:
    shipped = shipped_configs()
    assert set(shipped) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    assert {"train-world-tiny", "eval", "sim-reference"} <= set(shipped)
    assert all(p.parent == ROOT / "src" / "asearch" / "configs" for p in shipped.values())


def test_config_list_names_each_config_and_its_command() -> None:
    res = CliRunner().invoke(app, ["config", "list"], terminal_width=250)
    assert res.exit_code == 0, res.output
    for name in shipped_configs():
        assert name in res.output
    assert "asearch train train-world-tiny" in res.output and "asearch eval -c eval" in res.output


def test_config_show_prints_the_file_as_written() -> None:
    res = CliRunner().invoke(app, ["config", "show", "train-world-tiny"])
    assert res.exit_code == 0 and res.output == (ROOT / "configs" / "train-world-tiny.yaml").read_text()
    res = CliRunner().invoke(app, ["config", "show", "eval", "--path"])
    assert Path(res.output.strip()).read_text() == (ROOT / "configs" / "eval.yaml").read_text()
    res = CliRunner().invoke(app, ["config", "show", "nosuch"])
    assert isinstance(res.exception, ConfigError) and "train-world-tiny" in str(res.exception)


def test_a_config_is_a_file_or_a_shipped_name(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a pip user's directory: no configs/ here
    own = tmp_path / "mine.yaml"
    own.write_text("seed: 1\n")
    assert resolve_config(own) == own
    shipped = shipped_configs()["train-world-tiny"]
    for form in ("train-world-tiny", "train-world-tiny.yaml", "configs/train-world-tiny.yaml"):
        assert resolve_config(form) == shipped
    with pytest.raises(ConfigError, match="is a directory"):
        resolve_config(tmp_path)
    with pytest.raises(ConfigError, match=r"train-wrld-tiny: no such file.*train-world-tiny"):
        resolve_config("train-wrld-tiny")
    with pytest.raises(ConfigError, match="no such file"):
        resolve_config("elsewhere/train-world-tiny.yaml")  # a path that is not there is not a name


def test_the_wheel_carries_the_configs(tmp_path) -> None:
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", "dist", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("asearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"asearch/configs/{n}.yaml" for n in shipped_configs()} <= set(names)


@pytest.mark.parametrize("form", ["train-world-tiny", "configs/train-world-tiny.yaml"])
def test_train_before_the_demo_names_the_demo_and_creates_nothing(form: str, tmp_path) -> None:
    env = {**os.environ, "COLUMNS": "300", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "asearch", "train", form], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "model=runs/demo-seed0/model-sft: no such file or directory" in res.stderr
    assert "data=runs/demo-seed0/data/rl.jsonl: no such file or directory" in res.stderr
    assert "run `asearch demo --seed 0 --out runs/demo-seed0` first" in res.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing at all


def test_train_checks_only_local_paths(tmp_path) -> None:
    """A hub name or alias is the loader's business; a missing path elsewhere is named without a demo hint."""
    from asearch.cli.train import check_inputs_exist
    from asearch.config import load_config
    from asearch.launch.train import TrainConfig

    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "q", "golds": ["a"]}\n')
    for model in ("smollm2-135m-instruct", "Qwen/Qwen2.5-0.5B-Instruct", str(tmp_path)):
        cfg = load_config(TrainConfig, None, [f"model={model}", f"data={data}"])
        check_inputs_exist(cfg, Path("x.yaml"))
    cfg = load_config(TrainConfig, None, ["model=models/mine/sft", "data=world:seed=1,n=5"])
    with pytest.raises(ConfigError, match="model=models/mine/sft: no such file") as err:
        check_inputs_exist(cfg, Path("x.yaml"))
    assert "asearch demo" not in str(err.value)
