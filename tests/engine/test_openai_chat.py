"""OpenAIChatClient and OpenAIChatEngine against a loopback server that scripts its answers
(429 with Retry-After, 5xx, slow answers, auth failures, usage fields), plus the retry helpers."""

from __future__ import annotations

import asyncio
import email.utils
import time
from contextlib import contextmanager

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.remote.http import HttpConfig, backoff_delay, parse_retry_after
from asearch.engine.remote.openai_chat import OpenAIChatClient, OpenAIChatEngine
from asearch.engine.types import GenerateRequest, SamplingParams
from asearch.errors import RemoteError


class ScriptedChat:
    """Answers /v1/chat/completions from a script: each call pops the next step; an empty script answers ok.

    Steps: ("ok", text, prompt_tokens, completion_tokens, finish) | ("status", code, retry_after or None)
    | ("sleep", seconds) then ok | ("no_usage",) | ("bad",) (no choices).
    """

    def __init__(self, script: list[tuple] | None = None, delay_s: float = 0.0):
        self.script = list(script or [])
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.bodies.append(body)
            self.auth.append(request.headers.get("authorization"))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                step = self.script.pop(0) if self.script else ("ok",)
                if delay_s:
                    await asyncio.sleep(delay_s)
                if step[0] == "status":
                    headers = {"Retry-After": step[2]} if step[2] is not None else {}
                    return JSONResponse(
                        {"error": {"message": f"scripted {step[1]}"}}, step[1], headers=headers
                    )
                if step[0] == "sleep":
                    await asyncio.sleep(step[1])
                if step[0] == "bad":
                    return JSONResponse({"choices": []})
                if step[0] == "no_usage":
                    return JSONResponse({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]})
                if step[0] == "ok" and len(step) == 5:
                    _, text, p, c, finish = step
                else:  # echo the last message; 5 prompt tokens per message
                    last = body["messages"][-1]["content"]
                    text, p, c, finish = f"echo: {last}", len(body["messages"]) * 5, 3, "stop"
                return JSONResponse(
                    {
                        "id": "chatcmpl-1",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": finish,
                            }
                        ],
                        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
                    }
                )
            finally:
                self.in_flight -= 1


@contextmanager
def serving(fake: ScriptedChat):
    from asearch.retrieval.server import serve_in_thread

    with serve_in_thread(fake.app) as url:
        yield f"{url}/v1"


def client(url: str, **kw) -> OpenAIChatClient:
    kw = {"timeout": 5.0, "retries": 3, "backoff_s": 0.01, "max_backoff_s": 0.05, **kw}
    return OpenAIChatClient(url, "judge-model", **kw)


USER = [{"role": "user", "content": "is the answer Paris?"}]


def test_429_honours_retry_after_then_succeeds() -> None:
    fake = ScriptedChat([("status", 429, "1")])
    with serving(fake) as url:

        async def go():
            c = client(url)
            t = time.monotonic()
            r = await c.chat(USER, temperature=0.0, max_tokens=16)
            return r, time.monotonic() - t, c.usage

        r, took, usage = asyncio.run(go())
    assert r.text == "echo: is the answer Paris?" and r.finish_reason == "stop"
    assert took >= 0.95  # waited for Retry-After: 1, not the 10 ms backoff
    assert (usage.requests, usage.retries, usage.failures) == (1, 1, 0)
    assert fake.bodies[0] == {"model": "judge-model", "messages": USER, "temperature": 0.0, "max_tokens": 16}


def test_500_then_success_and_usage_totals() -> None:
    fake = ScriptedChat([("status", 500, None), ("ok", "yes", 11, 2, "stop"), ("ok", "no", 13, 4, "length")])
    with serving(fake) as url:

        async def go():
            c = client(url)
            a = await c.chat(USER)
            b = await c.chat(USER)
            return a, b, c.usage

        a, b, usage = asyncio.run(go())
    assert (a.text, a.usage) == ("yes", {"prompt_tokens": 11, "completion_tokens": 2})
    assert (b.text, b.finish_reason) == ("no", "length")
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (24, 6, 30)
    assert (usage.requests, usage.retries, usage.failures) == (2, 1, 0)
    assert len(fake.bodies) == 3


def test_timeout_is_retried() -> None:
    fake = ScriptedChat([("sleep", 1.5)])
    with serving(fake) as url:

        async def go():
            c = client(url, timeout=0.4)
            t = time.monotonic()
            r = await c.chat(USER)
            return r, time.monotonic() - t, c.usage

        r, took, usage = asyncio.run(go())
    assert r.text.startswith("echo") and usage.retries == 1
    assert took < 1.4  # did not wait for the slow answer


def test_persistent_failure_raises_and_counts() -> None:
    fake = ScriptedChat([("status", 503, None)] * 10)
    with serving(fake) as url:

        async def go():
            c = client(url, retries=2)
            with pytest.raises(RemoteError, match=r"failed after 3 attempts \(last: HTTP 503"):
                await c.chat(USER)
            return c.usage

        usage = asyncio.run(go())
    assert (usage.requests, usage.retries, usage.failures) == (0, 2, 1) and len(fake.bodies) == 3


