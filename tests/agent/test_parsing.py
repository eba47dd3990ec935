"""Action parsing: exactly one balanced action; everything else is an explained error."""

from __future__ import annotations

import pytest

from asearch.agent.parsing import Action, action_tags, parse_action
from asearch.tools import SearchTool
from asearch.tools.find import FindTool


@pytest.mark.parametrize(
    ("text", "kind", "arg"),
    [
        ("<think>need the city</think>\n<search>Tavi Morn birthplace</search>", "search", "Tavi Morn birthplace"),
        ("<access> https://x.example/wiki/A </access>", "access", "https://x.example/wiki/A"),
        ("<think>ok</think><answer>Paris</answer>", "answer", "Paris"),
        ("<ANSWER>\n  Paris\n</ANSWER>", "answer", "Paris"),
        ("<summary>a</summary><think>b</think><search>q</search>", "search", "q"),
    ],
)
def test_valid_actions(text, kind, arg):
    a = parse_action(text, ("search", "access", "answer"))
    assert (a.kind, a.argument, a.error) == (kind, arg, None)


@pytest.mark.parametrize(
    ("text", "allowed", "needle"),
    [
        ("I think the answer is Paris", ("search", "answer"), "no action"),
        ("<search>a</search><search>b</search>", ("search", "answer"), "more than one action"),
        ("<search>a</search><answer>b</answer>", ("search", "answer"), "more than one action"),
        ("<search>unclosed query", ("search", "answer"), "never closed"),
        ("</search>", ("search", "answer"), "without a matching"),
        ("<think><think>x</think>", ("search", "answer"), "opened twice"),
        ("<access>https://a</access>", ("search", "answer"), "not available"),
        ("<search>   </search>", ("search", "answer"), "is empty"),
        ("<answer>x</answer>", ("search",), "not available"),
    ],
)
def test_malformed_turns_explain_themselves(text, allowed, needle):
    a = parse_action(text, allowed)
    assert a.kind is None
    assert needle in a.error


def test_the_tags_come_from_the_tools():
    tools = {"search": SearchTool(_NoHits()), "find": FindTool()}
    tags = action_tags(tools)
    assert list(tags)[:3] == ["search", "find", "answer"] and tags["find"] == "phrase"
    assert "access" in tags  # registered but not given: known, so writing it is "not available", not "no action"
    allowed = ("search", "find", "answer")
    assert parse_action("<think>x</think><find>born in</find>", allowed, tags) == Action("find", "born in")
    assert parse_action("<find> </find>", allowed, tags).error == "<find> is empty: put the phrase between the tags"
    assert parse_action("<search></search>", allowed, tags).error.endswith("put the query between the tags")
    assert "<access> is not available here" in parse_action("<access>u</access>", allowed, tags).error
    # a tag no tool registers is plain text
    assert parse_action("<calc>1+1</calc>", allowed, tags).error.startswith("no action")


class _NoHits:
    async def search(self, queries, topk):
        return [[] for _ in queries]
