"""Styles list the agent's tools from the tools themselves: today's prompts byte for byte, a new tool added."""

from __future__ import annotations

import asyncio

import pytest

from asearch.agent import STYLES, AgentConfig, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.tools import AccessTool, SearchTool
from asearch.tools.find import FindTool


class _NoHits:
    async def search(self, queries, topk):
        return [[] for _ in queries]


class _NoPages:
    async def access(self, urls):
        return [None for _ in urls]


TOOLS = {"search": SearchTool(_NoHits()), "access": AccessTool(_NoPages())}

# the tool lists as they were written by hand before prompts were rendered from the tools
ASEARCHER_TOOL_LINES = """then write exactly one action:
<search>keywords</search> searches the encyclopedia and shows the top passages with their urls;
<access>url</access> shows the full page at a url;
<answer>short answer</answer> ends the task.
"""
REASONING_OPENING = """You are a careful research assistant with two tools. Reason step by step inside
<think></think>, then give exactly one action: <search>query</search>, <access>url</access> or
<answer>final answer</answer>. You will see"""


def test_todays_tools_render_todays_prompts():
    assert ASEARCHER_TOOL_LINES in STYLES["asearcher"].render_system_prompt(TOOLS)
    assert STYLES["reasoning"].render_system_prompt(TOOLS).startswith(REASONING_OPENING)
    for name in ("guided", "search-r1"):  # they list no tools: unchanged whatever the tools
        style = STYLES[name]
        assert style.render_system_prompt({**TOOLS, "find": FindTool()}) == style.system_prompt


def test_a_new_tool_shows_up_in_the_prompts_that_list_tools():
    tools = {**TOOLS, "find": FindTool()}
    asearcher = STYLES["asearcher"].render_system_prompt(tools)
    assert (
        "<access>url</access> shows the full page at a url;\n"
        "<find>phrase</find> shows where a phrase occurs in the page you accessed last;\n"
        "<answer>short answer</answer> ends the task." in asearcher
    )
    reasoning = STYLES["reasoning"].render_system_prompt(tools)
    assert "with three tools" in reasoning
    assert "<search>query</search>, <access>url</access>, <find>phrase</find> or\n<answer>" in reasoning


@pytest.mark.parametrize(
    ("style", "actions"),
    [("asearcher", ("search", "find", "answer")), ("search-r1", ("search", "answer"))],
)
def test_allowed_actions_are_the_tools_given_unless_the_style_restricts_them(style, actions):
    assert STYLES[style].allowed_actions({"search": TOOLS["search"], "find": FindTool()}) == actions


def test_an_agent_without_access_is_neither_told_of_it_nor_allowed_it():
    class Chars:  # a character tokenizer: enough for the loop without a chat template
        eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(map(chr, ids))

    prompts = []

    def policy(prompt):
        prompts.append(prompt)
        return "<answer>x</answer>" if "not available" in prompt else "<access>https://x.example/a</access>"

    tools = {"search": TOOLS["search"]}
    traj = asyncio.run(
        run_episode(ScriptedEngine(Chars(), policy), Chars(), tools, "q?", AgentConfig(max_turns=3))
    )
    assert "<access>" not in prompts[0] and "<search>keywords</search>" in prompts[0]
    assert traj.turns[0].parse_error == (
        "<access> is not available here: use one of <search>...</search>, <answer>...</answer>"
    )
    assert traj.answer == "x" and traj.action_tags[:2] == ["search", "answer"]
