"""`asearch engine serve` as a real subprocess on loopback, driven by `SGLangEngine` and raw HTTP.

One server (started by `launch_engine_server`, i.e. `python -m asearch engine serve`, under a
`ServerSupervisor`) serves a tiny model for the whole module. Nothing here assumes how fast the machine
is: the tests wait for events the server reports (`/get_server_info`), and the mid-request update test
lengthens its request until the update lands inside it.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = pytest.mark.server  # one engine server subprocess for the module

torch = pytest.importorskip("torch")

from asearch.engine.remote.http import HttpConfig  # noqa: E402
from asearch.engine.remote.sglang import SGLangEngine, SGLangEngineConfig  # noqa: E402
from asearch.engine.server.app import PrefixIndex, launch_engine_server  # noqa: E402
from asearch.engine.types import GenerateRequest, SamplingParams  # noqa: E402

PROMPT = [11, 42, 97, 150, 23, 64]
HTTP = HttpConfig(timeout_s=120, connect_timeout_s=5, retries=2, backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture(scope="module")
def server(sglang_models, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("engine-server") / "server.log"
    sup, url = launch_engine_server(
        sglang_models["v0"][1], log_path=log, threads=1, max_seq_len=2048, weight_version="0"
    )
    try:
        yield sup, url
    finally:
        sup.stop()


def req(n: int, *, seed: int = 0, prompt: list[int] = PROMPT, **sampling) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(prompt), sampling=SamplingParams(max_new_tokens=n, seed=seed, **sampling)
    )


def engine(url: str, **cfg) -> SGLangEngine:
    return SGLangEngine(url, cfg=SGLangEngineConfig(http=HTTP, **cfg))


def info(url: str) -> dict:
    return httpx.get(f"{url}/get_server_info", timeout=30).json()


def test_binds_loopback_and_reports_the_model(server, sglang_models) -> None:
    import psutil

    sup, url = server
    listening = [c for c in psutil.Process(sup.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
    mi = httpx.get(f"{url}/get_model_info", timeout=30).json()
    assert mi["model_path"] == str(sglang_models["v0"][1]) and mi["is_generation"] is True
    assert mi["weight_version"] == "0"
    si = info(url)
    assert si["engine_config"]["threads"] == 1 and si["internal_states"][0]["version"] == 0


def test_logprobs_match_a_transformers_forward_and_stops_hold(
    server, sglang_models, ref_logprobs, close
) -> None:
    _, url = server
    model, _, tok = sglang_models["v0"]

    async def go():
        eng = engine(url)
        a, b = await asyncio.gather(
            eng.generate(req(16, seed=1)), eng.generate(req(16, seed=2, temperature=0.7, top_k=8))
        )
        g = a.output_ids
        by_id = await eng.generate(req(16, seed=1, stop_token_ids=[g[5]]))
        k = next(i for i in range(2, len(g)) if tok.decode(g[i : i + 1]).strip().isalpha())
        stop_str = tok.decode(g[k : k + 1]).strip()
        by_str = await eng.generate(req(16, seed=1, stop=[stop_str]))
        await eng.close()
        return a, b, by_id, stop_str, by_str

    a, b, by_id, stop_str, by_str = asyncio.run(go())
    assert a.stop_reason == b.stop_reason == "length" and len(a.output_ids) == len(b.output_ids) == 16
    assert a.output_versions == [0] * 16
    assert close(a.output_logprobs, ref_logprobs(model, PROMPT, a.output_ids))
    assert close(b.output_logprobs, ref_logprobs(model, PROMPT, b.output_ids, 0.7, top_k=8))
    first = a.output_ids.index(a.output_ids[5])
    assert by_id.stop_reason == "stop" and by_id.output_ids == a.output_ids[: first + 1]  # stop token kept
    assert by_str.stop_reason == "stop" and stop_str in by_str.text
    assert by_str.output_ids == a.output_ids[: len(by_str.output_ids)]


def test_raw_protocol_shapes_errors_and_batches(server) -> None:
    _, url = server
    sp = {"max_new_tokens": 5, "temperature": 1.0, "top_k": -1, "sampling_seed": 3, "ignore_eos": True}
    body = httpx.post(
        f"{url}/generate",
        json={"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True, "rid": "r1"},
        timeout=60,
    ).json()
    meta = body["meta_info"]
    assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == 6 and meta["completion_tokens"] == 5 and meta["weight_version"] == "0"
    assert [e[1] for e in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(e[2] is None and e[0] <= 0 for e in meta["output_token_logprobs"])
    again = httpx.post(
        f"{url}/generate", json={"input_ids": PROMPT, "sampling_params": sp}, timeout=60
    ).json()
    assert again["output_ids"] == body["output_ids"] and "output_token_logprobs" not in again["meta_info"]
    batch = httpx.post(
        f"{url}/generate", json={"input_ids": [PROMPT, PROMPT[:3]], "sampling_params": sp}, timeout=60
    ).json()
    assert isinstance(batch, list) and [b["meta_info"]["prompt_tokens"] for b in batch] == [6, 3]
    for bad, why in (
        ({"input_ids": [10**6], "sampling_params": sp}, "out of range"),
        ({"input_ids": PROMPT, "sampling_params": sp, "stream": True}, "stream"),
        ({"input_ids": PROMPT, "sampling_params": {**sp, "min_p": 0.1}}, "min_p"),
        ({"sampling_params": sp}, "input_ids"),
    ):
        r = httpx.post(f"{url}/generate", json=bad, timeout=60)
        assert r.status_code == 400 and why in r.json()["error"]["message"], (bad, r.text)


def test_next_turn_reuses_the_previous_turns_kv_without_a_trajectory_id(server) -> None:
    _, url = server

    async def go():
        eng = engine(url)
        first = await eng.generate(req(7, seed=11, prompt=[5, 6, 7, 8, 9, 10, 12]))
        turn2 = [5, 6, 7, 8, 9, 10, 12, *first.output_ids, 40, 41, 42]
        second = await eng.generate(req(4, seed=12, prompt=turn2))
        await eng.close()
        return first, second, turn2

    before = info(url)["internal_states"][0]["prefix_reused_tokens"]
    first, second, turn2 = asyncio.run(go())
    reused = info(url)["internal_states"][0]["prefix_reused_tokens"] - before
    assert reused == 7 + 7 - 1  # prompt + output of turn 1, less the last token (not yet in the cache)
    assert second.output_versions == [0] * 4 and len(turn2) == 17


def test_prefix_index_finds_the_longest_stored_prefix() -> None:
    idx = PrefixIndex(max_entries=3)
    idx.store("a", [1, 2, 3])
    idx.store("b", [1, 2, 3, 4, 5])
    idx.store("c", [9, 9])
    assert idx.lookup([1, 2, 3, 4, 5, 6]) == "b" and idx.lookup([1, 2, 3, 4]) == "a"
    assert idx.lookup([1, 2]) is None and idx.lookup([9, 9]) == "c"
    idx.store("a", [7])  # re-storing an id replaces its entry
    assert idx.lookup([1, 2, 3, 9]) is None and idx.lookup([7, 1]) == "a"
    idx.store("d", [8])  # over max_entries: the oldest ("b") goes
    assert idx.lookup([1, 2, 3, 4, 5]) is None and len(idx) == 3


def test_a_request_arriving_while_paused_waits_and_continue_releases_it(server) -> None:
    _, url = server
    sp = {"max_new_tokens": 3, "sampling_seed": 1, "ignore_eos": True}

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await c.post("/pause_generation", json={"mode": "in_place"})
            pending = asyncio.create_task(
                c.post("/generate", json={"input_ids": PROMPT, "sampling_params": sp})
            )
            # observable: the server counted the request, and it did not enter the engine
            while (await c.get("/get_server_info")).json()["requests"] == start_requests:
                await asyncio.sleep(0.005)
            held = (not pending.done(), (await c.get("/get_server_info")).json()["inflight"])
            await c.post("/continue_generation", json={})
            return held, (await pending).json()

    start_requests = info(url)["requests"]
    held, body = asyncio.run(go())
    assert held == (True, 0)
    assert body["meta_info"]["completion_tokens"] == 3 and info(url)["paused"] is None


def test_update_weights_from_disk_mid_request(server, sglang_models, ref_logprobs, close) -> None:
    """The update aborts the running request; the client resends prompt + tokens so far; the versions
    switch once and every log-prob matches the weights that produced it. The request grows until the
    update lands inside it, so this holds on a machine of any speed."""
    _, url = server

    def weights(version: int):  # the server starts on v0; updates alternate v1, v0, v1, ...
        return sglang_models["v1" if version % 2 else "v0"]

    async def attempt(n: int, version: int):
        eng = engine(url, update_kv="recompute")
        start = info(url)["internal_states"][0]["tokens_generated"]
        task = asyncio.create_task(eng.generate(req(n, seed=3)))
        while info(url)["internal_states"][0]["tokens_generated"] == start and not task.done():
            await asyncio.sleep(0.002)  # until the request has sampled a token under the old weights
        await eng.update_weights(weights(version)[1], version=version)
        resp = await task
        await eng.close()
        return resp, eng

    n, version = 64, 1
    while True:
        resp, eng = asyncio.run(attempt(n, version))
        vers = resp.output_versions
        if vers[0] == version - 1 and vers[-1] == version:
            break
        assert n < 1500, f"the update never landed inside a {n}-token request"
        n, version = min(4 * n, 1500), version + 1  # it finished first: a longer one
    out, k = resp.output_ids, vers.count(version - 1)
    assert resp.stop_reason == "length" and len(out) == n and 0 < k < n
    assert vers == [version - 1] * k + [version] * (n - k)
    assert eng.stats.resends == 1 and eng.version == version
    assert close(resp.output_logprobs[:k], ref_logprobs(weights(version - 1)[0], PROMPT, out[:k]))
    assert close(resp.output_logprobs[k:], ref_logprobs(weights(version)[0], PROMPT, out)[k:], atol=2e-4)
    si = info(url)
    assert si["weight_version"] == str(version) and si["aborted_by_pause"] >= 1
