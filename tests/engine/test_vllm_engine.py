"""VLLMEngine against a scripted vLLM look-alike on loopback: resends, version tags, the in-transit race,
retries, routing, missing dev endpoints, tied models and the worker extension, and the restart path (the
look-alike as a supervised subprocess).

The look-alike speaks the subset of vLLM 0.32's HTTP API the engine uses. Its next token is a function of
the whole context (so a resend must carry the tokens so far) and its log-probs encode which weights made
the token (-1 - weights_id / 10), so a wrong version tag is visible.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.remote.http import HttpConfig
from asearch.engine.remote.vllm import VLLMEngine, VLLMEngineConfig, with_model_arg
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.engine.types import GenerateRequest, SamplingParams
from asearch.errors import RemoteError
from asearch.net import free_port

pytestmark = pytest.mark.server  # a stand-in vLLM server subprocess

FAST_HTTP = HttpConfig(timeout_s=20, connect_timeout_s=2, retries=3, backoff_s=0.01, max_backoff_s=0.05)


def next_token(context: list[int]) -> int:
    return (sum(context) * 31 + 7) % 200 + 10


def weights_lp(weights_id: int) -> float:
    return -1.0 - weights_id / 10


class FakeVLLM:
    """State and FastAPI app of the look-alike."""

    def __init__(
        self,
        weights_id: int = 0,
        *,
        token_delay: float = 0.01,
        dev_mode: bool = True,
        fail_first: int = 0,
        fail_status: int = 503,
        arrival_delays: tuple[float, ...] = (),
        worker_extension: bool = False,
    ):
        self.weights_id = weights_id
        self.paused = False
        self.running: dict[str, dict] = {}
        self.payloads: list[dict] = []
        self.calls: list[str] = []
        self.fail_left = fail_first
        self.arrival_delays = list(arrival_delays)
        self.app = app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            if self.fail_left > 0:
                self.fail_left -= 1
                return JSONResponse({"error": "busy"}, status_code=fail_status)
            if body.get("max_tokens", 0) <= 0 or not body.get("prompt"):
                return JSONResponse({"error": {"message": "bad request"}}, status_code=400)
            if self.arrival_delays:  # the request is still "on the wire" for this long
                await asyncio.sleep(self.arrival_delays.pop(0))
            self.payloads.append(body)
            state = {"aborted": False}
            self.running[body["request_id"]] = state
            ids: list[int] = []
            finish = "length"
            try:
                while self.paused and not state["aborted"]:  # queued until /resume
                    await asyncio.sleep(0.002)
                for _ in range(body["max_tokens"]):
                    await asyncio.sleep(token_delay)
                    while self.paused and not state["aborted"]:  # mode=keep freezes in place
                        await asyncio.sleep(0.002)
                    if state["aborted"]:
                        finish = "abort"
                        break
                    ids.append(next_token(body["prompt"] + ids))
                    if ids[-1] in body.get("stop_token_ids", []):
                        finish = "stop"
                        break
                if state["aborted"] and finish != "abort":
                    finish = "abort"
            finally:
                del self.running[body["request_id"]]
            lp = weights_lp(self.weights_id)
            return JSONResponse(
                {
                    "choices": [
                        {
                            "text": "".join(chr(97 + t % 26) for t in ids),
                            "token_ids": ids,
                            "finish_reason": finish,
                            "logprobs": {
                                "token_logprobs": [lp] * len(ids),
                                "tokens": [f"token_id:{t}" for t in ids],
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)},
                }
            )

        @app.get("/health")
        async def health() -> dict:
            return {}

        if dev_mode:

            @app.post("/pause")
            async def pause(mode: str = "abort", clear_cache: bool = True) -> dict:
                # vLLM's clear_cache preempts the running requests even under mode=keep
                self.calls.append(f"pause:{mode}" + ("" if clear_cache else ":cache kept"))
                self.paused = True
                if mode == "abort":
                    for s in self.running.values():
                        s["aborted"] = True
                return {"status": "paused"}

            @app.post("/resume")
            async def resume() -> dict:
                self.calls.append("resume")
                self.paused = False
                return {"status": "resumed"}

            @app.post("/abort_requests")
            async def abort_requests() -> dict:
                self.calls.append("abort_requests")
                for s in self.running.values():
                    s["aborted"] = True
                return {"status": "aborted", "aborted": len(self.running)}

            @app.post("/collective_rpc")
            async def collective_rpc(request: Request) -> JSONResponse:
                method = (await request.json())["method"]
                reloads = {"reload_weights"} | ({"asearch_reload_weights"} if worker_extension else set())
                if worker_extension and method == "asearch_extension_version":
                    self.calls.append("probe")
                    return JSONResponse({"results": ["1"]})
                if method not in reloads:  # what vLLM 0.32 answers for a method no worker has
                    self.calls.append(f"no method:{method}")
                    message = f"Call to collective_rpc method failed: Method {method!r} is not implemented."
                    return JSONResponse({"error": {"message": message, "code": 500}}, status_code=500)
                assert self.paused and not self.running, "weights must change only when nothing runs"
                path = Path((await request.json())["kwargs"]["weights_path"])
                self.calls.append(f"{'reload' if method == 'reload_weights' else method}:{path.name}")
                self.weights_id = int((path / "fake_id.txt").read_text())
                return JSONResponse({"results": [None]})

            @app.post("/reset_prefix_cache")
            async def reset_prefix_cache() -> dict:
                self.calls.append("reset_prefix_cache")
                return {}

            @app.post("/update_weight_version")
            async def update_weight_version(request: Request) -> dict:
                self.calls.append(f"version:{(await request.json())['new_version']}")
                return {"success": True}


@pytest.fixture
def serve():
    from contextlib import ExitStack

    from asearch.retrieval.server import serve_in_thread

    with ExitStack() as stack:
        yield lambda fake: stack.enter_context(serve_in_thread(fake.app))


def weights_dir(root: Path, name: str, weights_id: int, *, tie: bool = False) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": tie}))
    (d / "model.safetensors").write_bytes(b"\0" * 8)
    (d / "fake_id.txt").write_text(str(weights_id))
    return d


def req(n: int, prompt: tuple[int, ...] = (1, 2, 3), traj: str = "", **sampling) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(prompt), sampling=SamplingParams(max_new_tokens=n, **sampling), trajectory_id=traj
    )


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


def engine(urls, **cfg) -> VLLMEngine:
    return VLLMEngine(urls, "m", cfg=VLLMEngineConfig(http=FAST_HTTP, **cfg))


# ---------------------------------------------------------------------- tests


def test_update_mid_request_resends_prefix_and_tags_versions(serve, tmp_path: Path) -> None:
    fake = FakeVLLM(weights_id=0, token_delay=0.01)
    url = serve(fake)
    new = weights_dir(tmp_path, "step1", weights_id=3)

    async def go():
        eng = engine(url)
        task = asyncio.create_task(eng.generate(req(40, traj="t1")))
        await asyncio.sleep(0.12)
        await eng.update_weights(new, version=1)
        resp = await task
        await eng.close()
        return resp, eng

    resp, eng = asyncio.run(go())
    assert resp.stop_reason == "length" and resp.output_ids == expected_tokens([1, 2, 3], 40)
    n0 = resp.output_versions.count(0)
    assert 0 < n0 < 40 and resp.output_versions == [0] * n0 + [1] * (40 - n0)
    # each token's tag names the weights that made it (log-prob encodes the weights id)
    assert resp.output_logprobs == [weights_lp(0)] * n0 + [weights_lp(3)] * (40 - n0)
    first, second = fake.payloads
    assert second["prompt"] == [1, 2, 3] + resp.output_ids[:n0]  # prompt + tokens so far
    assert second["max_tokens"] == 40 - n0 and first["max_tokens"] == 40
    calls = [c for c in fake.calls if c != "abort_requests"]  # the drain loop may abort stragglers
    assert calls == ["pause:abort", "reload:step1", "reset_prefix_cache", "version:1", "resume"]
    assert eng.version == 1 and eng.stats.resends == 1 and eng.stats.chunks == 2
    assert resp.usage == {"prompt_tokens": 3 + 3 + n0, "completion_tokens": 40}


def test_chunk_reaching_a_paused_server_is_aborted_not_mistagged(serve, tmp_path: Path) -> None:
    """AReaL's race: a request sent under version 0 that reaches the server only after /pause is queued
    there and would run under the new weights. The engine must abort it before changing weights."""
    fake = FakeVLLM(weights_id=0, token_delay=0.002, arrival_delays=(0.4,))
    url = serve(fake)
    new = weights_dir(tmp_path, "step1", weights_id=5)

    async def go():
        eng = engine(url)
        task = asyncio.create_task(eng.generate(req(10)))
        await asyncio.sleep(0.05)  # the request is now "on the wire" (arrives at 0.4 s)
        await eng.update_weights(new, version=1)
        return await task, eng

    resp, eng = asyncio.run(go())
    assert resp.output_ids == expected_tokens([1, 2, 3], 10)
    assert resp.output_versions == [1] * 10 and resp.output_logprobs == [weights_lp(5)] * 10
    assert "abort_requests" in fake.calls and eng.stats.resends == 1


def test_pause_keeps_in_flight_and_blocks_new_chunks(serve) -> None:
    fake = FakeVLLM(token_delay=0.01)
    url = serve(fake)

    async def go():
        eng = engine(url)
        running = asyncio.create_task(eng.generate(req(30)))
        await asyncio.sleep(0.05)
        await eng.pause()
        waiting = asyncio.create_task(eng.generate(req(5, prompt=(9,))))
        await asyncio.sleep(0.4)
        held = (not running.done(), not waiting.done(), len(fake.payloads))
        await eng.resume()
        return held, await running, await waiting, eng

    held, running, waiting, eng = asyncio.run(go())
    assert held == (True, True, 1)  # the new request never left the client while paused
    assert running.output_ids == expected_tokens([1, 2, 3], 30) and eng.stats.resends == 0
    assert waiting.output_ids == expected_tokens([9], 5)
    assert fake.calls == ["pause:keep:cache kept", "resume"]


def test_stop_token_and_payload_fields(serve) -> None:
    fake = FakeVLLM(token_delay=0)
    url = serve(fake)
    full = expected_tokens([1, 2, 3], 12)

    async def go():
        eng = engine(url)
        return await eng.generate(
            req(12, traj="traj-7", stop_token_ids=[full[5]], temperature=0.5, top_k=4, seed=3, stop=["zz"])
        )

    resp = asyncio.run(go())
    first = full.index(full[5])
    assert resp.stop_reason == "stop" and resp.output_ids == full[: first + 1]
    body = fake.payloads[0]
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 12
    assert body["user"] == body["session_id"] == "traj-7"
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["ignore_eos"] is True and body["include_stop_str_in_output"] is True
    assert (body["temperature"], body["top_k"], body["seed"], body["stop"]) == (0.5, 4, 3, ["zz"])


def test_retries_5xx_then_succeeds_but_not_4xx(serve) -> None:
    flaky = FakeVLLM(token_delay=0, fail_first=2)
    url = serve(flaky)
    bad = FakeVLLM(token_delay=0, fail_first=1, fail_status=422)
    bad_url = serve(bad)

    async def go():
        eng = engine(url)
        ok = await eng.generate(req(4))
        stats = eng._servers[0].stats
        eng2 = engine(bad_url)
        with pytest.raises(RemoteError, match=r"HTTP 422(.|\n)*not retried"):
            await eng2.generate(req(4))
        return ok, stats

    ok, stats = asyncio.run(go())
    assert ok.output_ids == expected_tokens([1, 2, 3], 4)
    assert (stats.requests, stats.retries, stats.failures) == (3, 2, 0)
    assert bad.fail_left == 0 and bad.payloads == []  # exactly one attempt


def test_unreachable_server_error_says_what_to_check() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def go():
        eng = VLLMEngine(url, "m", cfg=VLLMEngineConfig(http=FAST_HTTP.model_copy(update={"retries": 1})))
        await eng.generate(req(3))

    with pytest.raises(
        RemoteError, match=r"failed after 2 attempts .*ConnectError(.|\n)*Check that the server"
    ):
        asyncio.run(go())


def test_trajectory_id_is_a_sticky_routing_key(serve) -> None:
    fakes = [FakeVLLM(token_delay=0), FakeVLLM(token_delay=0)]
    urls = [serve(f) for f in fakes]

    async def go():
        eng = engine(urls)
        for _turn in range(3):
            await asyncio.gather(*(eng.generate(req(2, traj=f"traj-{i}")) for i in range(12)))

    asyncio.run(go())
    where = {}
    for k, f in enumerate(fakes):
        for body in f.payloads:
            where.setdefault(body["user"], set()).add(k)
    assert len(where) == 12 and all(len(s) == 1 for s in where.values())  # every turn on the same server
    assert all(f.payloads for f in fakes)  # and the trajectories are spread over both


def test_server_without_dev_endpoints(serve, tmp_path: Path) -> None:
    fake = FakeVLLM(token_delay=0, dev_mode=False)
    url = serve(fake)

    async def go():
        eng = engine(url)
        await eng.pause()  # falls back to pausing on the client
        waiting = asyncio.create_task(eng.generate(req(3)))
        await asyncio.sleep(0.2)
        assert not waiting.done() and not fake.payloads
        await eng.resume()
        assert (await waiting).output_ids == expected_tokens([1, 2, 3], 3)
        with pytest.raises(RemoteError, match="VLLM_SERVER_DEV_MODE=1"):
            await eng.update_weights(weights_dir(tmp_path, "w", 1), version=1)
        assert eng.version == 0
        assert (await eng.generate(req(2))).output_versions == [0, 0]  # still usable

    asyncio.run(go())


def test_bad_weight_sources_are_rejected_before_touching_the_server(serve, tmp_path: Path) -> None:
    fake = FakeVLLM()
    url = serve(fake)
    (tmp_path / "empty").mkdir()

    async def go():
        eng = engine(url)
        with pytest.raises(TypeError, match="save_pretrained"):
            await eng.update_weights({"w": 1}, version=1)
        with pytest.raises(ValueError, match="does not exist"):
            await eng.update_weights(tmp_path / "missing", version=1)
        with pytest.raises(ValueError, match="no config.json"):
            await eng.update_weights(tmp_path / "empty", version=1)
        with pytest.raises(ValueError, match="needs GenerateRequest.input_ids"):
            await eng.generate(GenerateRequest(messages=[{"role": "user", "content": "hi"}]))

    asyncio.run(go())
    assert fake.calls == [] and fake.payloads == []


def test_close_ends_waiting_requests_with_abort(serve) -> None:
    fake = FakeVLLM(token_delay=0)
    url = serve(fake)

    async def go():
        eng = engine(url)
        await eng.pause()
        waiting = asyncio.create_task(eng.generate(req(3)))
        await asyncio.sleep(0.05)
        await eng.close()
        return await asyncio.wait_for(waiting, 5)

    resp = asyncio.run(go())
    assert resp.stop_reason == "abort" and resp.output_ids == []


def test_tied_model_reloads_through_the_worker_extension(serve, tmp_path: Path) -> None:
    """A tied model reloads in place only on servers that run asearch's worker extension (vLLM's own
    reload_weights leaves the LM head on the old weights); one without it is refused before any pause."""
    plain, extended = FakeVLLM(token_delay=0), FakeVLLM(token_delay=0, worker_extension=True)
    plain_url, ext_url = serve(plain), serve(extended)
    tied1, tied2 = weights_dir(tmp_path, "tied1", 1, tie=True), weights_dir(tmp_path, "tied2", 2, tie=True)

    async def go():
        eng = engine(plain_url)
        with pytest.raises(RemoteError, match="ties its input and output embeddings.*--worker-extension-cls"):
            await eng.update_weights(tied1, version=1)
        assert eng.version == 0 and (await eng.generate(req(2))).output_versions == [0, 0]
        eng = engine(ext_url)
        await eng.update_weights(tied1, version=1)
        await eng.update_weights(tied2, version=2)
        return await eng.generate(req(3))

    after = asyncio.run(go())
    assert plain.calls == ["no method:asearch_extension_version"]  # refused before pausing anything
    assert [c for c in extended.calls if c != "abort_requests"] == [
        "probe",  # asked once per server
        *["pause:abort", "asearch_reload_weights:tied1", "reset_prefix_cache", "version:1", "resume"],
        *["pause:abort", "asearch_reload_weights:tied2", "reset_prefix_cache", "version:2", "resume"],
    ]
    assert after.output_versions == [2] * 3 and after.output_logprobs == [weights_lp(2)] * 3


def test_restart_mechanism_relaunches_supervised_server(tmp_path: Path) -> None:
    """weight_update='restart' relaunches the server on the new directory (any model, tied ones too)."""
    d0 = weights_dir(tmp_path, "w0", 0, tie=True)
    d1 = weights_dir(tmp_path, "w1", 7, tie=True)
    port = free_port()
    sup = ServerSupervisor(
        [sys.executable, __file__, "--model", str(d0), "--port", str(port)],
        f"http://127.0.0.1:{port}/health",
        log_path=tmp_path / "fake.log",
        cfg=SupervisorConfig(health_timeout_s=60, health_poll_s=0.05),
    )
    with sup:

        async def go():
            eng = VLLMEngine(
                f"http://127.0.0.1:{port}",
                "m",
                cfg=VLLMEngineConfig(http=FAST_HTTP, weight_update="restart"),
                supervisors=[sup],
            )
            before = await eng.generate(req(3))
            pid = sup.pid
            t = time.monotonic()
            await eng.update_weights(d1, version=4)
            took = time.monotonic() - t
            after = await eng.generate(req(3))
            return before, after, pid, took

        before, after, pid, took = asyncio.run(go())
        assert before.output_logprobs == [weights_lp(0)] * 3 and before.output_versions == [0] * 3
        assert after.output_logprobs == [weights_lp(7)] * 3 and after.output_versions == [4] * 3
        assert sup.pid != pid and sup.restarts == 0 and str(d1) in sup.command
    assert with_model_arg(["x", "--model", "a", "--port", "1"], "b") == ["x", "--model", "b", "--port", "1"]


if __name__ == "__main__":  # the look-alike as a subprocess: python test_vllm_engine.py --model DIR --port P
    import uvicorn

    args = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=True))
    weights = int((Path(args["--model"]) / "fake_id.txt").read_text())
    uvicorn.run(
        FakeVLLM(weights, token_delay=0).app, host="127.0.0.1", port=int(args["--port"]), log_level="warning"
    )
