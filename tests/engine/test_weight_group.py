"""Collective weight sync against real `asearch engine serve` processes: the trainer (rank 0 of a gloo group
of its own) broadcasts the policy to two servers that joined through `/init_weights_update_group`, the
update's metadata going bucket by bucket over `/update_weights_from_distributed`; afterwards each server
samples from exactly the trainer's weights. A server that restarts gets the next version from disk and the
group forms again with it."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from asearch.engine.remote.http import HttpConfig  # noqa: E402
from asearch.engine.remote.pool import EnginePool  # noqa: E402
from asearch.engine.remote.sglang import SGLangEngine, SGLangEngineConfig  # noqa: E402
from asearch.engine.server.app import launch_engine_server  # noqa: E402
from asearch.engine.types import GenerateRequest, SamplingParams  # noqa: E402
from asearch.engine.weight_group import plan_buckets, reach_address  # noqa: E402

PROMPT = [11, 42, 97, 150, 23, 64]
HTTP = HttpConfig(timeout_s=120, connect_timeout_s=5, retries=1, backoff_s=0.01, max_backoff_s=0.05)
ATOL = 2e-4  # the disk path's tolerance (test_engine_server): float32 forwards on both sides


def test_buckets_hold_at_most_their_size_and_keep_the_order() -> None:
    shapes = [("a", [10, 10]), ("b", [100]), ("c", [300]), ("d", [5])]  # bf16: 200, 200, 600, 10 bytes
    buckets = plan_buckets(shapes, bucket_bytes=450)
    assert [b.names for b in buckets] == [["a", "b"], ["c"], ["d"]]  # c alone is over the size: its own bucket
    assert [b.nbytes for b in buckets] == [400, 600, 10]
    assert buckets[0].body("g") == {
        "names": ["a", "b"], "dtypes": ["bfloat16", "bfloat16"], "shapes": [[10, 10], [100]], "group_name": "g"
    }  # fmt: skip
    assert plan_buckets(shapes, bucket_bytes=450, dtype=torch.float32)[0].names == ["a"]
    assert reach_address(["http://127.0.0.1:1", "http://localhost:2"]) == "127.0.0.1"


def bf16_exact(model) -> None:
    """Round the weights to bfloat16 values in place: bfloat16 on the wire then loses nothing, so a server's
    log-probs can be compared with the trainer's at the disk path's tolerance."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def greedy(n: int) -> GenerateRequest:
    return GenerateRequest(input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=n, temperature=0.0))


