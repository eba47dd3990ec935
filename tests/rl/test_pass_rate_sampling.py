"""Pass-rate-aware sampling: settled questions are mostly skipped, re-checked at the floor, and nothing is lost."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from asearch.agent.trajectory import Segment, Trajectory
from asearch.rl.controller import ControllerConfig, RolloutController
from asearch.rl.sampling import PassRateSampler, SamplingConfig, question_key


def _traj(reward: float, version: int = 0) -> Trajectory:
    seg = Segment()
    seg.extend_context([1, 2])
    seg.extend_generated([3], [0.0], [version])
    return Trajectory(id="t", question="q", style="x", segments=[seg], answer="a", finish="answer",
                      reward=reward, score=reward)  # fmt: skip


def test_a_settled_question_is_admitted_at_the_recheck_rate_and_skips_are_counted_by_cause() -> None:
    sampler = PassRateSampler(SamplingConfig(pass_rate=True, window=1, recheck=0.25), seed=3)
    solved, unsolved, open_ = {"id": "s"}, {"id": "u"}, {"id": "o"}
    assert sampler.admit(solved) and sampler.admit(unsolved)  # never seen: always admitted
    sampler.record(solved, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    sampler.record(unsolved, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    sampler.record(open_, [1.0, 0.0, 0.0], [1.0, 0.0, 0.0])
    draws = 4000
    admitted = sum(sampler.admit(solved) for _ in range(draws))
    assert 0.22 < admitted / draws < 0.28
    assert all(sampler.admit(open_) for _ in range(200))  # a group with variance: always worth generating
    sampler.admit(unsolved)
    assert sampler.skipped["solved"] == draws - admitted and sampler.skipped["unsolved"] <= 1


def test_the_window_needs_every_remembered_group_settled() -> None:
    sampler = PassRateSampler(SamplingConfig(pass_rate=True, window=2, recheck=0.01), seed=0)
    q = {"id": 7}
    sampler.record(q, [1.0, 1.0], [1.0, 1.0])
    assert all(sampler.admit(q) for _ in range(50))  # one settled group of two remembered: not yet
    sampler.record(q, [1.0, 1.0], [1.0, 1.0])
    assert sum(sampler.admit(q) for _ in range(200)) < 20
    sampler.record(q, [0.0, 1.0], [0.0, 1.0])  # the policy slipped: variance again, back in play
    assert all(sampler.admit(q) for _ in range(50))


def test_state_survives_a_json_round_trip_with_key_types_intact() -> None:
    cfg = SamplingConfig(pass_rate=True, window=2, recheck=0.1)
    sampler = PassRateSampler(cfg, seed=0)
    for q in ({"id": 1}, {"id": "1"}, "free text"):
        sampler.record(q, [1.0, 1.0], [1.0, 1.0])
        sampler.record(q, [1.0, 1.0], [1.0, 1.0])
    sampler.admit({"id": 1})
    restored = PassRateSampler(cfg, seed=0, state=json.loads(json.dumps(sampler.state_dict())))
    assert restored.history == sampler.history and restored.skipped == sampler.skipped
    assert {question_key({"id": 1}), question_key({"id": "1"})} <= set(restored.history)
    assert all(g.maxlen == 2 for g in restored.history.values())


def _run(pass_rate: bool, steps: int, seed: int, kill_at: int | None = None) -> dict:
    """Questions with fixed pass probabilities (a third always right, a third never, a third coin flips)."""
    cfg = ControllerConfig(batch_size=4, group_size=4, max_staleness=1, max_concurrent=6,
                           sampling=SamplingConfig(pass_rate=pass_rate, window=1, recheck=0.2))  # fmt: skip
    p_pass = {i: (1.0, 0.0, 0.5)[i % 3] for i in range(30)}
    rng = random.Random(seed)
    seen: list[int] = []
    admitted: list[int] = []
    holder: dict[str, RolloutController] = {}

    async def episode(sample, k):
        if k == 0:
            admitted.append(sample["id"])
        version = holder["ctl"].version
        await asyncio.sleep(rng.choice([0.0002, 0.001]))
        return _traj(float(rng.random() < p_pass[sample["id"]]), version)

    def stream(start: int):
        pos = start
        while True:
            yield pos, {"id": pos % 30}
            pos += 1

    async def main():
        def make(state=None):
            parts = RolloutController.restore_parts(state) if state else {}
            ctl = RolloutController(cfg, stream(parts.get("data_position", 0)), episode, seed=seed, **parts)
            holder["ctl"] = ctl
            ctl.start()
            return ctl

        ctl = make()
        for step in range(steps):
            if step == kill_at:
                state = json.loads(json.dumps(ctl.state_dict()))
                await ctl.close()
                ctl = make(state)
            batch = await ctl.get_batch()
            seen.extend(g.sample["id"] for g in batch)
            ctl.set_version(ctl.version + 1)
        kept, dropped = ctl.staleness.accepted, ctl.staleness.rejected
        skipped = sum(ctl.sampler.skipped.values()) if ctl.sampler else 0
        pending = len(ctl.ready) + len(ctl.inflight) + len(ctl.redo)
        pulled, rejected = ctl.data_position, sum(ctl.rejected.values())
        await ctl.close()  # it cancels the groups in flight, which then count as rejected too: counted before
        return {"per_kept": (kept + dropped) / kept, "skipped": skipped, "pending": pending,
                "rejected": rejected, "pulled": pulled}  # fmt: skip

    out = asyncio.run(main())
    out["trained"], out["admitted"] = seen, admitted
    return out


@pytest.mark.parametrize("seed", range(3))
def test_groups_generated_per_group_kept_falls_and_every_prompt_is_accounted_for(seed) -> None:
    plain, sampled = _run(False, steps=25, seed=seed), _run(True, steps=25, seed=seed)
    assert plain["skipped"] == 0
    # two thirds of the questions are settled: without the sampler about 2.5 groups per kept one
    assert sampled["per_kept"] < 0.7 * plain["per_kept"], (plain["per_kept"], sampled["per_kept"])
    for run in (plain, sampled):
        assert len(run["trained"]) + run["rejected"] + run["pending"] + run["skipped"] == run["pulled"]


def test_a_resumed_run_keeps_the_history_and_still_rechecks_settled_questions() -> None:
    out = _run(True, steps=40, seed=5, kill_at=20)
    assert out["skipped"] > 0
    assert len(out["trained"]) + out["rejected"] + out["pending"] + out["skipped"] == out["pulled"]
    settled_admissions = [i for i in out["admitted"] if i % 3 != 2]
    rechecks = len(settled_admissions) - len(set(settled_admissions))
    assert rechecks > 10  # the floor keeps re-checking settled questions, after the resume too
    assert rechecks < 0.5 * len(out["admitted"])


def test_group_size_one_never_skips() -> None:
    cfg = ControllerConfig(group_size=1, sampling=SamplingConfig(pass_rate=True))
    ctl = RolloutController(cfg, iter([]), lambda s, k: None)  # type: ignore[arg-type,return-value]
    assert ctl.sampler is None


def test_unseen_questions_follow_their_class_variance_share_once_every_class_has_history() -> None:
    """prior_key: a fresh question of a class whose groups rarely have variance is admitted at
    max(recheck, v_c / v_best); before every class has prior_min groups, and for records without the field,
    everything is admitted. The class memory survives a JSON round trip."""
    cfg = SamplingConfig(pass_rate=True, recheck=0.1, prior_key="metadata.hops", prior_window=20, prior_min=10)
    sampler = PassRateSampler(cfg, seed=1)
    q = lambda i, hops: {"id": f"q{i}", "metadata": {"hops": hops}}  # noqa: E731
    for i in range(10):  # 1-hop: 2 of 10 groups with variance; 2-hop: 8 of 10
        sampler.record(q(i, 1), [1.0, 0.0] if i < 2 else [1.0, 1.0], [1.0, 1.0])
        if i < 9:
            sampler.record(q(100 + i, 2), [1.0, 0.0] if i < 8 else [0.0, 0.0], [0.5, 0.5])
    assert all(sampler.admit(q(1000 + i, 1)) for i in range(50))  # class 2 has 9 < prior_min groups: no prior
    sampler.record(q(109, 2), [0.0, 1.0], [0.5, 0.5])
    assert sampler.class_variance() == {"1": 0.2, "2": 0.9}
    draws = 4000
    ones = sum(sampler.admit(q(2000 + i, 1)) for i in range(draws))
    twos = sum(sampler.admit(q(9000 + i, 2)) for i in range(draws))
    assert 0.19 < ones / draws < 0.26 and twos == draws  # 0.2 / 0.9 = 0.22; the best class always
    assert sampler.skipped["prior"] == draws - ones
    assert all(sampler.admit({"id": f"n{i}"}) for i in range(50))  # no hops field: no prior
    restored = PassRateSampler(cfg, seed=1, state=json.loads(json.dumps(sampler.state_dict())))
    assert restored.class_variance() == sampler.class_variance() and restored.classes["1"].maxlen == 20


def _probe_run(probe: int, seed: int, steps: int = 12) -> dict:
    """A stream of fresh questions (never repeated), a third always right, a third never, a third coin flips. No
    group can go stale in `steps` versions: how many a box's timer jitter would cancel is not the probe's doing."""
    cfg = ControllerConfig(batch_size=4, group_size=8, max_staleness=steps, max_concurrent=6,
                           sampling=SamplingConfig(probe=probe))  # fmt: skip
    calls: dict[int, list[int]] = {}
    holder: dict[str, RolloutController] = {}

    async def episode(sample, k):
        calls.setdefault(sample["id"], []).append(k)
        draw = random.Random(f"{seed}/{sample['id']}/{k}")  # each sample's own: not the order episodes finish in
        await asyncio.sleep(draw.choice([0.0002, 0.001]))
        p = (1.0, 0.0, 0.5)[sample["id"] % 3]
        return _traj(float(draw.random() < p), holder["ctl"].version)

    async def main():
        ctl = RolloutController(cfg, ((i, {"id": i}) for i in range(10_000)), episode, seed=seed)
        holder["ctl"] = ctl
        ctl.start()
        trained = []
        for _ in range(steps):
            trained += await ctl.get_batch()
            ctl.set_version(ctl.version + 1)
        state = json.loads(json.dumps(ctl.state_dict()))
        await ctl.close()
        return ctl, trained, state

    ctl, trained, state = asyncio.run(main())
    return {"ctl": ctl, "trained": trained, "calls": calls, "state": state}


@pytest.mark.parametrize("seed", range(3))
def test_a_probe_drops_settled_groups_after_k_samples_and_saves_their_other_episodes(seed) -> None:
    plain, probed = _probe_run(0, seed), _probe_run(2, seed)
    ctl = probed["ctl"]
    assert ctl.rejected["probe_settled"] > 0 and "probe_settled" not in plain["ctl"].rejected
    for g in probed["trained"]:  # every trained group is whole, has variance, and drew each sample index once
        assert len(g.trajectories) == 8 and max(g.rewards) > min(g.rewards)
        assert sorted(probed["calls"][g.sample["id"]]) == list(range(8))
    settled = [ks for ks in probed["calls"].values() if len(ks) == 2]
    assert len(settled) >= ctl.rejected["probe_settled"] and all(sorted(ks) == [0, 1] for ks in settled)
    # the counters add up: every finished episode counted, kept ones are the trained and queued groups'
    started, in_flight = sum(len(ks) for ks in probed["calls"].values()), len(probed["state"]["redo"])
    assert started - 8 * in_flight <= ctl.episodes_generated <= started
    assert ctl.episodes_kept == 8 * (len(probed["trained"]) + len(ctl.ready))
    per_kept = lambda r: r["ctl"].episodes_generated / r["ctl"].episodes_kept  # noqa: E731
    # per kept group: 3 groups (24 episodes) without a probe; with one, 6 questions probed (half the coin flips'
    # probes disagree), 12 + 6 episodes: 3.0 against 2.25 episodes per kept episode
    assert per_kept(probed) < 0.85 * per_kept(plain), (per_kept(plain), per_kept(probed))
    assert probed["state"]["episodes"] == {"generated": ctl.episodes_generated, "kept": ctl.episodes_kept}
    parts = RolloutController.restore_parts(probed["state"])
    restored = RolloutController(ctl.cfg, iter([]), lambda s, k: None, **parts)  # type: ignore[arg-type,return-value]
    assert (restored.episodes_generated, restored.episodes_kept) == (ctl.episodes_generated, ctl.episodes_kept)


@pytest.mark.parametrize("fields", [{"probe": 1}, {"probe": 8}, {"probe": 2, "drop": False}])
def test_a_probe_that_cannot_save_anything_is_a_config_error(fields) -> None:
    with pytest.raises(ValueError, match=r"sampling.probe=\d"):
        ControllerConfig(group_size=8, drop_zero_variance=fields.get("drop", True),
                         sampling=SamplingConfig(probe=fields["probe"]))  # fmt: skip


def test_a_probe_keeps_each_samples_seed_and_every_finished_episode_is_counted() -> None:
    """The episode function is called for all n samples at the group's start, in admission order (the training
    loop draws seeds there), with or without a probe; episodes of errored and cancelled groups count as
    generated, and an episode that raises leaves none of its siblings running."""
    for probe in (0, 2):
        _check_seeds_and_counts(probe)


def _check_seeds_and_counts(probe: int) -> None:
    cfg = ControllerConfig(batch_size=2, group_size=4, max_staleness=0, sampling=SamplingConfig(probe=probe))
    numbers, drawn, running = iter(range(10**6)), {}, set()

    def call(sample, k):
        drawn.setdefault(sample["id"], []).append(next(numbers))
        return episode(sample, k)

    async def episode(sample, k):
        running.add((sample["id"], k))
        await asyncio.sleep(0.002 * (k + 1))
        running.discard((sample["id"], k))
        if sample["id"] % 5 == 4 and k == 0:
            raise RuntimeError("tool crashed")
        return _traj(float(k % 2 == 0 or sample["id"] % 3 == 0))

    async def main():
        ctl = RolloutController(cfg, ((i, {"id": i}) for i in range(40)), call)
        ctl.start()
        for _ in range(4):
            await ctl.get_batch()
            ctl.set_version(ctl.version + 1)
        # episodes running now belong to groups still generating, none to a finished (errored) group
        still, inflight = set(running), {g.sample["id"] for g, _ in ctl.inflight.values()}
        await ctl.close()
        return ctl, still, inflight

    ctl, still, inflight = asyncio.run(main())
    assert all(seeds == list(range(seeds[0], seeds[0] + 4)) and seeds[0] % 4 == 0 for seeds in drawn.values())
    assert ctl.rejected["error"] >= 1 and any("tool crashed" in e for e in ctl.errors)
    assert all(i in inflight for i, _ in still), (still, inflight)
    if probe:
        assert ctl.rejected["probe_settled"] >= 1  # ids divisible by 3: every sample right
    # 3 of an errored group's 4 episodes finish and count; the 4 trained groups' 16 too
    assert ctl.episodes_generated >= 4 * 4 + 3 * ctl.rejected["error"]


def test_unset_max_concurrent_is_what_the_staleness_rule_admits_and_a_resume_takes_the_configs() -> None:
    assert ControllerConfig(batch_size=4, max_staleness=2).concurrency == 12
    assert ControllerConfig(batch_size=4, max_staleness=2, max_concurrent=5).concurrency == 5
    old = ControllerConfig(batch_size=4, max_staleness=2, max_concurrent=16)
    ctl = RolloutController(old, iter([]), lambda s, k: None)  # type: ignore[arg-type,return-value]
    state = json.loads(json.dumps(ctl.state_dict()))
    del state["episodes"]  # a checkpoint written before the episode counters
    state["ready"] = [{"seq": 0, "index": 0, "sample": {"id": 0}, "admitted_version": 0, "rewards": [0.0, 1.0],
                       "trajectories": [_traj(0.0).to_dict(), _traj(1.0).to_dict()]}]  # fmt: skip
    resumed = RolloutController(ControllerConfig(batch_size=4, max_staleness=2), iter([]), lambda s, k: None,  # type: ignore[arg-type,return-value]
                                **RolloutController.restore_parts(state))  # fmt: skip
    assert resumed.staleness.max_concurrent == 12
    assert (resumed.episodes_generated, resumed.episodes_kept) == (2, 2)
