"""The OpenAI request models of `asearch engine serve`: every bad field is a 400 in OpenAI's error shape that
names it; tool turns, tools and nulls are read as OpenAI's API means them. (tests/engine/test_openai_api.py
sends the same through the official `openai` client to a real server.)"""

from __future__ import annotations

import pytest

from asearch.engine.server.openai_requests import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": USER, "max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
        ({"messages": USER, "temperature": "hot"}, "temperature", "temperature must be a number, got 'hot'"),
        ({"messages": USER, "n": True}, "n", "n must be an integer, got True"),
        ({"messages": USER, "n": 129}, "n", "n must be an integer <= 128, got 129"),
        ({"messages": USER, "top_p": 0}, "top_p", "top_p must be a number > 0, got 0"),
        ({"messages": USER, "stream": "yes"}, "stream", "stream must be true or false, got 'yes'"),
        ({"messages": USER, "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "must be true or false"),
        ({"messages": USER, "stop": [1]}, "stop", "stop must be a string or a list of strings, got [1]"),
        ({"messages": USER, "stop_token_ids": ["a"]}, "stop_token_ids[0]", "must be an integer, got 'a'"),
        ({"messages": USER, "frequency_penalty": 1.0}, "frequency_penalty", "penalties are not supported"),
        ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format", "only response_format type text"),
        ({"messages": USER, "best_of": 3}, "best_of", "best_of=3 is not supported"),
        ({"messages": []}, "messages", "messages must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be 'system', 'developer', 'user'"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
            "messages[0].content",
            "only text parts are supported, got {'type': 'image_url'} (part 1)",
        ),
        ({"messages": USER, "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "is required"),
        ({"messages": USER, "tools": [{"type": "retrieval"}]}, "tools[0].type", "must be 'function'"),
        ({"messages": USER, "tool_choice": "required"}, "tool_choice", "tool_choice='required' needs tools"),
        ({"messages": USER, "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        (
            {"messages": USER, "continue_final_message": True},
            "continue_final_message",
            "needs add_generation_prompt=false and a last message with role assistant",
        ),
    ],
)
def test_a_bad_chat_field_is_a_400_naming_it(body, param, message) -> None:
    with pytest.raises(APIError) as err:
        parse_request(body, chat=True)
    e = err.value
    assert (e.status_code, e.param) == (400, param) and message in str(e), str(e)
    assert e.body() == {"error": {"message": str(e), "type": "invalid_request_error", "param": param, "code": None}}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "prompt", "is required"),
        ({"prompt": []}, "prompt", "prompt must be a string, a list of token ids, or a non-empty list of either"),
        ({"prompt": [1, "a"]}, "prompt", "prompt must be"),
        ({"prompt": "x", "logprobs": 2}, "logprobs", "only the sampled token's log-prob"),
        ({"prompt": "x", "echo": True}, "echo", "echo is not supported"),
    ],
)
def test_a_bad_completion_field_is_a_400_naming_it(body, param, message) -> None:
    with pytest.raises(APIError) as err:
        parse_request(body, chat=False)
    assert err.value.param == param and message in str(err.value), str(err.value)


def test_tool_turns_nulls_and_unknown_fields() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "a"}'}}
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}, "x-extra": 1}]
    req = parse_request(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"},
            ],
            "tools": tools,
            "tool_choice": "auto",
            "temperature": None,  # null reads as not sent
            "seed": None,
            "user": "someone",  # unknown to this server: ignored, as OpenAI's server ignores new optional fields
        },
        chat=True,
    )
    assert isinstance(req, ChatCompletionRequest) and req.temperature == 1.0 and req.seed is None
    assert [m.text for m in req.messages] == ["be brief", "a\nb", "", "found"]
    assert req.messages[2].template_form() == {"role": "assistant", "tool_calls": [call]}
    assert req.messages[3].template_form() == {"role": "tool", "tool_call_id": "c1"}
    assert [t.model_dump(exclude_unset=True) for t in req.tools] == tools  # reach the template as sent
    done = parse_request({"prompt": ["a", [1, 2]], "stop": "\n", "max_completion_tokens": 5, "max_tokens": 9}, chat=False)
    assert isinstance(done, CompletionRequest) and done.prompts == ["a", [1, 2]]
    assert done.stops == ["\n"] and done.max_new_tokens == 5
    assert parse_request({"prompt": [1, 2]}, chat=False).prompts == [[1, 2]]
