"""`OpenAIChatEngine` with more stop strings than OpenAI's API takes (4): a server that refuses a fifth, as
vLLM does with HTTP 400, gets the first four, and the others cut the reply on the client."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.remote.openai_chat import MAX_STOP_STRINGS, OpenAIChatClient, OpenAIChatEngine
from asearch.engine.types import GenerateRequest, SamplingParams
from asearch.retrieval.server import serve_in_thread

STOPS = ["</search>", "</access>", "</inject>", "</fuzz>", "</stop>"]  # the synthesis agent's five actions


def strict_server(replies: list[str], bodies: list[dict]) -> FastAPI:
    """A chat server that takes at most 4 stop strings and drops the one it stops at, like vLLM."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        bodies.append(body)
        stops = body.get("stop") or []
        if len(stops) > 4:
            return JSONResponse({"error": {"message": "stop: at most 4 items"}}, status_code=400)
        text = replies[len(bodies) - 1]
        cuts = [text.find(s) for s in stops if s in text]
        text = text[: min(cuts)] if cuts else text
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return JSONResponse({"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})

    return app


def test_stop_strings_past_the_api_limit_are_applied_on_the_client():
    replies = ["<stop>hard now</stop> and then the model rambles on", "<search>velmo</search> more", "plain"]
    bodies: list[dict] = []

    async def main() -> list:
        with serve_in_thread(strict_server(replies, bodies)) as url:
            engine = OpenAIChatEngine(OpenAIChatClient(f"{url}/v1", "m", retries=0))
            sampling = SamplingParams(max_new_tokens=64, stop=list(STOPS))
            request = GenerateRequest(messages=[{"role": "user", "content": "q"}], sampling=sampling)
            try:
                return [await engine.generate(request) for _ in replies]
            finally:
                await engine.close()

    cut, sent, none = asyncio.run(main())
    assert all(b["stop"] == STOPS[:MAX_STOP_STRINGS] for b in bodies)  # never more than the API takes
    assert cut.text == "<stop>hard now</stop>" and cut.stop_reason == "stop"  # the fifth, cut here
    assert sent.text == "<search>velmo</search>"  # a sent one: cut by the server, put back here
    assert none.text == "plain"
