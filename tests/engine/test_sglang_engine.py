"""SGLangEngine against the product SGLang-protocol server (`asearch.engine.server.app`), served in a thread.

SGLang cannot run here; `asearch.engine.server.app` speaks the subset of its native API the client uses,
with SGLang's field names and shapes: `/generate` (input_ids, sampling_params, return_logprob ->
meta_info.output_token_logprobs as (logprob, token_id, None), finish_reason {type: stop|length|abort},
weight_version), `/pause_generation` (abort: running requests return what they have and new ones wait;
in_place: running requests freeze), `/continue_generation`, `/update_weights_from_disk`, `/flush_cache`,
`/health`. Log-probs are real: the tests check them against a transformers forward pass.

The engine behind the server here decodes only when the test lets it (`SteppedEngine`), so "an update
lands after exactly 5 tokens" is an event the test waits for, not a timing it hopes for. The server
subclass records the control calls it receives (the protocol's shape) and can hold one request on the
wire until a pause arrives (a chunk sent before a pause that reaches the server after it).
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig  # noqa: E402
from asearch.engine.remote.http import HttpConfig  # noqa: E402
from asearch.engine.remote.sglang import SGLangEngine, SGLangEngineConfig  # noqa: E402
from asearch.engine.server.app import EngineServer, create_app  # noqa: E402
from asearch.engine.types import GenerateRequest, SamplingParams  # noqa: E402
from asearch.errors import RemoteError  # noqa: E402

PROMPT = [11, 42, 97, 150, 23, 64]
FAST_HTTP = HttpConfig(timeout_s=30, connect_timeout_s=2, retries=2, backoff_s=0.01, max_backoff_s=0.05)


class SteppedEngine(InProcessEngine):
    """Decodes freely while `free` is set; otherwise one step per `allow()`ed permit."""

    def __init__(self, *args, **kwargs):
        self.permits = threading.Semaphore(0)
        self.free = threading.Event()
        self.free.set()
        super().__init__(*args, **kwargs)

    def allow(self, steps: int) -> None:
        for _ in range(steps):
            self.permits.release()

    def _step(self) -> None:
        if self.free.is_set() or self.permits.acquire(timeout=0.002):  # no permit: handle commands, retry
            super()._step()


class RecordingServer(EngineServer):
    """Logs the control calls; `hold_next` keeps the next /generate "on the wire" until a pause arrived."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[str] = []
        self.hold_next = False
        self.held = threading.Event()  # set when the held request has arrived
        self._release = asyncio.Event()

    async def generate(self, body):
        if self.hold_next:
            self.hold_next = False
            self.held.set()
            await self._release.wait()
        return await super().generate(body)

    async def pause(self, mode: str) -> None:
        self.log.append(f"pause:{mode}")
        await super().pause(mode)
        self._release.set()

    async def resume(self) -> None:
        self.log.append("continue")
        await super().resume()

    async def update_weights(self, body):
        self.log.append(f"update:{Path(body['model_path']).name}")
        return await super().update_weights(body)

    async def flush_cache(self) -> None:
        self.log.append("flush_cache")
        await super().flush_cache()


class LikeSGLang(RecordingServer):
    """Answers as a real SGLang server does: one weight_version label per response, no per-token list."""

    def token_labels(self, resp):
        return None


@contextmanager
def serving(models, name: str = "v0", *, like_sglang: bool = False):
    from asearch.models.loading import load_model, load_tokenizer
    from asearch.retrieval.server import serve_in_thread

    path = models[name][1]
    engine = SteppedEngine(
        load_model(path), load_tokenizer(path), cfg=InProcessEngineConfig(max_seq_len=256, threads=1)
    )
    server = (LikeSGLang if like_sglang else RecordingServer)(engine, model_path=str(path))
    with serve_in_thread(create_app(server)) as url:  # the app's shutdown closes the engine
        yield server, url


def req(n: int, *, seed: int = 0, **sampling) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=n, seed=seed, **sampling)
    )


