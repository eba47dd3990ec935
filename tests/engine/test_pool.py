"""EnginePool over fake engines: sticky trajectories, least-loaded placement, failover and rejoining."""

from __future__ import annotations

import asyncio

import pytest

from asearch.engine.remote.http import RemoteHTTPError
from asearch.engine.remote.pool import EnginePool
from asearch.engine.types import GenerateRequest, GenerateResponse
from asearch.errors import RemoteError


class FakeServer:
    """An engine for one server: answers with its name's tokens; `dead` makes every call fail."""

    def __init__(self, name: str):
        self.name, self.dead, self.version = name, False, 0
        self.gate: asyncio.Event | None = None  # set: requests wait on it
        self.loaded: list[int] = []
        self.trajectories: list[str] = []

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        if self.gate is not None:
            await self.gate.wait()
        if self.dead:
            raise RemoteError(f"{self.name}: connection refused")
        self.trajectories.append(request.trajectory_id)
        return GenerateResponse([1], [0.0], [self.version], "stop", text=self.name)

    async def update_weights(self, source, version: int) -> None:
        if self.dead:
            raise RemoteError(f"{self.name}: connection refused")
        self.version = version
        self.loaded.append(version)

    async def health(self) -> list[bool]:
        return [not self.dead]

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...


def req(traj: str) -> GenerateRequest:
    return GenerateRequest(input_ids=[1, 2], trajectory_id=traj)


def test_new_trajectories_spread_by_load_and_later_turns_stick() -> None:
    async def main() -> None:
        a, b = FakeServer("a"), FakeServer("b")
        pool = EnginePool([a, b])
        a.gate = b.gate = asyncio.Event()
        first = [asyncio.create_task(pool.generate(req(f"t{i}"))) for i in range(4)]
        await asyncio.sleep(0)
        assert [m.inflight for m in pool.members] == [2, 2]  # least-loaded: two each while in flight
        a.gate.set()
        where = {f"t{i}": r.text for i, r in enumerate(await asyncio.gather(*first))}
        for _ in range(3):  # later turns go where the trajectory started, whatever the load
            for t, server in where.items():
                assert (await pool.generate(req(t))).text == server
        assert sorted(where.values()) == ["a", "a", "b", "b"]
        await pool.close()

    asyncio.run(main())


def test_a_dead_server_fails_over_then_rejoins_with_the_latest_weights() -> None:
    async def main() -> None:
        a, b = FakeServer("a"), FakeServer("b")
        pool = EnginePool([a, b])
        assert (await pool.generate(req("t0"))).text == "a"
        a.dead = True
        resp = await pool.generate(req("t0"))  # t0's server died: the turn is sent to b
        assert resp.text == "b" and pool.failovers == 1 and not pool.members[0].up
        await pool.update_weights("w1", 1)  # only b is up
        assert (a.loaded, b.loaded) == ([], [1])
        assert (await pool.generate(req("t0"))).output_versions == [1]
        a.dead = False
        for _ in range(50):  # rejoins after its next health check (1 s), loading version 1 first
            await asyncio.sleep(0.1)
            if pool.members[0].up:
                break
        assert pool.members[0].up and a.loaded == [1]
        resp = await pool.generate(req("fresh"))  # a has fewer requests answered: new work goes there
        assert resp.text == "a" and resp.output_versions == [1]
        stats = pool.stats()
        assert [s["failures"] for s in stats] == [1, 0] and [s["version"] for s in stats] == [1, 1]
        await pool.close()

    asyncio.run(main())


def test_a_bad_request_is_not_failed_over() -> None:
    class Refuses(FakeServer):
        async def generate(self, request):
            raise RemoteHTTPError("HTTP 400: bad sampling_params", 400)

    async def main() -> None:
        pool = EnginePool([Refuses("a"), Refuses("b")])
        with pytest.raises(RemoteHTTPError):
            await pool.generate(req("t"))
        assert pool.failovers == 0 and all(m.up for m in pool.members)
        await pool.close()

    asyncio.run(main())


def test_a_server_its_supervisor_relaunched_gets_the_latest_weights_before_new_work() -> None:
    class Supervisor:  # what the pool reads of a ServerSupervisor
        starts, restarts, failed = 1, 0, None

    async def main() -> None:
        a, b, sup = FakeServer("a"), FakeServer("b"), Supervisor()
        pool = EnginePool([a, b], supervisors=[sup, None])
        await pool.update_weights("w3", 3)
        assert (await pool.generate(req("t0"))).text == "a"
        sup.starts = sup.restarts = 2  # relaunched between two requests: it holds its launch weights again
        a.version = 0
        resp = await pool.generate(req("t0"))  # no request failed, yet t0 moves on to b
        assert resp.text == "b" and resp.output_versions == [3] and pool.failovers == 0
        for _ in range(50):
            await asyncio.sleep(0.1)
            if pool.members[0].up:
                break
        assert pool.members[0].up and a.loaded == [3, 3] and a.version == 3
        await pool.close()

    asyncio.run(main())
