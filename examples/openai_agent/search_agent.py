"""A search agent written only against the `openai` client, with function calling.

    asearch train configs/train-world-tiny.yaml workflow.kind=openai_agent \
        workflow.agent=examples/openai_agent/search_agent.py:agent ...

The same function runs against any OpenAI-compatible server: inside asearch (training, `asearch eval`) the
client it is handed is the episode's training session and `search` / `access` run asearch's tools for the
question through `asearch.agent.openai_session.call_tool`; elsewhere, hand it any `openai.AsyncOpenAI` and
a `search_tools` of your own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from asearch.agent.openai_session import call_tool, episode_tools

MODEL = os.environ.get("AGENT_MODEL", "policy")  # a training session answers any name; a vLLM server wants its own
MAX_CALLS = int(os.environ.get("AGENT_MAX_CALLS", "6"))
SYSTEM = "Answer the question. Call search to find facts; reply with the answer alone once you know it."
TOOLS = [
    {"type": "function", "function": {
        "name": "search", "description": "search the encyclopedia",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "access", "description": "read a page",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
]  # fmt: skip


async def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """asearch's tool of the episode (search: a query, access: a url)."""
    return await call_tool(name, str(arguments.get("query") or arguments.get("url") or ""))


async def agent(client: Any, item: Any, tools: Callable[[str, dict[str, Any]], Awaitable[str]] = run_tool) -> str | None:
    """Call tools while the model asks for them; its first reply without a call is the answer."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": item.question}]
    current = episode_tools()  # inside asearch: offer only the tools the run configured (every schema costs prompt tokens)
    offered = [t for t in TOOLS if current is None or t["function"]["name"] in current.tools] or TOOLS
    for _ in range(MAX_CALLS):
        reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=offered)
        message = reply.choices[0].message
        messages.append(message)  # the assistant turn as the server returned it, calls included
        if not message.tool_calls:
            return (message.content or "").strip()
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": await tools(call.function.name, arguments)})
    return None
