"""The LLM judge against a real OpenAI-compatible server on loopback that scripts its replies."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.remote.openai_chat import OpenAIChatClient
from asearch.metrics.judge import JUDGE_SYSTEM_PROMPT, LLMJudge, parse_judgement
from asearch.retrieval.server import serve_in_thread

VALID = '{"rationale": "Same city.", "judgement": "correct"}'
SCRIPTS: dict[str, list[object]] = {
    # case name (put in the question as "[case]") -> replies in order; an int is an HTTP error status
    "valid": [VALID],
    "incorrect": ['{"rationale": "Different person.", "judgement": "Incorrect"}'],
    "prose": [
        'Let me think. The answer names the same place.\n{"rationale": "ok", "judgement": "correct"} Done.'
    ],
    "fenced": ['Here you go:\n```json\n{"rationale": "Both say 1969.", "judgment": "correct"}\n```'],
    "garbage_then_valid": ["I think it is right!", "{not json", VALID],
    "http_error_then_valid": [500, VALID],
    "bad_label": ['{"rationale": "meh", "judgement": "partially correct"}'] * 5,
    "always_garbage": ["no idea"] * 10,
}


def _chat_app() -> tuple[FastAPI, dict[str, int], list[dict]]:
    app = FastAPI()
    calls: dict[str, int] = defaultdict(int)
    bodies: list[dict] = []

    async def completions(request: Request):
        body = await request.json()
        bodies.append(body)
        user = body["messages"][-1]["content"]
        case = re.search(r"\[(\w+)\]", user).group(1)
        replies = SCRIPTS[case]
        reply = replies[min(calls[case], len(replies) - 1)]
        calls[case] += 1
        if isinstance(reply, int):
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=reply)
        return {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model", "judge"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    app.post("/v1/chat/completions")(completions)
    app.post("/chat/completions")(completions)
    return app, calls, bodies


@pytest.fixture(scope="module")
def server():
    app, calls, bodies = _chat_app()
    with serve_in_thread(app) as url:
        yield url, calls, bodies


def _client(url: str) -> OpenAIChatClient:
    # transport retries off: the judge's own retries (on unusable replies) are under test
    return OpenAIChatClient(
        f"{url}/v1", "judge-model", api_key_env="ASEARCH_TEST_NO_KEY", retries=0, timeout=5
    )


async def _close(client) -> None:
    closer = getattr(client, "aclose", None)
    if closer is not None:
        await closer()


def _judge(url: str, case: str, prediction: str = "Paris", **kw):
    async def run():
        client = _client(url)
        try:
            judge = LLMJudge(client, retry_delay_s=0.0, **kw)
            return await judge.judge(
                f"[{case}] Where is the Eiffel Tower?", prediction, ["Paris", "Paris, France"]
            )
        finally:
            await _close(client)

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("case", "expected", "attempts"),
    [
        ("valid", True, 1),
        ("incorrect", False, 1),
        ("prose", True, 1),
        ("fenced", True, 1),
        ("garbage_then_valid", True, 3),
    ],
)
def test_verdicts_are_parsed_and_retried(server, case, expected, attempts):
    url, calls, _ = server
    before = calls[case]
    verdict = _judge(url, case, max_retries=2)
    assert verdict.correct is expected, verdict
    assert verdict.error is None
    assert verdict.attempts == attempts
    assert calls[case] - before == attempts  # the server really saw each retry


def test_a_failed_call_is_not_retried_on_top_of_the_client(server):
    url, calls, _ = server
    before = calls["http_error_then_valid"]
    verdict = _judge(url, "http_error_then_valid", max_retries=2)
    assert verdict.correct is None and verdict.attempts == 1 and "HTTP 500" in verdict.error
    assert calls["http_error_then_valid"] - before == 1


def test_failure_after_retries_is_none_with_error_not_a_score(server):
    url, calls, _ = server
    before = calls["always_garbage"]
    verdict = _judge(url, "always_garbage", max_retries=3)
    assert verdict.correct is None
    assert "after 4 attempts" in verdict.error and "no JSON object" in verdict.error
    assert verdict.raw == "no idea"
    assert calls["always_garbage"] - before == 4  # bounded: 1 + max_retries, not forever

    bad = _judge(url, "bad_label", max_retries=1)
    assert bad.correct is None and "partially correct" in bad.error


def test_request_carries_rubric_golds_and_truncated_prediction(server):
    url, _, bodies = server
    long_answer = "Paris " + "blah " * 400
    verdict = _judge(url, "valid", prediction=long_answer, max_prediction_chars=50)
    assert verdict.correct is True
    body = bodies[-1]
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert system == JUDGE_SYSTEM_PROMPT
    assert "- Paris\n- Paris, France" in user
    predicted = user.split("Predicted answer: ", 1)[1]
    assert predicted == long_answer[:50].strip() + " …[truncated]"
    assert body["temperature"] == 0.0


def test_blank_prediction_is_incorrect_without_a_call(server):
    url, calls, _ = server
    total = sum(calls.values())
    for pred in (None, "   "):
        verdict = _judge(url, "valid", prediction=pred)
        assert verdict.correct is False and verdict.attempts == 0
    assert sum(calls.values()) == total


def test_unreachable_server_fails_cleanly():
    async def run():
        client = _client("http://127.0.0.1:9")  # nothing listens on the discard port
        try:
            return await LLMJudge(client, max_retries=1, retry_delay_s=0.0).judge(
                "[valid] q?", "Paris", ["Paris"]
            )
        finally:
            await _close(client)

    verdict = asyncio.run(run())
    # one call: the client's retries (none here) decide about transport errors, the judge does not add its own
    assert verdict.correct is None and verdict.attempts == 1 and "ConnectError" in verdict.error


def test_parse_judgement_shapes():
    assert parse_judgement('{"rationale": "r", "judgement": " CORRECT "}') == (True, "r")
    # the last verdict wins when the model restates itself
    text = '{"judgement": "correct"} on reflection {"rationale": "no", "judgement": "incorrect"}'
    assert parse_judgement(text) == (False, "no")
    nested = json.dumps({"result": {"rationale": "deep", "judgement": "correct"}})
    assert parse_judgement(nested) == (True, "deep")
    for bad in ("", "correct", '{"rationale": "x"}', '{"judgement": 1}'):
        with pytest.raises(ValueError):
            parse_judgement(bad)


def test_judge_rejects_bad_settings():
    with pytest.raises(ValueError):
        LLMJudge(object(), max_retries=-1)
    with pytest.raises(ValueError):
        asyncio.run(LLMJudge(object()).judge("q", "a", []))
