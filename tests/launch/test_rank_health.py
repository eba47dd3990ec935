"""A trainer rank that fails or stops answering stops the run with an error naming it and its node, instead of the
driver waiting forever (a dead rank leaves its peers blocked in a collective). Real Ray actors on a local cluster."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # trainer ranks as Ray actors

ray = pytest.importorskip("ray")

from asearch.errors import TrainerRankError  # noqa: E402
from asearch.launch.ray import RayTrainerGroup  # noqa: E402


class _Rank:
    """Answers train_step like a rank, or hangs (a peer blocked in a collective), or raises."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour

    def ping(self) -> bool:
        return True

    def train_step(self, samples, policy_version, progress=None):  # noqa: ANN001, ANN201
        if self.behaviour == "hang":
            time.sleep(120)
        if self.behaviour == "fail":
            raise ValueError("NCCL error: remote process exited")
        return {"loss/policy": float(policy_version)}


@pytest.fixture(scope="module")
def local_ray():
    """A one-node cluster of this process (as tests/launch/test_placement.py starts one), shut down at the end."""
    here = str(Path(__file__).parent)  # the workers import this module for `_Rank`
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
        try:
            yield
        finally:
            ray.shutdown()


@contextlib.contextmanager
def _group(*behaviours: str, timeout_s: float):
    """A RayTrainerGroup over started `_Rank` actors (one per behaviour), killed at the end."""
    actor = ray.remote(num_cpus=0)(_Rank)
    ranks = [actor.remote(b) for b in behaviours]
    try:
        ray.get([r.ping.remote() for r in ranks], timeout=120)  # started: the timeout below is the call's alone
        yield RayTrainerGroup(ranks, 0, timeout_s=timeout_s, nodes=[f"10.213.0.{k + 1}" for k in range(len(ranks))])
    finally:
        for r in ranks:
            ray.kill(r)


def test_answers_come_back_from_every_rank(local_ray) -> None:
    with _group("ok", "ok", timeout_s=60) as group:
        assert group.train_step([], policy_version=3) == {"loss/policy": 3.0}


def test_a_rank_that_stops_answering_is_named_after_the_timeout(local_ray) -> None:
    with _group("ok", "hang", timeout_s=3) as group:
        t0 = time.monotonic()
        with pytest.raises(TrainerRankError, match=r"rank\(s\) 1 \(node 10\.213\.0\.2\) did not answer train_step within 3s"):
            group.train_step([], policy_version=0)
        assert time.monotonic() - t0 < 30


def test_a_failing_rank_is_named_at_once_while_its_peer_waits(local_ray) -> None:
    with _group("hang", "fail", timeout_s=60) as group:
        t0 = time.monotonic()
        with pytest.raises(TrainerRankError, match=r"trainer rank 1 \(node 10\.213\.0\.2\) failed in train_step: ValueError: NCCL error"):
            group.train_step([], policy_version=0)
        assert time.monotonic() - t0 < 30  # not the hanging rank 0's 120 s, nor the 60 s timeout
