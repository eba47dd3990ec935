"""The rollout controller under random, heavy-tailed completion orders, with a kill and resume."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from asearch.agent.trajectory import Segment, Trajectory
from asearch.rl.controller import ControllerConfig, RolloutController


def _traj(version_at_start: int, version_at_end: int, reward: float) -> Trajectory:
    seg = Segment()
    seg.extend_context([1, 2])
    seg.extend_generated([3, 4], [0.0, 0.0], [version_at_start, version_at_end])
    return Trajectory(id="t", question="q", style="x", segments=[seg], answer=str(reward), finish="answer", reward=reward)


def _simulate(seed: int, eta: int, steps: int, kill_at: int | None, order: str = "finished"):
    rng = random.Random(seed)
    cfg = ControllerConfig(
        batch_size=3, group_size=2, max_staleness=eta, max_concurrent=rng.randint(1, 8), batch_order=order
    )
    n_data = 200
    trained: list[int] = []
    worst = {"staleness": 0}

    async def main():
        holder = {}

        async def episode(sample, k):
            ctl = holder["ctl"]
            v0 = ctl.version
            # heavy tail: most episodes are short, a few are ~30x longer
            await asyncio.sleep(rng.choice([0.0005] * 9 + [0.015]))
            if rng.random() < 0.05:
                raise RuntimeError("tool crashed")
            return _traj(v0, ctl.version, float(rng.random() < 0.5))

        def make(state=None):
            parts = RolloutController.restore_parts(state) if state else {}
            start = parts.get("data_position", 0)
            data = iter([(i, f"q{i}") for i in range(start, n_data)])
            ctl = RolloutController(cfg, data, episode, **parts)
            holder["ctl"] = ctl
            ctl.start()
            return ctl

        ctl = make()
        for step in range(steps):
            if step == kill_at:  # checkpoint, lose everything in memory, resume from the checkpoint
                state = json.loads(json.dumps(ctl.state_dict()))
                await ctl.close()
                ctl = make(state)
            batch = await ctl.get_batch()
            assert batch is not None
            for g in batch:
                worst["staleness"] = max(worst["staleness"], ctl.version - g.min_version)
                trained.append(g.index)
            ctl.set_version(ctl.version + 1)
            await asyncio.sleep(rng.choice([0.0, 0.002]))  # "training"
        rejected = dict(ctl.rejected)
        pending = len(ctl.ready) + len(ctl.inflight) + len(ctl.redo)
        accounted = len(trained) + sum(rejected.values()) + pending
        assert accounted == ctl.data_position, f"{ctl.data_position} prompts pulled, {accounted} accounted for"
        await ctl.close()
        return rejected

    rejected = asyncio.run(main())
    return trained, rejected, worst["staleness"]


@pytest.mark.parametrize("order", ["finished", "admitted"])
@pytest.mark.parametrize("eta", [0, 1, 2, 4])
@pytest.mark.parametrize("seed", range(6))
def test_staleness_bound_holds_per_group(seed, eta, order):
    trained, _, worst = _simulate(seed, eta, steps=10, kill_at=None, order=order)
    assert worst <= eta
    assert len(trained) == 30 and len(set(trained)) == 30  # no group trained twice


@pytest.mark.parametrize("eta", [0, 1, 3])
@pytest.mark.parametrize("seed", range(6))
def test_admitted_order_trains_in_admission_order_and_drops_nothing_as_stale(seed, eta):
    """batch_order="admitted": a batch waits for older groups, so batches keep admission order, and the
    admission rule alone keeps every group within the bound: none is cancelled or dropped as stale, so
    long groups are trained as in synchronous RL."""
    trained, rejected, worst = _simulate(seed, eta, steps=10, kill_at=None, order="admitted")
    assert trained == sorted(trained)  # data positions are admission order without a resume
    assert rejected.get("stale", 0) == 0 and worst <= eta


@pytest.mark.parametrize("order", ["finished", "admitted"])
@pytest.mark.parametrize("eta", [0, 2])
@pytest.mark.parametrize("seed", range(4))
def test_bound_and_no_loss_across_kill_and_resume(seed, eta, order):
    trained, rejected, worst = _simulate(seed, eta, steps=10, kill_at=5, order=order)
    assert worst <= eta
    assert len(set(trained)) == len(trained) == 30
    assert rejected.get("error", 0) > 0  # failures are counted by cause (and the accounting above holds)


def test_a_group_with_a_rejected_episode_is_rejected_and_counted() -> None:
    """The workflow returns None for an episode it rejects: the group cannot be compared within itself."""
    cfg = ControllerConfig(batch_size=1, group_size=2, max_staleness=0, max_concurrent=1, drop_zero_variance=False)

    async def episode(sample, k):
        return None if sample == "bad" and k == 1 else _traj(0, 0, float(k))

    async def main():
        ctl = RolloutController(cfg, iter([(0, "bad"), (1, "good")]), episode)
        ctl.start()
        batch = await ctl.get_batch()
        await ctl.close()
        return batch, dict(ctl.rejected)

    batch, rejected = asyncio.run(main())
    assert [g.sample for g in batch] == ["good"] and batch[0].rewards == [0.0, 1.0]
    assert rejected == {"rejected_episode": 1}


def test_an_unscored_trajectory_is_an_error_not_a_zero_reward() -> None:
    cfg = ControllerConfig(batch_size=1, group_size=1, max_staleness=0, max_concurrent=1, drop_zero_variance=False)

    async def episode(sample, k):
        t = _traj(0, 0, 1.0)
        t.reward = None if sample == "unscored" else 1.0
        return t

    async def main():
        ctl = RolloutController(cfg, iter([(0, "unscored"), (1, "scored")]), episode)
        ctl.start()
        batch = await ctl.get_batch()
        await ctl.close()
        return batch, dict(ctl.rejected), ctl.errors

    batch, rejected, errors = asyncio.run(main())
    assert [g.sample for g in batch] == ["scored"] and rejected == {"error": 1} and "unscored" in errors[0]


def test_close_cancels_the_groups_in_flight_without_counting_them_as_rejected() -> None:
    """A run's summary is taken after close: the groups it cancels would otherwise count as stale there, while the
    checkpoint taken before lists them to regenerate."""
    cfg = ControllerConfig(batch_size=2, group_size=2, max_staleness=1, max_concurrent=4)
    release = asyncio.Event()

    async def episode(sample, k):
        await release.wait()  # every group stays in flight until the test lets them go
        return _traj(0, 0, float(k))

    async def main():
        ctl = RolloutController(cfg, iter([(i, f"q{i}") for i in range(100)]), episode)
        ctl.start()
        while len(ctl.inflight) < 4:
            await asyncio.sleep(0.001)
        state = ctl.state_dict()
        await ctl.close()
        return ctl, state

    ctl, state = asyncio.run(main())
    assert len(state["redo"]) == 4  # the checkpoint regenerates them
    assert not ctl.inflight and sum(ctl.rejected.values()) == 0 and ctl.staleness.rejected == 0
