"""Episodes that met an infrastructure fault leave their group: the advantages compare the clean ones, a group
left with fewer than 2 is rejected as "infra_fault", and the counts reach the metrics; then a real `asearch
train` run with 20% injected tool faults completes and trains on clean episodes only."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from collections import Counter

import pytest

from asearch.agent.trajectory import Segment, Trajectory
from asearch.rl.controller import ControllerConfig, RolloutController
from asearch.rl.loop import EvalSchedule, LoopConfig, TrainingLoop
from asearch.runs import RunDir


def _episode(i: int, reward: float, faults: dict[str, int] | None = None, version: int = 0) -> Trajectory:
    seg = Segment()
    seg.extend_context([1])
    seg.extend_generated([2, 3], [-0.5, -0.5], [version, version])
    return Trajectory(id=f"e{i}", question="q?", style="x", segments=[seg], answer="a", finish="answer",
                      reward=reward, score=reward, infra_faults=dict(faults or {}))  # fmt: skip


def _one_group(faulted: dict[int, dict[str, int]], rewards: list[float]) -> tuple[RolloutController, list]:
    """One group of len(rewards) samples, sample k faulted as `faulted[k]`; (controller, batch or None)."""
    cfg = ControllerConfig(batch_size=1, group_size=len(rewards), max_concurrent=1, drop_zero_variance=False)

    async def episode(sample, k):
        await asyncio.sleep(0)
        return _episode(k, rewards[k], faulted.get(k))

    async def main():
        ctl = RolloutController(cfg, iter([(0, "q0")]), episode)
        ctl.start()
        batch = await ctl.get_batch()
        await ctl.close()
        return ctl, batch

    return asyncio.run(main())


def test_faulted_episodes_leave_the_group_whatever_their_reward() -> None:
    # the faulted samples earned the best reward: masking must not keep them for it
    ctl, batch = _one_group({1: {"timeout": 1}, 3: {"remote": 2, "garbage": 1}}, [0.0, 1.0, 1.0, 1.0])
    (group,) = batch
    assert [t.id for t in group.trajectories] == ["e0", "e2"] and group.rewards == [0.0, 1.0]
    assert ctl.masked_episodes == 2
    assert ctl.masked_by_kind == Counter({"timeout": 1, "remote": 1, "garbage": 1})  # episodes per kind met
    assert not ctl.rejected


def test_masked_counts_survive_a_checkpoint() -> None:
    """A resumed run's rollout/masked_episodes go on from the checkpoint's, not from zero."""
    ctl, _ = _one_group({1: {"timeout": 1}, 3: {"remote": 2, "garbage": 1}}, [0.0, 1.0, 1.0, 1.0])
    state = json.loads(json.dumps(ctl.state_dict()))
    resumed = RolloutController(ctl.cfg, iter([]), ctl.run_episode, **RolloutController.restore_parts(state))
    assert resumed.masked_episodes == 2
    assert resumed.masked_by_kind == Counter({"timeout": 1, "remote": 1, "garbage": 1})


def test_a_group_left_with_one_clean_episode_is_rejected_as_infra_fault() -> None:
    ctl, batch = _one_group({0: {"remote": 1}, 1: {"remote": 1}, 2: {"timeout": 1}}, [1.0, 0.0, 1.0, 0.0])
    assert batch is None  # the only prompt's group was rejected: the data ran out
    assert ctl.rejected == Counter({"infra_fault": 1}) and ctl.masked_episodes == 3
    assert ctl.staleness.rejected == 1 and ctl.staleness.accepted == 0  # its capacity was given back


def test_a_group_of_one_is_kept_when_clean() -> None:
    _, batch = _one_group({}, [1.0])
    assert batch is not None and len(batch[0].trajectories) == 1


# --------------------------------------------------------------------------- the loop on smaller groups


class _Engine:
    version = 0


class _Workflow:
    """Group g's samples are episodes 4g .. 4g+3 (groups run one at a time); the last of each is faulted."""

    def __init__(self) -> None:
        self.i = 0
        self.rejected: Counter[str] = Counter()

    async def arun_episode(self, engine, item, *, seed=None):
        i, self.i = self.i, self.i + 1
        await asyncio.sleep(0)
        return _episode(i, float(i % 2), {"remote": 1} if i % 4 == 3 else None, engine.version)