def engine(url: str, **cfg) -> SGLangEngine:
    return SGLangEngine(url, cfg=SGLangEngineConfig(http=FAST_HTTP, **cfg))


async def until(cond, what: str, timeout_s: float = 60.0) -> None:
    """Wait for an observable condition (the deadline only turns a hang into a failure)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


def tokens_generated(server: EngineServer) -> int:
    return int(server.engine.stats()["tokens_generated"])


async def started(server: EngineServer, eng: SGLangEngine, request: GenerateRequest, tokens: int) -> asyncio.Task:
    """`request` in flight, stopped after exactly `tokens` tokens until `server.engine.free` is set again."""
    server.engine.free.clear()
    task = asyncio.create_task(eng.generate(request))
    server.engine.allow(tokens)
    await until(lambda: tokens_generated(server) == tokens, f"{tokens} tokens")
    return task


async def update_after_5_tokens(server: EngineServer, eng: SGLangEngine, models, request: GenerateRequest):
    """`request` samples exactly 5 tokens under v0, then `eng` pushes v1 and the request runs to its end."""
    task = await started(server, eng, request, 5)
    await eng.update_weights(models["v1"][1], version=1)
    server.engine.free.set()
    return await task


# ---------------------------------------------------------------------- tests


def test_generate_returns_real_logprobs_and_honours_stops(sglang_models, ref_logprobs, close) -> None:
    model, _, tok = sglang_models["v0"]
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url)
            a, b = await asyncio.gather(
                eng.generate(req(12, seed=1)), eng.generate(req(12, seed=2, temperature=0.7, top_k=8))
            )
            g = a.output_ids
            by_id = await eng.generate(req(12, seed=1, stop_token_ids=[g[4]]))
            k = next(i for i in range(2, len(g)) if tok.decode(g[i : i + 1]).strip().isalpha())
            stop_str = tok.decode(g[k : k + 1]).strip()
            by_str = await eng.generate(req(12, seed=1, stop=[stop_str]))
            await eng.close()
            return a, b, by_id, k, stop_str, by_str

        a, b, by_id, k, stop_str, by_str = asyncio.run(go())
    for r in (a, b):
        assert r.stop_reason == "length" and len(r.output_ids) == len(r.output_logprobs) == 12
        assert r.output_versions == [0] * 12 and r.usage == {"prompt_tokens": 6, "completion_tokens": 12}
    assert close(a.output_logprobs, ref_logprobs(model, PROMPT, a.output_ids))
    assert close(b.output_logprobs, ref_logprobs(model, PROMPT, b.output_ids, 0.7, top_k=8))
    first = a.output_ids.index(a.output_ids[4])
    assert by_id.stop_reason == "stop" and by_id.output_ids == a.output_ids[: first + 1]
    assert by_str.stop_reason == "stop" and stop_str in by_str.text
    assert by_str.output_ids == a.output_ids[: len(by_str.output_ids)] and len(by_str.output_ids) <= k + 1


def test_update_mid_request_aborts_resends_and_switches_logprobs(sglang_models, ref_logprobs, close) -> None:
    m0, m1 = sglang_models["v0"][0], sglang_models["v1"][0]
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url, update_kv="recompute")
            interrupted = await update_after_5_tokens(server, eng, sglang_models, req(60, seed=3))
            after = await eng.generate(req(8, seed=4))
            await eng.close()
            return interrupted, after, eng

        interrupted, after, eng = asyncio.run(go())
    out, vers = interrupted.output_ids, interrupted.output_versions
    assert interrupted.stop_reason == "length" and len(out) == 60
    assert vers == [0] * 5 + [1] * 55
    assert close(interrupted.output_logprobs[:5], ref_logprobs(m0, PROMPT, out[:5]))
    assert close(interrupted.output_logprobs[5:], ref_logprobs(m1, PROMPT, out)[5:])  # prefix re-prefilled
    assert after.output_versions == [1] * 8 and close(
        after.output_logprobs, ref_logprobs(m1, PROMPT, after.output_ids)
    )
    assert not close(after.output_logprobs, ref_logprobs(m0, PROMPT, after.output_ids), atol=0.1)
    assert server.log == ["pause:abort", "update:v1", "continue"] and server.weight_version == "1"
    assert eng.version == 1 and eng.stats.resends == 1


def test_keep_kv_update_goes_on_in_place_without_a_resend_or_a_second_prefill(sglang_models, ref_logprobs, close) -> None:
    """update_kv keep: pause in place, an update that keeps the cache, continue. The request is never aborted,
    its prompt is prefilled once, the server lists each token's version, and the next turn reuses the prefix."""
    m0 = sglang_models["v0"][0]
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url, update_kv="keep")
            interrupted = await update_after_5_tokens(server, eng, sglang_models, req(60, seed=3))
            stats = server.engine.stats()
            turn2 = [*PROMPT, *interrupted.output_ids, *PROMPT]  # the next turn of the same conversation
            after = await eng.generate(GenerateRequest(input_ids=turn2, sampling=SamplingParams(max_new_tokens=8)))
            await eng.close()
            return interrupted, stats, after, eng

        interrupted, stats, after, eng = asyncio.run(go())
    out, vers = interrupted.output_ids, interrupted.output_versions
    assert interrupted.stop_reason == "length" and len(out) == 60
    assert vers == [0] * 5 + [1] * 55 and eng.stats.resends == 0
    assert close(interrupted.output_logprobs[:5], ref_logprobs(m0, PROMPT, out[:5]))
    assert stats["prefill_tokens"] == len(PROMPT) and stats["recomputed_tokens"] == 0
    assert server.log == ["pause:in_place", "update:v1", "continue"] and server.weight_version == "1"
    assert after.output_versions == [1] * 8
    assert server.engine.stats()["prefix_reused_tokens"] == len(PROMPT) + 59  # the update kept the prefix cache