@pytest.fixture(scope="module")
def servers(sglang_models, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("weight-group")
    launched = []
    try:
        for i in range(2):
            launched.append(
                launch_engine_server(
                    sglang_models["v0"][1], log_path=logs / f"server{i}.log", threads=1, max_seq_len=512, weight_version="0"
                )
            )  # fmt: skip
        yield launched
    finally:
        for sup, _ in launched:
            sup.stop()


def samples_from(rollouts, version: int):
    from asearch.rl.trainer import Sample

    return [
        Sample(
            token_ids=PROMPT + r.output_ids,
            loss_mask=[0] * len(PROMPT) + [1] * len(r.output_ids),
            behav_logprobs=[0.0] * len(PROMPT) + r.output_logprobs,
            versions=[version] * len(PROMPT) + r.output_versions,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, r in enumerate(rollouts)
    ]


def test_trainer_broadcasts_to_two_servers_and_a_restarted_one_rejoins(servers, sglang_models, ref_logprobs, tmp_path) -> None:
    from asearch.rl.trainer import OptimConfig, PolicyTrainer, TrainerConfig
    from asearch.rl.weights import CollectiveWeights, DiskWeights

    old, _, tok = sglang_models["v0"]
    policy = copy.deepcopy(sglang_models["v1"][0])  # other weights than the servers hold
    bf16_exact(policy)
    trainer = PolicyTrainer(policy, TrainerConfig(optim=OptimConfig(lr=1e-2)), temperature=1.0)
    sups, urls = [s for s, _ in servers], [u for _, u in servers]
    n_bytes = 2 * sum(p.numel() for p in policy.parameters())

    def check(resps, version: int) -> None:
        for r in resps:
            assert r.output_versions == [version] * len(r.output_ids)
            ref = ref_logprobs(policy, PROMPT, r.output_ids)
            assert max(abs(a - b) for a, b in zip(r.output_logprobs, ref, strict=True)) <= ATOL

    async def each_server(pool: EnginePool, n: int):
        return [await m.engine.generate(greedy(n)) for m in pool.members]

    async def go():
        engines = [SGLangEngine(u, cfg=SGLangEngineConfig(http=HTTP, update_kv="recompute")) for u in urls]
        pool = EnginePool(engines, names=urls, supervisors=sups)
        disk = DiskWeights(pool, trainer, tok, tmp_path / "weights", keep=2)
        weights = CollectiveWeights(pool, trainer, disk, urls, bucket_mb=0.02)  # several buckets
        try:
            await weights.push(1)
            assert weights.metrics()["weights/collective"] == 1.0
            assert weights.metrics()["weights/sync_bytes"] == n_bytes
            check(await each_server(pool, 16), 1)

            # a real train step on the servers' samples, then the next version over the same group
            rollouts = await asyncio.gather(*(pool.generate(greedy(12)) for _ in range(4)))
            stats = await asyncio.to_thread(trainer.train_step, samples_from(rollouts, 1), policy_version=1)
            assert stats["perf/grad_norm"] > 0
            bf16_exact(policy)
            await weights.push(2)
            assert weights.metrics()["weights/collective"] == 1.0
            check(await each_server(pool, 16), 2)
            assert not any((tmp_path / "weights").glob("v*"))  # nothing went to disk

            # server 1 crashes and comes back with its launch weights: it waits out of the pool for a
            # version on disk; the next push goes by disk (bfloat16), the one after over a new group
            os.kill(sups[1].pid, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while sups[1].starts < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await pool.generate(greedy(2))  # routing notices the restart
            assert not pool.members[1].up
            await weights.push(3)
            assert weights.metrics()["weights/collective"] == 0.0
            assert (tmp_path / "weights" / "v3").is_dir()
            while not pool.members[1].up and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            check(await each_server(pool, 16), 3)  # from disk: the bf16-exact weights, saved in bf16
            await weights.push(4)
            assert weights.metrics()["weights/collective"] == 1.0
            check(await each_server(pool, 16), 4)
        finally:
            await weights.close()
            await pool.close()
            trainer.leave_weight_group()

    asyncio.run(go())


def test_a_server_killed_during_a_broadcast_ends_that_version_at_once(servers, sglang_models, ref_logprobs, tmp_path) -> None:
    """Server 0 (rank 1) dies as the trainer starts broadcasting: the trainer's send fails, every server is told to
    leave the group, and the version goes by disk within seconds, not after `weights_timeout_s` (600 here) that a
    member receiving through the dead one would otherwise wait."""
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig
    from asearch.rl.weights import CollectiveWeights, DiskWeights

    policy = copy.deepcopy(sglang_models["v1"][0])
    bf16_exact(policy)
    trainer = PolicyTrainer(policy, TrainerConfig(), temperature=1.0)
    sups, urls = [s for s, _ in servers], [u for _, u in servers]
    for sup in sups:  # the previous test restarted one: wait until both answer
        sup.ensure_healthy(120)
    broadcast = trainer.broadcast_weights_or_leave

    def kill_then_broadcast(dtype: str) -> int:
        os.kill(sups[0].pid, signal.SIGKILL)
        return broadcast(dtype)

    async def go() -> float:
        engines = [SGLangEngine(u, cfg=SGLangEngineConfig(http=HTTP, update_kv="recompute")) for u in urls]
        pool = EnginePool(engines, names=urls, supervisors=sups)
        disk = DiskWeights(pool, trainer, sglang_models["v0"][2], tmp_path / "weights", keep=2)
        weights = CollectiveWeights(pool, trainer, disk, urls, bucket_mb=0.02, timeout_s=600)
        try:
            await weights.push(1)
            assert weights.metrics()["weights/collective"] == 1.0
            trainer.broadcast_weights_or_leave = kill_then_broadcast  # type: ignore[method-assign]
            t0 = time.monotonic()
            await weights.push(2)
            seconds = time.monotonic() - t0
            assert weights.metrics()["weights/collective"] == 0.0  # went by disk
            assert (tmp_path / "weights" / "v2").is_dir()
            resp = await pool.members[1].engine.generate(greedy(8))  # the survivor serves version 2
            assert resp.output_versions == [2] * len(resp.output_ids)
            ref = ref_logprobs(policy, PROMPT, resp.output_ids)
            assert max(abs(a - b) for a, b in zip(resp.output_logprobs, ref, strict=True)) <= ATOL
            return seconds
        finally:
            await weights.close()
            await pool.close()
            trainer.leave_weight_group()

    assert asyncio.run(go()) < 60  # 0.5 s measured; without the abort the survivor waits the full timeout


def two_member_group(name: str):
    """(root, member, store port) of a gloo weight group of 2, both ends in this process."""
    from concurrent.futures import ThreadPoolExecutor

    from asearch.engine.weight_group import host_store, open_group

    store = host_store("127.0.0.1", timeout_s=30)
    port = int(store.port)
    with ThreadPoolExecutor(2) as pool:
        root = pool.submit(open_group, "127.0.0.1", port, 0, 2, group_name=name, timeout_s=30, store=store)
        member = pool.submit(open_group, "127.0.0.1", port, 1, 2, group_name=name, timeout_s=30)
        return root.result(), member.result(), port


def test_an_abort_through_the_store_ends_a_wait_that_no_peer_would_end() -> None:
    """A member waits for a broadcast its root never sends (the root is alive, just elsewhere): the group's
    abort key, set from a third process's view of rank 0's store, ends that wait at once; so does the
    no-progress deadline when nobody aborts."""
    from concurrent.futures import ThreadPoolExecutor

    from asearch.engine.weight_group import WeightGroupError, signal_abort

    root, member, port = two_member_group("g")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(member.wait, [member.start_broadcast(torch.empty(1000))])
        time.sleep(0.3)
        assert not waiting.done()
        t0 = time.monotonic()
        signal_abort("127.0.0.1", port, "g")
        with pytest.raises(WeightGroupError, match="aborted"):
            waiting.result(timeout=10)
        assert time.monotonic() - t0 < 2
    member.close()  # its receive is still pending: abandoned, not waited for
    root.close()

    root, member, _ = two_member_group("h")
    member.op_timeout_s = 0.5
    with pytest.raises(WeightGroupError, match="no broadcast finished"):
        member.wait([member.start_broadcast(torch.empty(1000))])
    member.close()
    root.close()


def test_a_receive_holds_a_window_of_buffers_and_the_next_update_reuses_them() -> None:
    """Twelve tensors of one shape through a window of 4: the receiver's tensors arrive in 4 buffers, the next
    update arrives in those same buffers (the first update's tensors are still referenced here, so a new
    allocation could not land at their addresses), and each update's values are the sender's, in bfloat16."""
    from concurrent.futures import ThreadPoolExecutor

    from asearch.engine.weight_group import receive_tensors
    from asearch.rl.broadcast import BroadcastsWeights

    class Sender(BroadcastsWeights):
        def __init__(self, model):
            self.model = model

    root, member, _ = two_member_group("w")
    sender = Sender(torch.nn.Sequential(*(torch.nn.Linear(16, 16, bias=False) for _ in range(12))))
    sender._weight_group = root
    shapes = sender.weight_shapes()
    names = [n for n, _ in shapes]
    held: list[torch.Tensor] = []  # every buffer the receiver was handed, kept alive
    try:
        for update in range(2):
            with torch.no_grad():
                for p in sender.model.parameters():
                    p.normal_()
            got: dict[str, torch.Tensor] = {}

            def keep(name, tensor, got=got):
                got[name] = tensor.clone()
                held.append(tensor)

            with ThreadPoolExecutor(1) as pool:
                receiving = pool.submit(
                    receive_tensors, member, names, ["bfloat16"] * len(names), [s for _, s in shapes], "cpu", keep, window=4
                )
                assert sender.broadcast_weights("bfloat16") == 12 * 16 * 16 * 2
                assert receiving.result(timeout=30) == []
            want = {n: t.to(torch.bfloat16) for n, t in sender.model.state_dict().items()}
            assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
            ptrs = {t.data_ptr() for t in held[12 * update :]}
            if update == 0:
                first = ptrs
                assert len(first) <= 4  # a window's worth, not one buffer a tensor
            else:
                assert ptrs <= first  # the same buffers again
        assert root._spare  # the sender's cast buffers are reused too
    finally:
        member.close()
        root.close()
    assert not member._spare and not root._spare  # closing the group lets them go
