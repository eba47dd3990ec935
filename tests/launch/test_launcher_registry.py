"""Launchers by name: the built-in ones register themselves, a new one is a subclass plus a decorator, and
`TrainConfig.launcher` accepts exactly the registered names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asearch.engine.remote.pool import RolloutServersConfig
from asearch.errors import ConfigError
from asearch.launch import registry
from asearch.launch.registry import launcher_names, launcher_type, make_launcher, register_launcher
from asearch.launch.spec import Allocation, Launcher


def test_local_and_ray_register_themselves_without_being_imported() -> None:
    code = "from asearch.launch.registry import launcher_names; print(launcher_names())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "['local', 'ray']", done.stderr[-2000:]


def test_a_new_launcher_is_one_registered_class(tmp_path) -> None:
    with registry.LAUNCHERS.temporary():  # registered for this test only

        @register_launcher("fake")
        class FakeLauncher(Launcher):
            def start(self) -> None:
                self.urls = ["http://127.0.0.1:1"]

            def stop(self) -> None:
                self.urls = []

        assert launcher_names() == ["fake", "local", "ray"] and launcher_type("fake") is FakeLauncher
        launcher = make_launcher("fake", "model", Allocation(), RolloutServersConfig(), log_dir=tmp_path)
        with launcher:
            assert launcher.urls == ["http://127.0.0.1:1"]
        assert launcher.trainer(None, temperature=1.0, total_steps=1) is None  # trains in the run's process

        from asearch.launch.train import TrainConfig

        assert TrainConfig(model="m", data="d", launcher="fake").launcher == "fake"
        with pytest.raises(ValueError, match="needs a launcher that places trainer ranks \\(ray\\)"):
            TrainConfig(model="m", data="d", launcher="fake", allocation={"trainer_ranks": 2})
        with pytest.raises(ValueError, match="launcher 'fake' is taken by"):
            register_launcher("fake")(type("Other", (Launcher,), {}))


def test_unknown_launchers_are_refused_with_the_registered_names() -> None:
    from asearch.launch.train import TrainConfig

    with pytest.raises(ValueError, match="unknown launcher 'slurm'; choose none or one of local, ray"):
        TrainConfig(model="m", data="d", launcher="slurm")
    with pytest.raises(ConfigError, match=r"unknown launcher 'slurm' \(registered: local, ray\)"):
        make_launcher("slurm")


def test_allocation_keys_are_those_of_the_picked_launcher() -> None:
    """The Ray launcher's keys are its own options model (RayAllocation), under the same `allocation.*` names."""
    from asearch.config import load_config
    from asearch.launch.ray import RayAllocation
    from asearch.launch.train import TrainConfig

    base = ["model=m", "data=d"]
    cfg = load_config(TrainConfig, None, [*base, "launcher=ray", "allocation.ray_address=h:6379", "allocation.bind=node"])
    assert isinstance(cfg.allocation, RayAllocation) and cfg.allocation.ray_address == "h:6379"
    assert cfg.model_dump()["allocation"]["bind"] == "node"  # saved with the run's config, reloaded the same
    with pytest.raises(ConfigError, match=r"allocation.ray_address is an option of launcher ray \(launcher=local\)"):
        load_config(TrainConfig, None, [*base, "launcher=local", "allocation.ray_address=h:6379"])
    with pytest.raises(ConfigError, match=r"did you mean 'allocation.ray_address'"):
        load_config(TrainConfig, None, [*base, "launcher=ray", "allocation.ray_adress=h:6379"])
