"""Function calling in chat: tools rendered by the model's own chat template, calls parsed back from its text.

    request tools + messages (assistant `tool_calls`, `tool` turns) ── chat template(tools=...) ──> prompt
    generated text ── the template family's format ──> content + tool calls (or, malformed: text)

The format is read off the chat template (`tool_call_format`): templates that write a call as
`<tool_call>{json}</tool_call>` (Qwen2.5, Qwen3, Hermes; SmolLM2 puts a JSON list inside) are `hermes`;
Llama 3.1+ templates, which have the model answer a bare `{"name": ..., "parameters": ...}` object (after
`<|python_tag|>` for built-in tools), are `llama3`. A template that renders no tools takes none: a request with
tools is refused rather than answered by a model that was never shown them.

A reply whose call does not parse (bad JSON, no name, a function the request did not offer, an unclosed
`<tool_call>`) comes back whole as text, as vLLM's parsers answer it; `ParsedReply.malformed` says so, and the
server counts it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

FormatName = Literal["hermes", "llama3"]
ToolChoice = Literal["none", "auto", "required"]
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA_PYTHON_TAG = "<|python_tag|>"
_HERMES_CALL = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.DOTALL)


class ToolRequestError(ValueError):
    """A request's tools, tool_choice or tool messages are not usable; `param` names the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call as OpenAI's API returns it: `arguments` is a JSON string."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A generated reply read as OpenAI's assistant message: text (None when it only called) and calls."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()
    malformed: str | None = None  # why a call did not parse (the reply is then all content)


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A chat request's `tools` (OpenAI's list, handed to the chat template as it is) and `tool_choice`:
    none (the model is shown the tools but its reply is not parsed), auto or required (parsed)."""

    tools: tuple[dict[str, Any], ...]
    choice: ToolChoice = "auto"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)

    @property
    def parse(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def tool_request(body: Mapping[str, Any]) -> ToolRequest | None:
    """The tools of a chat request body, checked; None when it offers none. A named `tool_choice` (a forced
    call) needs constrained decoding, which the engine does not do: refused."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ToolRequestError(f"tool_choice={choice!r} needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolRequestError("tools must be a list of {type: function, function: {name, ...}}", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ToolRequestError(f"tools[{i}] must be {{type: function, function: {{...}}}}, got {t!r}", "tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolRequestError(f"tools[{i}].function.name must be a non-empty string", "tools")
    if choice is None:
        choice = "auto"
    if choice not in ("none", "auto", "required"):
        raise ToolRequestError(
            f"tool_choice={choice!r}: a named function is not supported (it needs constrained decoding); "
            "send auto, required or none",
            "tool_choice",
        )
    return ToolRequest(tuple(tools), cast(ToolChoice, choice))


def template_text(tokenizer: object) -> str:
    """The tokenizer's chat template(s) as one string ('' when it has none)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return " ".join(template.values()) if isinstance(template, dict) else str(template)


def tool_call_format(tokenizer: object) -> FormatName | None:
    """How the chat template has the model write a call; None when the template does not render tools."""
    text = template_text(tokenizer)
    if "tools" not in text:
        return None
    if HERMES_OPEN in text:
        return "hermes"
    if LLAMA_PYTHON_TAG in text or "<|eom_id|>" in text or '"parameters"' in text:
        return "llama3"
    return None


# --------------------------------------------------------------------------- messages to the template


def _arguments(value: Any) -> Any:
    """A call's arguments as templates render them: a dict (Qwen's template writes `arguments | tojson`, so
    OpenAI's JSON string would be quoted twice); text that is not a JSON object stays text."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def template_message(m: Mapping[str, Any], content: str) -> dict[str, Any]:
    """One OpenAI message as HF chat templates take it: role and text, an assistant's `tool_calls` with
    dict arguments, a tool turn's `tool_call_id` and `name`."""
    out: dict[str, Any] = {"role": m["role"], "content": content}
    calls = m.get("tool_calls")
    if m["role"] == "assistant" and calls:
        if not isinstance(calls, list):
            raise ToolRequestError("tool_calls must be a list", "messages")
        rendered = []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ToolRequestError(f"a tool call must be {{id, type, function: {{name, arguments}}}}, got {c!r}", "messages")
            call = {"name": fn["name"], "arguments": _arguments(fn.get("arguments", {}))}
            rendered.append({"id": c.get("id"), "type": "function", "function": call})
        out["tool_calls"] = rendered
    if m["role"] == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                out[key] = m[key]
    return out


# --------------------------------------------------------------------------- replies to calls


def _call_of(obj: Any, names: frozenset[str], args_key: str) -> ToolCall:
    """One call from a parsed JSON object; ValueError says why it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"a call must be an object with a name, got {obj!r}"[:200])
    if obj["name"] not in names:
        raise ValueError(f"no function {obj['name']!r} was offered")
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):
        args = json.loads(args)  # a JSON string of an object, as some models write it
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {obj['name']!r} must be an object")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _parse_hermes(text: str, names: frozenset[str]) -> ParsedReply:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return ParsedReply(text)
    calls: list[ToolCall] = []
    ends = 0
    for m in _HERMES_CALL.finditer(text, start):
        body = json.loads(m.group(1).strip())
        for obj in body if isinstance(body, list) else [body]:  # SmolLM2 writes a list of calls
            calls.append(_call_of(obj, names, "arguments"))
        ends = m.end()
    if not calls or HERMES_OPEN in text[ends:]:
        raise ValueError(f"{HERMES_OPEN} is not closed by {HERMES_CLOSE}")
    before = text[:start]
    return ParsedReply(before if before.strip() else None, tuple(calls))


def _parse_llama3(text: str, names: frozenset[str]) -> ParsedReply:
    body = text.strip()
    if body.startswith(LLAMA_PYTHON_TAG):
        body = body[len(LLAMA_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        return ParsedReply(text)
    decoder, calls, i = json.JSONDecoder(), [], 0
    while i < len(body):  # one object, or several separated by ';' (Llama 3.2's parallel calls)
        obj, i = decoder.raw_decode(body, i)
        calls.append(_call_of(obj, names, "parameters"))
        i = len(body) - len(body[i:].lstrip().removeprefix(";").lstrip())
    return ParsedReply(None, tuple(calls))


def parse_reply(text: str, fmt: FormatName, names: frozenset[str]) -> ParsedReply:
    """A generated reply as content + tool calls in `fmt`; malformed calls give the whole text back."""
    try:
        return _parse_hermes(text, names) if fmt == "hermes" else _parse_llama3(text, names)
    except (ValueError, TypeError) as e:  # json's JSONDecodeError is a ValueError
        return ParsedReply(text, (), malformed=str(e) or type(e).__name__)


def streamable(text: str, fmt: FormatName) -> int:
    """How much of a reply still being generated can go out as content now: everything before a call may
    start. hermes: up to `<tool_call>` (or a tail that could grow into it), trailing whitespace held back;
    llama3: nothing while the reply may still turn out to be a call (empty, or opening with `{`)."""
    if fmt == "llama3":
        head = text.lstrip()
        if not head or head.startswith("{") or LLAMA_PYTHON_TAG.startswith(head[: len(LLAMA_PYTHON_TAG)]):
            return 0
        return len(text)
    cut = text.find(HERMES_OPEN)
    if cut < 0:
        cut = len(text)
        for k in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(HERMES_OPEN[:k]):
                cut -= k
                break
    return len(text[:cut].rstrip())


def render_call_text(calls: Sequence[Mapping[str, Any]], fmt: FormatName) -> str:
    """Calls ({name, arguments: dict}) as the model should write them in `fmt`: what supervised warm-up
    teaches and what `parse_reply` reads back."""
    if fmt == "llama3":
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}, ensure_ascii=False) for c in calls)
    return "\n".join(
        f"{HERMES_OPEN}\n{json.dumps({'name': c['name'], 'arguments': c['arguments']}, ensure_ascii=False)}\n{HERMES_CLOSE}"
        for c in calls
    )


# ChatML with tools in the hermes format, as Qwen2.5 renders them, for tiny models built without one (tests, the
# CPU example): a call is re-rendered exactly as `render_call_text` writes it, so history does not change. A
# tool is listed in one line, `name(arg, ...): description`, not as its JSON schema, which a tiny tokenizer
# spells nearly byte by byte (the example's expert episodes, docs/agents-openai.md: 524 -> 404 tokens).
CHATML_TOOLS_TEMPLATE = (  # HF renders with trim_blocks: a newline right after a tag is written as {{ '\\n' }}
    "{% if tools %}<|im_start|>system{{ '\\n' }}{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}# Tools\n<tools>{% for tool in tools %}"
    "{% set fn = tool['function'] %}{{ '\\n' + fn['name'] + '(' + (fn.get('parameters', {}).get('properties', {}) | list"
    " | join(', ')) + '): ' + fn.get('description', '') }}{% endfor %}{{ '\\n' }}</tools>\n"
    'Call a function as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n{{ message['content'] or '' }}"
    "{% for tc in message['tool_calls'] or [] %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] != 'system' %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
