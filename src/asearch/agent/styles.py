"""Agent styles: a prompt and a context policy per style, as config (asearcher, reasoning, guided,
search-r1). A style's system prompt lists the agent's tools through placeholders filled from the tools
themselves (`render_system_prompt`), so a new tool shows up in every prompt that lists tools.

A new style is one module of `asearch.agent` that calls `register_style(AgentStyle(name=..., ...))`; it is
found on the first lookup (`agent.style=<name>`) without being listed anywhere."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from asearch.agent.parsing import ANSWER
from asearch.config import Config
from asearch.registry import Registry
from asearch.tools import Tool, tool_argument_hint

_COUNT_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


class AgentStyle(Config):
    """How an agent talks: its prompt, allowed actions and how its context grows."""

    name: str
    system_prompt: str = Field(
        description="The system message. Placeholders filled from the tools the style allows: {tools} (one "
        "line per tool, its description and ';'), {tool_tags} (`<search>query</search>, <access>url</access>`), "
        "{tool_count} ('two tools')."
    )
    user_template: str = Field("Question: {question}", description="First user message; {question} is filled in.")
    actions: tuple[str, ...] | None = Field(
        None, description="Allowed action tags; None: every tool the agent is given, then answer."
    )
    observation_template: str = Field(
        "\n<information>\n{text}\n</information>\n", description="How a tool result or correction is shown."
    )
    correction_template: str = Field(
        "\n<information>\nYour last turn was not understood: {error}\n</information>\n",
        description="Shown after a malformed turn (counted as a parse error).",
    )
    reading_turns: bool = Field(
        True, description="After each result block or page chunk the model writes a summary in its own LLM call."
    )
    reading_tools: tuple[str, ...] | None = Field(
        None, description="With reading_turns: the tools whose results get reading turns (None: every tool's, as "
        "ASearcher does); the others are shown at once.",
    )
    read_max_new_tokens: int = Field(256, ge=1, description="Token budget of a reading turn (a summary).")
    read_open: str = "<summary>"
    read_close: str = "</summary>"
    history: Literal["full", "summaries"] = Field(
        "full",
        description="full: one growing context; summaries: every call rebuilds the prompt from short notes.",
    )
    history_chars: int = Field(25_000, ge=100, description="summaries: keep the last N characters of notes.")
    compact_read_blocks: int | None = Field(
        None,
        ge=0,
        description="full: after a block is summarised, keep only its first N characters in later context "
        "(None keeps it all). Starts a new segment.",
    )
    compact_when: Literal["read", "full"] = Field(
        "read",
        description="With compact_read_blocks: 'read' cuts each block as soon as it is summarised (ASearcher); "
        "'full' keeps summarised blocks whole until the next call would not fit agent.max_context_tokens, then "
        "cuts all of them at once (fewer segments, so less to train on; docs/agent.md).",
    )
    force_answer_after: int | None = Field(
        None, ge=1, description="After this many tool actions only <answer> is allowed."
    )
    force_answer_note: str = "\n(You have gathered enough evidence: give your final answer now in <answer></answer>.)\n"
    use_chat_template: bool = Field(True, description="Wrap the opening in the tokenizer's chat template if it has one.")
    act_max_new_tokens: int | None = Field(None, ge=1, description="Token budget of an act turn (None: agent.max_new_tokens).")
    close_opened_actions: bool = Field(
        False,
        description="When an act prefix opened an action tag and the model's turn ends without closing it, close "
        "it (counted as auto_closed). For small models that end their turn instead of writing the closing tag.",
    )
    act_prefixes: tuple[str, ...] = Field(
        (),
        description="Text that opens the k-th act turn (the last one repeats), e.g. '<think>' for reasoning "
        "models. It is context the model continues from, not a generated token.",
    )

    def allowed_actions(self, tools: Mapping[str, Tool[Any]]) -> tuple[str, ...]:
        """The actions of an act turn: `actions`, or every tool given (in order) then answer."""
        return self.actions if self.actions is not None else (*tools, ANSWER)

    def render_system_prompt(self, tools: Mapping[str, Tool[Any]]) -> str:
        """`system_prompt` with its placeholders filled from the tools this style lets the agent use."""
        usable = [(name, tool) for name, tool in tools.items() if name in self.allowed_actions(tools)]
        n = len(usable)
        count = f"{_COUNT_WORDS[n] if n < len(_COUNT_WORDS) else n} tool{'' if n == 1 else 's'}"
        lines = "".join(f"{tool.description};\n" for _, tool in usable)
        return (
            self.system_prompt.replace("{tools}\n", lines)
            .replace("{tools}", lines.rstrip("\n"))
            .replace("{tool_tags}", ", ".join(f"<{name}>{tool_argument_hint(t)}</{name}>" for name, t in usable))
            .replace("{tool_count}", count)
        )


_ASEARCHER_SYSTEM = """You are a research assistant. You find facts with a search engine, then answer.
Each turn, you may think inside <think></think>, then write exactly one action:
{tools}
<answer>short answer</answer> ends the task.
After each result you write what you learned inside <summary></summary>.

