"""Action parsing: exactly one balanced action; everything else is an explained error."""

from __future__ import annotations

import pytest

from asearch.agent.parsing import parse_action


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
    a = parse_action(text)
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
