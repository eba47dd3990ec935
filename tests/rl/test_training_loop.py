"""The RL loop on parts it is handed (fakes here: no model, no tools, no launcher): its phases in order,
the held-out evaluation between a step and the push that replaces the version it measures, resume."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from asearch.agent.trajectory import Segment, Trajectory
from asearch.rl.checkpoint import resume_from_checkpoint
from asearch.rl.controller import ControllerConfig
from asearch.rl.loop import EvalSchedule, LoopConfig, TrainingLoop
from asearch.runs import RunDir

RECORDS = [{"id": f"q{i}", "question": f"q{i}?", "golds": ["a"]} for i in range(5)]


class Events(list):
    """What happened, in order: ("episode", version), ("train", version), ("push", v), ("eval", v)."""


class FakeEngine:
    version = 0


class FakeWorkflow:
    def __init__(self, engine: FakeEngine, events: Events):
        self.engine, self.events, self.k = engine, events, 0
        self.rejected: Counter[str] = Counter()

    async def arun_episode(self, engine, item, *, seed=None):
        assert engine is self.engine  # the loop hands its engine to the workflow
        await asyncio.sleep(0)
        self.k += 1
        seg = Segment()
        seg.extend_context([1])
        seg.extend_generated([2, 3], [-0.5, -0.5], [engine.version] * 2)
        reward = float(self.k % 2)  # alternating: no group has zero variance
        return Trajectory(id=f"{item['id']}-{self.k}", question=item["question"], style="x", segments=[seg],
                          answer="a", finish="answer", reward=reward, score=reward)  # fmt: skip


class FakeTrainer:
    def __init__(self, events: Events):
        self.events, self.steps = events, 0

    def train_step(self, samples, *, policy_version, progress=None):
        assert samples and sorted(round(s.advantage, 3) for s in samples) == [-1.0, 1.0]  # GRPO over 0/1 rewards
        self.events.append(("train", policy_version))
        self.steps += 1
        return {"loss/policy": 0.0}

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]

    def save_checkpoint(self, directory):
        (directory / "fake_trainer.json").write_text(json.dumps(self.state_dict()))

    def load_checkpoint(self, directory):
        self.load_state_dict(json.loads((directory / "fake_trainer.json").read_text()))

    def weights_digest(self):
        return [float(self.steps), 0.0]


class FakeWeights:
    def __init__(self, engine: FakeEngine, events: Events):
        self.engine, self.events = engine, events

    async def push(self, version: int) -> None:
        self.engine.version = version
        self.events.append(("push", version))


def _run(tmp_path, steps: int, events: Events) -> tuple[dict, FakeTrainer]:
    cfg = LoopConfig(
        rollout=ControllerConfig(batch_size=1, group_size=2, max_staleness=1, max_concurrent=2),
        steps=steps, checkpoint_every=2, heldout=EvalSchedule(every_s=None, every_steps=1),
    )  # fmt: skip
    run, engine, trainer = RunDir(tmp_path, tensorboard=False), FakeEngine(), FakeTrainer(events)

    async def heldout() -> float:
        events.append(("eval", engine.version))
        return 0.5

    async def main():
        resume = resume_from_checkpoint(run, trainer, log=lambda _: None)
        engine.version = resume.step
        loop = TrainingLoop(
            cfg, run=run, engine=engine, trainer=trainer, workflow=FakeWorkflow(engine, events), records=RECORDS,
            weights=FakeWeights(engine, events), resume=resume, heldout=heldout, log=lambda _: None,
            step_metrics=lambda: {"web/cache/hits": 0.0},
        )  # fmt: skip
        return await loop.run()

    return asyncio.run(main()), trainer


def test_phases_run_in_order_over_the_parts_it_is_handed(tmp_path) -> None:
    events = Events()
    summary, trainer = _run(tmp_path, 3, events)
    assert [e for e in events if e[0] == "push"] == [("push", 1), ("push", 2), ("push", 3)]
    assert [e for e in events if e[0] == "train"] == [("train", 0), ("train", 1), ("train", 2)]
    # each evaluation measures one version: it starts after that version's push, before the next push
    for v in range(3):
        assert events.index(("push", v + 1)) > events.index(("eval", v))
    assert ("eval", 3) in events  # the final version too
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "perf/step_s" in r]
    assert [r["step"] for r in trained] == [1, 2, 3]
    assert all(r["rollout/accuracy"] == 0.5 and r["web/cache/hits"] == 0.0 for r in trained)
    assert summary["steps"] == summary["policy_version"] == 3 and summary["heldout_acc_final"] == 0.5
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_2", "step_3"] and trainer.steps == 3  # every 2 steps, and the last one


def test_a_second_run_resumes_from_the_last_checkpoint(tmp_path) -> None:
    _run(tmp_path, 3, Events())
    events = Events()
    summary, trainer = _run(tmp_path, 5, events)
    assert [e for e in events if e[0] == "train"] == [("train", 3), ("train", 4)]  # not from 0
    assert ("eval", 0) not in events and summary["steps"] == 5 and trainer.steps == 5
    state = json.loads((tmp_path / "checkpoints" / "step_5" / "state.json").read_text())
    assert state["controller"]["staleness"]["version"] == 5