Example:
Question: Who painted the Mona Lisa?
<search>Mona Lisa painter</search>
<information>
[Doc 1](https://en.wikipedia.org/wiki/Mona_Lisa):
"Mona Lisa"
The Mona Lisa is a portrait painting by the Italian artist Leonardo da Vinci.
</information>
<summary>The Mona Lisa was painted by Leonardo da Vinci.</summary>
<answer>Leonardo da Vinci</answer>"""

_REASONING_SYSTEM = """You are a careful research assistant with {tool_count}. Reason step by step inside
<think></think>, then give exactly one action: {tool_tags} or
<answer>final answer</answer>. You will see your earlier notes, not your full earlier reasoning.
After each search result or page, write the facts that matter inside <summary></summary>."""

_SEARCH_R1_SYSTEM = """Answer the question. Reason inside <think></think>. If you lack knowledge, call a
search engine with <search>query</search>; results appear between <information> and </information>.
Search as often as you need. When ready, give the answer inside <answer></answer>, without explanation."""

_GUIDED_SYSTEM = """Answer the question with the help of an encyclopedia search.
Example:
Question: Who wrote the play Hamlet?
<search>Hamlet play</search>
<information>
[Doc 1](https://en.wikipedia.org/wiki/Hamlet):
"Hamlet"
Hamlet is a tragedy written by William Shakespeare.
</information>
<answer>William Shakespeare</answer>"""

STYLES: Registry[AgentStyle] = Registry("agent style", "asearch.agent", wants=lambda source: "register_style(" in source)


def register_style(style: AgentStyle) -> AgentStyle:
    """Make `style` the one `agent.style=<style.name>` picks; a second style under a taken name is an error."""
    module = sys._getframe(1).f_globals.get("__name__", "?")  # the registering module: a re-import is quiet
    STYLES.add(style.name, style, origin=f"{module}.{style.name}")
    return style


def get_style(name: str) -> AgentStyle:
    """The style registered as `name`; a ConfigError naming the nearest one if there is none."""
    return STYLES.get(name)


# as ASearcher: a page chunk is cut to its first 100 characters once summarised
register_style(AgentStyle(name="asearcher", system_prompt=_ASEARCHER_SYSTEM, compact_read_blocks=100))
register_style(AgentStyle(name="reasoning", system_prompt=_REASONING_SYSTEM, history="summaries", force_answer_after=32))
# Small instruct models (e.g. SmolLM2-135M) cannot drive the tag protocol themselves: the loop opens
# each act turn for them (first a search, then the answer); the query and the answer are the model's.
register_style(
    AgentStyle(
        name="guided",
        system_prompt=_GUIDED_SYSTEM,
        actions=("search", "answer"),
        reading_turns=False,
        act_prefixes=("<search>", "<answer>"),
        act_max_new_tokens=48,
        close_opened_actions=True,
    )
)
register_style(
    AgentStyle(name="search-r1", system_prompt=_SEARCH_R1_SYSTEM, actions=("search", "answer"), reading_turns=False)
)