class _Trainer:
    def __init__(self) -> None:
        self.advantages: list[list[float]] = []

    def train_step(self, samples, *, policy_version, progress=None):
        self.advantages.append([round(s.advantage, 4) for s in samples])
        return {"loss/policy": 0.0}

    def save_checkpoint(self, directory):
        pass  # nothing to keep: the test reads the advantages each step saw

    def load_checkpoint(self, directory):
        pass

    def weights_digest(self):
        return [0.0, 0.0]


class _Weights:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    async def push(self, version: int) -> None:
        self.engine.version = version


def test_the_loop_computes_advantages_over_the_clean_episodes_of_each_group(tmp_path) -> None:
    cfg = LoopConfig(
        rollout=ControllerConfig(batch_size=1, group_size=4, max_staleness=0, max_concurrent=1, drop_zero_variance=False),
        steps=2, heldout=EvalSchedule(every_s=None),
    )  # fmt: skip
    engine, trainer = _Engine(), _Trainer()
    loop = TrainingLoop(
        cfg, run=RunDir(tmp_path, tensorboard=False), engine=engine, trainer=trainer, workflow=_Workflow(),
        records=[{"id": "q", "question": "q?", "golds": ["a"]}], weights=_Weights(engine), log=lambda _: None,
    )  # fmt: skip
    summary = asyncio.run(loop.run())
    assert summary["steps"] == 2
    # clean rewards [0, 1, 0] (the faulted 4th left): GRPO over those three only
    std = math.sqrt(2 / 9)
    expected = sorted(round(a, 4) for a in (-1 / 3 / std, 2 / 3 / std, -1 / 3 / std))
    assert [sorted(a) for a in trainer.advantages] == [expected, expected]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/masked_episodes/remote"] for r in rows if "perf/step_s" in r][-1] >= 2
    assert all(r["rollout/accuracy"] == pytest.approx(1 / 3) for r in rows if "perf/step_s" in r)


# --------------------------------------------------------------------------- a real run with 20% faults


def test_a_real_training_run_with_20_percent_tool_faults_trains_on_clean_episodes_only(
    tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    """The random tiny model is led into one search per episode (the loop opens the act turn with <search>),
    so about a fifth of the episodes meet an injected fault."""
    out = tmp_path / "run"
    cmd = [
        *train_command(tiny_world_model_dir, out, 3, batch=2, group=4),
        'agent.style_options.act_prefixes=["<search>", "<answer>"]', "agent.style_options.close_opened_actions=true",
        "tools.faults.timeout=0.07", "tools.faults.server_error=0.07", "tools.faults.garbage=0.06", "tools.faults.seed=0",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    injected = {k: last[f"faults/injected/{k}"] for k in ("timeout", "server_error", "garbage")}
    masked = {k: last.get(f"rollout/masked_episodes/{k}", 0.0) for k in ("timeout", "remote", "garbage")}
    assert (
        last["faults/injected"] == sum(injected.values()) > 0
        and last["faults/calls"] > last["faults/injected"]
    )
    assert last["rollout/masked_episodes"] > 0 and sum(masked.values()) == last["rollout/masked_episodes"]
    # one search per episode: each masked episode met one fault, of the kind injected (503 -> remote)
    assert masked["timeout"] <= injected["timeout"] and masked["remote"] <= injected["server_error"]
    assert masked["garbage"] <= injected["garbage"]
    trained = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trained and all(t["infra_faults"] == {} for t in trained)  # only clean episodes reach the loss
    assert all(t["counters"].get("searches") == 1 for t in trained)
    per_group = Counter(t["step"] for t in trained)
    assert all(2 <= n <= 4 for n in per_group.values())
    print(f"faults injected {injected} of {last['faults/calls']:.0f} calls; episodes masked {masked}; "
          f"groups rejected {json.loads((out / 'summary.json').read_text())['rejected_groups']}")  # fmt: skip
