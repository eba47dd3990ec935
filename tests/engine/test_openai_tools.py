"""Function calling on `asearch engine serve`'s chat API, driven by the official `openai` client.

The server is the real app (`create_app` over an `EngineServer`), reached in process through httpx's ASGI
transport, over a scripted engine whose replies are the texts a model would write: calls in the chat
template's format, parallel calls, a malformed call. The prompts it receives are the chat template's rendering
of the tools, the assistant's calls and the tool results.
"""

from __future__ import annotations

import asyncio
import functools
import json

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from asearch.engine.chat_tools import (  # noqa: E402
    CHATML_TOOLS_TEMPLATE,
    parse_reply,
    render_call_text,
    streamable,
    tool_call_format,
)
from asearch.engine.local.scripted import ScriptedEngine  # noqa: E402
from asearch.engine.server.app import EngineServer, create_app  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "search the web",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "access", "description": "read a page",
     "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
]  # fmt: skip
MESSAGES = [{"role": "system", "content": "you search"}, {"role": "user", "content": "who built the bridge?"}]
ONE_CALL = 'I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "bridge builder"}}\n</tool_call>'
TWO_CALLS = render_call_text(
    [{"name": "search", "arguments": {"query": "bridge"}}, {"name": "access", "arguments": {"url": "w://b"}}], "hermes"
)
MALFORMED = '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>'

# a Llama 3.1-style template: tools in the system turn, a call as a bare JSON object with "parameters"
LLAMA3_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call: {% for t in tools %}{{ t | tojson }}{% endfor %}{{ '\\n' }}"
    'Answer a call as {"name": function name, "parameters": dictionary of argument name and its value}<|im_end|>\n'
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}{{ '\\n' }}"
    "{% if m['tool_calls'] %}{% for tc in m['tool_calls'] %}"
    '{"name": "{{ tc.function.name }}", "parameters": {{ tc.function.arguments | tojson }}}{% endfor %}'
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from asearch.models.tiny import train_bpe_tokenizer

    texts = [ONE_CALL, TWO_CALLS, MALFORMED, json.dumps(TOOLS), "who built the bridge? you search the web"]
    tok = train_bpe_tokenizer(texts * 4, vocab_size=400)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    return tok


def sync(test):
    """Run an async test on its own event loop (the suite has no asyncio plugin)."""
    return functools.wraps(test)(lambda *a, **k: asyncio.run(test(*a, **k)))


class StreamingScripted(ScriptedEngine):
    """The scripted engine handing each token to `on_token` as the in-process engine does (streams need it)."""

    async def generate(self, request, on_token=None):
        resp = await super().generate(request)
        for t, lp in zip(resp.output_ids, resp.output_logprobs, strict=True):
            if on_token is not None:
                on_token(t, lp)
        return resp


def served(tokenizer, replies):
    """(openai.AsyncOpenAI on the engine server's app, the server, the prompts the engine was asked to continue)."""
    engine = StreamingScripted.from_replies(tokenizer, replies)
    prompts: list[str] = []
    policy = engine._reply

    def reply(request, prompt):  # every prompt the engine is asked to continue, as text
        prompts.append(prompt)
        return policy(request, prompt)

    engine._reply = reply  # type: ignore[method-assign]
    server = EngineServer(engine, served_model_name="tiny", eos_token_ids=[tokenizer.eos_token_id])  # type: ignore[arg-type]
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)), base_url="http://engine")
    client = openai.AsyncOpenAI(base_url="http://engine/v1", api_key="x", http_client=http, max_retries=0)
    return client, server, prompts


@sync
async def test_a_call_comes_back_as_tool_calls_and_its_result_is_rendered(tokenizer) -> None:
    client, server, prompts = served(tokenizer, [ONE_CALL, "It was Ada."])
    r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will search.\n"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"query": "bridge builder"}
    assert "<tools>\nsearch(query): search the web\naccess(url): read a page\n</tools>" in prompts[0]  # handed the tools
    # the call and its result go back in: rendered by the template as the model wrote them
    history = [*MESSAGES, choice.message, {"role": "tool", "tool_call_id": call.id, "content": "Ada built it"}]
    again = await client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    assert again.choices[0].message.content == "It was Ada." and again.choices[0].message.tool_calls is None
    assert again.choices[0].finish_reason == "stop"
    assert prompts[1].startswith(prompts[0] + ONE_CALL + "<|im_end|>\n<|im_start|>tool\nAda built it<|im_end|>")
    assert server.counts["tool_calls"] == 1


@sync
async def test_parallel_calls_streamed_and_not(tokenizer) -> None:
    client, _, _ = served(tokenizer, [TWO_CALLS])
    r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["search", "access"] and r.choices[0].message.content is None
    assert [json.loads(c.function.arguments) for c in calls] == [{"query": "bridge"}, {"url": "w://b"}]
    client, _, _ = served(tokenizer, [ONE_CALL.replace("</tool_call>", "</tool_call>\n" + TWO_CALLS)])
    stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, stream=True)
    content, calls, finish = "", {}, None
    async for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                calls[tc.index] = (tc.function.name, json.loads(tc.function.arguments))
            finish = ch.finish_reason or finish
    assert content == "I will search.\n" and finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        ("search", {"query": "bridge builder"}), ("search", {"query": "bridge"}), ("access", {"url": "w://b"})
    ]  # fmt: skip