def test_keep_kv_against_a_server_that_labels_whole_responses_tags_the_send_time_version(sglang_models) -> None:
    """A real SGLang server names one version per response (the newest); the tokens before the in-place update
    were sampled by the old weights, so the client tags the whole response with its send-time version."""
    with serving(sglang_models, like_sglang=True) as (server, url):

        async def go():
            eng = engine(url, update_kv="keep")
            first = await update_after_5_tokens(server, eng, sglang_models, req(20, seed=3))
            second = await eng.generate(req(4, seed=4))
            await eng.close()
            return first, second, eng

        first, second, eng = asyncio.run(go())
    assert first.output_versions == [0] * 20 and eng.stats.unsplit_spans == 1 and eng.stats.resends == 0
    assert second.output_versions == [1] * 4  # sent after the update: the server's label


def test_an_update_under_an_in_place_pause_recomputes_unless_told_to_keep(sglang_models, ref_logprobs, close) -> None:
    """Paused in place, an update that flushes the cache (SGLang's default) neither aborts the frozen request
    nor waits for it: the request goes on under the new weights with its KV recomputed, so every later log-prob
    is the new model's over the whole sequence."""
    m0, m1 = sglang_models["v0"][0], sglang_models["v1"][0]
    with serving(sglang_models) as (server, url):

        async def go():
            import httpx

            eng = engine(url)
            task = await started(server, eng, req(30, seed=8), 4)
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                await c.post("/pause_generation", json={"mode": "in_place"})
                body = {"model_path": str(sglang_models["v1"][1]), "weight_version": "1", "abort_all_requests": False}
                answer = (await c.post("/update_weights_from_disk", json=body)).json()
                await c.post("/continue_generation", json={})
            server.engine.free.set()
            return answer, await task, eng

        answer, resp, eng = asyncio.run(go())
    out = resp.output_ids
    assert answer["success"] and resp.stop_reason == "length" and len(out) == 30 and eng.stats.resends == 0
    assert resp.output_versions == [0] * 4 + [1] * 26  # the server listed each token's label
    assert close(resp.output_logprobs[:4], ref_logprobs(m0, PROMPT, out[:4]))
    assert close(resp.output_logprobs[4:], ref_logprobs(m1, PROMPT, out)[4:])
    assert server.counts["aborted_by_update"] == 0 and server.engine.stats()["recomputed_tokens"] > 0


