"""asearch.net's one retry policy against a real loopback HTTP server that answers from a script: 503 with
Retry-After then 200 waits and succeeds, a 400 fails at once, a dropped connection is retried; and each
client kind (engine, OpenAI chat + judge, web API, retrieval) goes through that same policy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from asearch.errors import RemoteError
from asearch.net import RETRYABLE_STATUS, JsonClient, RemoteHTTPError, RetryConfig, RetryPolicy

FAST = RetryConfig(retries=3, backoff_s=0.01, max_backoff_s=0.02)
OK = ("json", 200, {"ok": True})


class Script:
    """What the server answers, one step per request: ("status", code, retry_after), ("drop",) closes the
    connection without an answer, ("json", code, body) answers JSON. The last step repeats."""

    def __init__(self, *steps: tuple):
        self.steps = list(steps)
        self.paths: list[str] = []

    def next(self, path: str) -> tuple:
        self.paths.append(path)
        return self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]


@contextmanager
def scripted_server(script: Script) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a dropped connection is one the client had pooled

        def log_message(self, *args: object) -> None:
            pass

        def answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            step = script.next(self.path)
            if step[0] == "drop":
                self.close_connection = True
                return
            code, body = (step[1], {"detail": f"scripted {step[1]}"}) if step[0] == "status" else step[1:]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if step[0] == "status" and step[2] is not None:
                self.send_header("retry-after", step[2])
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def timed(coro):
    start = time.monotonic()
    out = asyncio.run(coro)
    return out, time.monotonic() - start


# --------------------------------------------------------------------------- the policy


def test_503_with_retry_after_waits_then_succeeds() -> None:
    script = Script(("status", 503, "0.4"), OK)
    with scripted_server(script) as url:
        client = JsonClient(url, retry=FAST)
        body, took = timed(client.request_json("GET", "/x"))
    assert body == {"ok": True} and len(script.paths) == 2
    assert took >= 0.4  # the server's Retry-After, not the 10 ms backoff
    assert (client.stats.requests, client.stats.retries, client.stats.failures) == (2, 1, 0)


def test_a_400_fails_at_once() -> None:
    script = Script(("status", 400, None), OK)
    with scripted_server(script) as url:
        client = JsonClient(url, retry=FAST)
        with pytest.raises(RemoteHTTPError, match="HTTP 400: scripted 400") as err:
            asyncio.run(client.request_json("POST", "/x", {"a": 1}))
    assert err.value.status_code == 400 and len(script.paths) == 1


def test_a_dropped_connection_is_retried() -> None:
    script = Script(OK, ("drop",), OK)
    with scripted_server(script) as url:
        client = JsonClient(url, retry=FAST)

        async def twice():
            return [await client.request_json("GET", "/a"), await client.request_json("GET", "/b")]

        assert asyncio.run(twice()) == [{"ok": True}] * 2
    assert script.paths == ["/a", "/b", "/b"] and client.stats.retries == 1


def test_retries_used_up_name_the_last_failure_and_its_status() -> None:
    script = Script(("status", 502, None))
    with scripted_server(script) as url:
        client = JsonClient(url, retry=RetryConfig(retries=2, backoff_s=0.0, max_backoff_s=0.0), hint="check it")
        with pytest.raises(RemoteHTTPError, match=r"failed after 3 attempts \(last: HTTP 502: scripted 502\)\ncheck it"):
            asyncio.run(client.request("GET", "/x"))
    assert len(script.paths) == 3 and client.stats.failures == 1


def test_one_status_set_and_delays() -> None:
    assert RETRYABLE_STATUS == {408, 425, 429, 500, 502, 503, 504}
    policy = RetryPolicy(RetryConfig(backoff_s=0.5, max_backoff_s=4.0, max_retry_after_s=10.0))
    delays = [policy.delay(k) for k in range(8) for _ in range(50)]
    assert all(0.25 <= d <= 4.0 for d in delays) and len({round(d, 6) for d in delays}) > 100  # jittered
    assert 10.0 <= policy.delay(0, retry_after=60.0) <= 10.05  # a server's wait, capped


def test_old_knob_names_load_with_a_warning() -> None:
    from asearch.engine.remote.http import HttpConfig
    from asearch.web import ResilienceConfig

    with pytest.warns(FutureWarning, match="'backoff_base_s' is deprecated, use 'backoff_s'"):
        http = HttpConfig(backoff_base_s=0.2, backoff_max_s=3.0, retry_after_max_s=9.0)
    assert (http.backoff_s, http.max_backoff_s, http.max_retry_after_s) == (0.2, 3.0, 9.0)
    with pytest.warns(FutureWarning, match="'attempts' is deprecated, use 'retries'"):
        web = ResilienceConfig(attempts=4)
    assert web.retries == 3 and web.attempts == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ResilienceConfig(retries=3).attempts == 4  # the new names warn about nothing


# --------------------------------------------------------------------------- every client kind, one policy


def test_engine_client() -> None:
    from asearch.engine.remote.http import HttpConfig, JsonHttpClient

    script = Script(("status", 503, "0.3"), ("drop",), ("json", 200, {"text": "hi"}))
    with scripted_server(script) as url:
        client = JsonHttpClient(url, cfg=HttpConfig(retries=3, backoff_s=0.01, max_backoff_s=0.02))
        body, took = timed(client.post_json("/generate", {"input_ids": [1]}))
    assert body == {"text": "hi"} and took >= 0.3 and client.stats.retries == 2
    assert isinstance(client.policy, RetryPolicy)


def test_openai_chat_client_and_judge_do_not_retry_on_top() -> None:
    from asearch.engine.remote.openai_chat import OpenAIChatClient
    from asearch.metrics.judge import LLMJudge

    reply = {"choices": [{"message": {"content": '{"judgement": "correct"}'}, "finish_reason": "stop"}]}
    script = Script(("status", 429, "0.3"), ("json", 200, reply))
    with scripted_server(script) as url:
        client = OpenAIChatClient(f"{url}/v1", "m", retries=2, backoff_s=0.01, max_backoff_s=0.02)
        judge = LLMJudge(client, max_retries=2, retry_delay_s=0.0)
        verdict, took = timed(judge.judge("q?", "Paris", ["Paris"]))
    assert verdict.correct is True and verdict.attempts == 1 and took >= 0.3
    assert script.paths == ["/v1/chat/completions"] * 2 and client.usage.retries == 1

    script = Script(("status", 503, None))  # the client's tries used up: the judge does not try again
    with scripted_server(script) as url:
        client = OpenAIChatClient(f"{url}/v1", "m", retries=1, backoff_s=0.0, max_backoff_s=0.0)
        verdict = asyncio.run(LLMJudge(client, max_retries=3, retry_delay_s=0.0).judge("q?", "a", ["b"]))
    assert verdict.correct is None and "HTTP 503" in verdict.error and len(script.paths) == 2


def test_web_api_client() -> None:
    from asearch.web.api import ApiClient
    from asearch.web.resilience import Resilience, ResilienceConfig

    script = Script(("status", 503, "0.3"), ("drop",), ("json", 200, {"organic": []}))
    with scripted_server(script) as url:
        api = ApiClient("svc", timeout_s=5.0, max_connections=4)
        service = Resilience("svc", ResilienceConfig(retries=3, backoff_s=0.01, max_backoff_s=0.02))
        answer, took = timed(service.run(lambda: api.request("POST", f"{url}/search", json_body={"q": "x"})))
    assert answer.json() == {"organic": []} and took >= 0.3
    assert isinstance(service.policy, RetryPolicy) and service.stats()["retries"] == 2
    script = Script(("status", 400, None))
    with scripted_server(script) as url:
        with pytest.raises(RemoteError, match="HTTP 400"):
            asyncio.run(service.run(lambda: api.request("GET", f"{url}/search")))
    assert len(script.paths) == 1


def test_retrieval_client() -> None:
    from asearch.retrieval.client import RetrievalClient

    doc = {"id": "7", "contents": '"Seven"\nthe seventh doc'}
    script = Script(("status", 503, "0.3"), ("drop",), ("json", 200, {"result": [[{"document": doc, "score": 1.5}]]}))
    with scripted_server(script) as url:
        client = RetrievalClient(url, retries=3, backoff_s=0.01, max_backoff_s=0.02)
        hits, took = timed(client.search(["q"], topk=1))
    assert hits[0][0].passage.id == "7" and took >= 0.3 and len(script.paths) == 3
    script = Script(("status", 400, None))
    with scripted_server(script) as url:
        with pytest.raises(RemoteError, match=r"rejected \(HTTP 400\): scripted 400"):
            asyncio.run(RetrievalClient(url, retries=3).search(["q"], topk=1))
    assert len(script.paths) == 1