@sync
async def test_a_malformed_call_is_text_with_finish_stop_and_counted(tokenizer) -> None:
    for stream in (False, True):
        client, server, _ = served(tokenizer, [MALFORMED])
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="tiny", messages=MESSAGES, tools=TOOLS, stream=True)]  # fmt: skip
            text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
            assert not any(ch.delta.tool_calls for c in chunks for ch in c.choices)
            finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
        else:
            r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
            text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
            assert r.choices[0].message.tool_calls is None
        assert text == MALFORMED and finish == ["stop"]
        assert server.counts["tool_call_parse_errors"] == 1 and "tool_calls" not in server.counts


@sync
async def test_tool_choice_and_templates_without_tools(tokenizer) -> None:
    client, _, _ = served(tokenizer, [ONE_CALL])
    r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == ONE_CALL and r.choices[0].finish_reason == "stop"  # not parsed
    with pytest.raises(openai.BadRequestError, match="named function is not supported"):
        await client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "search"}}
        )
    from copy import deepcopy

    no_tools = deepcopy(tokenizer)
    from asearch.models.tiny import CHATML_TEMPLATE

    no_tools.chat_template = CHATML_TEMPLATE
    client, _, _ = served(no_tools, [ONE_CALL])
    with pytest.raises(openai.BadRequestError, match="does not render tools"):
        await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)


def test_formats_and_streaming_cuts(tokenizer) -> None:
    names = frozenset({"search", "access"})
    assert tool_call_format(tokenizer) == "hermes"
    smollm2 = '<tool_call>[{"name": "search", "arguments": {"query": "a"}}, {"name": "access", "arguments": {"url": "b"}}]</tool_call>'
    assert [c.name for c in parse_reply(smollm2, "hermes", names).calls] == ["search", "access"]
    assert parse_reply('<tool_call>{"name": "delete", "arguments": {}}</tool_call>', "hermes", names).malformed
    assert parse_reply("<tool_call>{}", "hermes", names).malformed  # never closed
    llama = '{"name": "search", "parameters": {"query": "a"}}; {"name": "access", "parameters": {"url": "b"}}'
    reply = parse_reply(llama, "llama3", names)
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [("search", {"query": "a"}), ("access", {"url": "b"})]
    assert parse_reply("It was Ada.", "llama3", names).calls == () and parse_reply('{"name": ', "llama3", names).malformed
    assert streamable("I will <tool_ca", "hermes") == len("I will") and streamable("hi\n<tool_call>{", "hermes") == 2
    assert streamable(' {"na', "llama3") == 0 and streamable("It was", "llama3") == len("It was")


@sync
async def test_llama3_style_template_round_trip(tokenizer) -> None:
    from copy import deepcopy

    llama = deepcopy(tokenizer)
    llama.chat_template = LLAMA3_TEMPLATE
    assert tool_call_format(llama) == "llama3"
    text = render_call_text([{"name": "access", "arguments": {"url": "w://b"}}], "llama3")
    client, _, prompts = served(llama, [text, "done"])
    r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("access", {"url": "w://b"})
    history = [*MESSAGES, r.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "page"}]
    await client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    assert prompts[1].startswith(prompts[0] + text + "<|im_end|>")  # the call re-rendered as written


# Qwen2.5-Instruct's chat template (tools in the system turn, calls as <tool_call> JSON, tool results in a user
# turn as <tool_response>), reproduced here (tests have no Hub access)
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


@sync
async def test_qwen25_template_parallel_calls_and_tool_responses(tokenizer) -> None:
    from copy import deepcopy

    qwen = deepcopy(tokenizer)
    qwen.chat_template = QWEN25_TEMPLATE
    assert tool_call_format(qwen) == "hermes"
    client, _, prompts = served(qwen, [TWO_CALLS, "Ada"])
    r = await client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    calls = r.choices[0].message.tool_calls
    history = [*MESSAGES, r.choices[0].message, *(
        {"role": "tool", "tool_call_id": c.id, "content": f"result {i}"} for i, c in enumerate(calls)
    )]  # fmt: skip
    await client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    assert "You are provided with function signatures" in prompts[0] and '"name": "access"' in prompts[0]
    # a reply that only calls re-renders exactly as sampled; both results go in one user turn
    assert prompts[1].startswith(prompts[0] + TWO_CALLS + "<|im_end|>\n<|im_start|>user\n<tool_response>\nresult 0\n"
                                 "</tool_response>\n<tool_response>\nresult 1\n</tool_response><|im_end|>\n")  # fmt: skip