def test_an_update_waiting_for_running_requests_goes_ahead_once_they_are_frozen(sglang_models) -> None:
    """Unpaused, an update waits for running requests to finish; a pause in place that arrives meanwhile means
    they cannot finish, so the update must go ahead under them instead of waiting forever."""
    with serving(sglang_models) as (server, url):

        async def go():
            import httpx

            eng = engine(url)
            task = await started(server, eng, req(20, seed=9), 2)  # it cannot finish until the test lets it
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                body = {"model_path": str(sglang_models["v1"][1]), "weight_version": "1", "flush_cache": False}
                update = asyncio.create_task(c.post("/update_weights_from_disk", json=body))
                await asyncio.sleep(0.05)  # room to go wrong; passing never depends on it
                waited = not update.done()
                await c.post("/pause_generation", json={"mode": "in_place"})
                answer = (await asyncio.wait_for(update, 60)).json()
                await c.post("/continue_generation", json={})
            server.engine.free.set()
            return waited, answer, await task

        waited, answer, resp = asyncio.run(go())
    assert waited and answer["success"] and len(resp.output_ids) == 20
    assert resp.output_versions == [0] * 2 + [1] * 18


def test_request_arriving_during_the_pause_is_tagged_with_the_weights_that_ran_it(
    sglang_models, ref_logprobs, close
) -> None:
    """Sent under version 0, it reaches the server after the pause, waits there, and runs under version 1:
    the server's weight_version label, not the send-time version, names its tokens."""
    m1 = sglang_models["v1"][0]
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url)
            server.hold_next = True
            task = asyncio.create_task(eng.generate(req(6, seed=5)))
            await asyncio.to_thread(server.held.wait, 60)
            await eng.update_weights(sglang_models["v1"][1], version=1)
            return await task, eng

        resp, eng = asyncio.run(go())
    assert resp.output_versions == [1] * 6 and eng.stats.resends == 0
    assert close(resp.output_logprobs, ref_logprobs(m1, PROMPT, resp.output_ids))


def test_pause_freezes_in_place_and_resume_continues(sglang_models, ref_logprobs, close) -> None:
    model = sglang_models["v0"][0]
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url)
            task = await started(server, eng, req(40, seed=6), 3)
            await eng.pause()
            server.engine.free.set()  # a paused engine must not step even when allowed to
            waiting = asyncio.create_task(eng.generate(req(3, seed=7)))
            await asyncio.sleep(0.05)  # room to go wrong; passing never depends on it
            stats = server.engine.stats()
            held = (not task.done(), not waiting.done(), stats["active"], stats["tokens_generated"])
            await eng.resume()
            await eng.flush_cache()
            return held, await task, await waiting, eng

        held, resp, waiting, eng = asyncio.run(go())
    assert held == (True, True, 1, 3)  # frozen on the server; the new request never left the client
    assert resp.stop_reason == "length" and len(resp.output_ids) == 40 and eng.stats.resends == 0
    assert close(resp.output_logprobs, ref_logprobs(model, PROMPT, resp.output_ids))
    assert len(waiting.output_ids) == 3
    assert server.log == ["pause:in_place", "continue", "flush_cache"]


def test_failed_update_keeps_version_and_resumes(sglang_models, tmp_path: Path) -> None:
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with serving(sglang_models) as (server, url):

        async def go():
            eng = engine(url)
            with pytest.raises(
                RemoteError, match="update_weights_from_disk(.|\n)*HTTP 400(.|\n)*Failed to update"
            ):
                await eng.update_weights(bad, version=9)
            return eng.version, await eng.generate(req(4, seed=8))

        version, after = asyncio.run(go())
    assert version == 0 and after.output_versions == [0] * 4 and after.stop_reason == "length"
    assert server.log == ["pause:in_place", "update:broken", "continue"]
    assert server.weight_version == "default" and server.engine.version == 0
