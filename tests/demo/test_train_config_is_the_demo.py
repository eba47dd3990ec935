"""configs/train-world-tiny.yaml is the demo's RL stage: every key equal, but where the demo puts its run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from asearch.config import load_config  # noqa: E402
from asearch.demo.pipeline import DemoConfig  # noqa: E402
from asearch.launch.train import TrainConfig  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


def _dump(cfg: TrainConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def test_train_world_tiny_is_the_demo_rl_stage_of_seed_0() -> None:
    demo = DemoConfig(seed=0).rl_stage(Path("runs/demo-seed0"))
    yaml = load_config(TrainConfig, CONFIGS / "train-world-tiny.yaml")
    # page format, result layout, urls, temperature, epochs, token budget, corpora, files: all the same;
    # only the run directory differs (the demo trains into RUN/rl, `asearch train` into runs/train-...)
    assert _differences(_dump(demo), _dump(yaml)) == ["out"]


def test_train_smollm2_lora_is_the_smollm2_preset_rl_stage_of_seed_0() -> None:
    from asearch.demo.presets import preset

    demo = load_config(DemoConfig, None, ["seed=0"], base=preset("smollm2")).rl_stage(Path("runs/demo-smollm2-seed0"))
    yaml = load_config(TrainConfig, CONFIGS / "train-smollm2-lora.yaml")
    assert _differences(_dump(demo), _dump(yaml)) == ["out"]


def test_the_local_launcher_config_differs_only_in_where_it_generates() -> None:
    tiny = load_config(TrainConfig, CONFIGS / "train-world-tiny.yaml")
    local = load_config(TrainConfig, CONFIGS / "train-world-tiny-local.yaml")
    assert _differences(_dump(tiny), _dump(local)) == ["launcher", "rollout_servers"]


def test_the_comparison_sees_a_changed_setting() -> None:
    demo = DemoConfig(seed=0)
    other = load_config(DemoConfig, None, ["rl.trainer.epochs=1", "rl.tools.search.show_urls=true"])
    assert _differences(_dump(demo.rl), _dump(other.rl)) == [
        "heldout.tools.search.show_urls", "tools.search.show_urls", "trainer.epochs",
    ]  # fmt: skip


def test_rl_follows_the_demo_seed_and_moved_keys_say_where_they_went() -> None:
    from asearch.errors import ConfigError

    cfg = load_config(DemoConfig, None, ["seed=1", "rl.max_rl_seconds=15"])
    assert cfg.rl.seed == 1 and cfg.rl.max_rl_seconds == 15
    assert cfg.rl.tools.corpus == "world:seed=3,entities=1000,names=255,pages=facts"  # training world 2s+1
    assert cfg.rl.heldout.tools.corpus == "world:seed=130,entities=1000,names=255,pages=facts"  # held-out 2s+128
    with pytest.raises(ConfigError, match=r"rl_seconds -> rl.max_rl_seconds"):
        load_config(DemoConfig, None, ["rl_seconds=15"])
    with pytest.raises(ConfigError, match=r"demo's own files"):
        load_config(DemoConfig, None, ["rl.data=other.jsonl"])