def test_bounded_concurrency_and_concurrent_usage() -> None:
    fake = ScriptedChat(delay_s=0.1)
    with serving(fake) as url:

        async def go():
            c = client(url, max_concurrency=3)
            rs = await asyncio.gather(
                *(c.chat([{"role": "user", "content": f"q{i}"}] * (i % 2 + 1)) for i in range(10))
            )
            return rs, c.usage

        rs, usage = asyncio.run(go())
    assert fake.max_in_flight == 3
    assert [r.text for r in rs] == [f"echo: q{i}" for i in range(10)]
    assert usage.requests == 10 and usage.prompt_tokens == sum(5 * (i % 2 + 1) for i in range(10))
    assert usage.completion_tokens == 30


def test_key_comes_from_env_and_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-0123456789"
    monkeypatch.setenv("JUDGE_KEY", secret)
    fake = ScriptedChat([("ok",), ("status", 401, None)])
    with serving(fake) as url:

        async def go():
            c = client(url, api_key_env="JUDGE_KEY")
            await c.chat(USER)
            with pytest.raises(RemoteError) as err:
                await c.chat(USER)
            return c, err.value

        c, err = asyncio.run(go())
    assert fake.auth[0] == f"Bearer {secret}"
    assert "JUDGE_KEY" in str(err) and "HTTP 401" in str(err) and secret not in str(err)
    assert secret not in repr(c) and len(fake.bodies) == 2  # a 401 is not retried
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(RemoteError, match="JUDGE_KEY"):
        client("http://127.0.0.1:9/v1", api_key_env="JUDGE_KEY", require_api_key=True)


def test_missing_usage_counts_zero_and_bad_body_is_an_error() -> None:
    fake = ScriptedChat([("no_usage",), ("bad",)])
    with serving(fake) as url:

        async def go():
            c = client(url)
            r = await c.chat(USER)
            with pytest.raises(RemoteError, match="unexpected chat completion body"):
                await c.chat(USER)
            return r, c.usage

        r, usage = asyncio.run(go())
    assert r.text == "x" and r.usage == {"prompt_tokens": 0, "completion_tokens": 0}
    assert (usage.requests, usage.failures, usage.total_tokens) == (1, 1, 0)


def test_chat_engine_adapter() -> None:
    fake = ScriptedChat([("ok", "Paris", 9, 1, "stop"), ("ok", "Par", 9, 1, "length")])
    with serving(fake) as url:

        async def go():
            eng = OpenAIChatEngine(client(url))
            r1 = await eng.generate(
                GenerateRequest(
                    messages=USER, sampling=SamplingParams(max_new_tokens=8, temperature=0.3, seed=1)
                )
            )
            await eng.pause()
            held = asyncio.create_task(
                eng.generate(
                    GenerateRequest(messages=USER, sampling=SamplingParams(top_k=5, stop_token_ids=[2]))
                )
            )
            await asyncio.sleep(0.2)
            was_held = not held.done() and len(fake.bodies) == 1
            await eng.resume()
            r2 = await held
            with pytest.raises(ValueError, match="needs GenerateRequest.messages"):
                await eng.generate(GenerateRequest(input_ids=[1, 2]))
            with pytest.raises(RemoteError, match="fixed weights"):
                await eng.update_weights("/tmp/x", 1)
            await eng.close()
            return r1, r2, was_held

        r1, r2, was_held = asyncio.run(go())
    assert (r1.text, r1.stop_reason, r1.output_ids, r1.output_versions) == ("Paris", "stop", [], [])
    assert r1.usage == {"prompt_tokens": 9, "completion_tokens": 1} and r1.input_len == 9
    assert (r2.text, r2.stop_reason) == ("Par", "length") and was_held
    first, second = fake.bodies
    assert first == {
        "model": "judge-model",
        "messages": USER,
        "temperature": 0.3,
        "top_p": 1.0,
        "max_tokens": 8,
        "seed": 1,
    }  # no top_k / stop_token_ids unless set: hosted APIs reject unknown fields
    assert second["top_k"] == 5 and second["stop_token_ids"] == [2]


def test_retry_after_parsing_and_backoff_bounds() -> None:
    assert (
        parse_retry_after("3") == 3.0 and parse_retry_after("-2") == 0.0 and parse_retry_after(None) is None
    )
    assert parse_retry_after("soon") is None
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= parse_retry_after(future) <= 31
    cfg = HttpConfig(backoff_s=0.5, max_backoff_s=4.0, max_retry_after_s=10.0)
    delays = [backoff_delay(a, cfg) for a in range(8) for _ in range(50)]
    assert all(0.25 <= d <= 4.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100  # jittered, not lock-step
    assert max(backoff_delay(6, cfg) for _ in range(50)) > 3.0  # grows to the cap
    assert 10.0 <= backoff_delay(0, cfg, retry_after=60.0) < 10.1  # a server's wait, capped
