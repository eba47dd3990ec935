"""The RL reward on hand-built trajectories, with values computed by hand."""

from __future__ import annotations

import pytest

from asearch.agent.trajectory import Trajectory, Turn
from asearch.config import load_config
from asearch.errors import ConfigError
from asearch.metrics import RewardConfig, check_format, compute_reward


def act(text: str, action: str | None = None, parse_error: str | None = None) -> Turn:
    return Turn(kind="act", output_text=text, action=action, parse_error=parse_error)


def read(text: str) -> Turn:
    return Turn(kind="read", output_text=text)


def traj(answer: str | None, *turns: Turn, finish: str = "answer") -> Trajectory:
    return Trajectory(
        id="t", question="q", style="asearcher", turns=list(turns), answer=answer, finish=finish
    )


GOOD = [
    act("<think>find it</think>\n<search>ada varn born</search>", "search"),
    read("Ada was born in Oslen.</summary>"),
    act("<think>done</think>\n<answer>the Oslen city</answer>", "answer"),
]


def test_f1_reward_of_a_well_formed_trajectory():
    # answer "the Oslen city" vs gold "Oslen": tokens {oslen, city} vs {oslen}: P = 1/2, R = 1, F1 = 2/3
    r = compute_reward(traj("the Oslen city", *GOOD), ["Oslen"])
    assert r.format_ok and r.reason == "ok"
    assert r.reward == pytest.approx(2 / 3) and r.score == pytest.approx(2 / 3)


@pytest.mark.parametrize(("metric", "expected"), [("em", 0.0), ("cem", 1.0), ("f1", 2 / 3)])
def test_metric_choice(metric, expected):
    r = compute_reward(traj("the Oslen city", *GOOD), ["Oslen"], RewardConfig(metric=metric))
    assert r.reward == pytest.approx(expected)


def test_paraphrase_golds_blend():
    # gold "Oslen" vs answer "Oslen harbour town": F1 = 2*(1/3)*1/(1/3+1) = 0.5
    # aug "Oslen harbour": P = 2/3, R = 1, F1 = 0.8; reward = 0.7*0.5 + 0.3*max(0.5, 0.8) = 0.59
    t = traj("Oslen harbour town", *GOOD)
    r = compute_reward(t, ["Oslen"], RewardConfig(), aug_golds=["Oslen harbour"])
    assert r.reward == pytest.approx(0.59)
    # a worse paraphrase never lowers the score: 0.7*0.5 + 0.3*max(0.5, 0) = 0.5
    assert compute_reward(t, ["Oslen"], aug_golds=["Kettering"]).reward == pytest.approx(0.5)
    # aug_weight 1 takes the best of the two sets
    assert compute_reward(
        t, ["Oslen"], RewardConfig(aug_weight=1.0), aug_golds=["Oslen harbour"]
    ).reward == pytest.approx(0.8)


def test_no_answer_gets_no_answer_reward():
    t = traj(None, GOOD[0], GOOD[1], finish="max_turns")
    r = compute_reward(t, ["Oslen"], RewardConfig(no_answer_reward=-0.1))
    assert (r.reward, r.score, r.format_ok) == (-0.1, 0.0, True)
    assert r.reason == "no answer (finish=max_turns)"


@pytest.mark.parametrize(
    ("bad_turn", "reason"),
    [
        (act("I am not sure.", parse_error="no action: end your turn with ..."), "turn 2 (act): no action"),
        (act("<think>a</think><think>b</think><search>x</search>", "search"), "more than one <think> block"),
        (act("<think>unclosed <search>x</search>", "search"), "<think> is never closed"),
        (act("</think><search>x</search>", "search"), "</think> without a matching <think>"),
        (
            act("<think><summary>x</think></summary><search>x</search>", "search"),
            "</think> closes across <summary>",
        ),
        (read("cut off by the token limit"), "turn 2 (read): <summary> is never closed"),
        (read("then <search>more</search></summary>"), "action tag <search> inside a summary"),
        (read("<summary>nested</summary></summary>"), "<summary> opened again"),
    ],
)
def test_format_gate_is_all_or_nothing(bad_turn, reason):
    # the answer is exactly right, so only the gate can take the reward away
    t = traj("Oslen", GOOD[0], bad_turn, GOOD[2])
    r = compute_reward(t, ["Oslen"], RewardConfig(invalid_answer_penalty=-0.5))
    assert not r.format_ok
    assert r.reward == -0.5
    assert r.score == 1.0  # what the answer would have earned, kept for logging
    assert reason in r.reason and r.reason.startswith("format: ")
    # with the gate off the same trajectory earns its score
    assert compute_reward(t, ["Oslen"], RewardConfig(format_gate=False)).reward == 1.0


def test_format_gate_accepts_what_the_loop_produces():
    tags = ("search", "access", "answer")
    assert check_format(GOOD, tags) is None
    assert check_format([act("<search>no think is fine</search>", "search")], tags) is None
    assert check_format([], tags) is None


def test_format_gate_knows_the_agents_own_action_tags():
    summary_with_find = read("then <find>born in</find></summary>")
    with_find = traj("Oslen", GOOD[0], summary_with_find, GOOD[2])
    with_find.action_tags = ["search", "access", "find", "answer"]  # what the loop records for its tools
    r = compute_reward(with_find, ["Oslen"])
    assert not r.format_ok and "action tag <find> inside a summary" in r.reason
    # trajectories recorded before they carried tags keep today's: search, access, answer
    untagged = traj("Oslen", GOOD[0], summary_with_find, GOOD[2])
    assert compute_reward(untagged, ["Oslen"]).format_ok
    assert not compute_reward(untagged, ["Oslen"], action_tags=["find", "answer"]).format_ok


def test_trajectory_dicts_score_the_same():
    t = traj("the Oslen city", *GOOD)
    assert compute_reward(t.to_dict(), ["Oslen"]) == compute_reward(t, ["Oslen"])


@pytest.mark.parametrize(
    ("replies", "reward", "format_ok"),
    [
        (["<think>known</think><answer>Oslen</answer>"], 1.0, True),
        (["<think>hmm", "<think>ok</think><answer>Oslen</answer>"], -0.5, False),  # first turn malformed
    ],
)
def test_on_trajectories_from_the_real_loop(replies, reward, format_ok, char_tokenizer):
    import asyncio

    from asearch.agent import AgentConfig, run_episode
    from asearch.engine.local.scripted import ScriptedEngine

    queue = list(replies)
    tok = char_tokenizer
    engine = ScriptedEngine(tok, lambda prompt: queue.pop(0))
    t = asyncio.run(run_episode(engine, tok, {}, "Where?", AgentConfig(style="search-r1", max_turns=3)))
    assert {"search", "answer"} <= set(t.action_tags)  # the loop records what its parser read as actions
    r = compute_reward(t, ["Oslen"], RewardConfig(invalid_answer_penalty=-0.5))
    assert (r.reward, r.format_ok) == (reward, format_ok), r.reason


def test_reward_config_validates_and_loads():
    cfg = load_config(RewardConfig, overrides=["metric=em", "invalid_answer_penalty=-0.5"])
    assert cfg.metric == "em" and cfg.invalid_answer_penalty == -0.5
    with pytest.raises(ConfigError, match="metric"):
        load_config(RewardConfig, overrides=["metric=bleu"])
    with pytest.raises(ConfigError, match="aug_weight"):
        load_config(RewardConfig, overrides=["aug_weight=1.5"])
