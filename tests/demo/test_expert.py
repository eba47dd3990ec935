"""The scripted expert's deliberate mistakes: where it may stop short, and that it is reproducible."""

from __future__ import annotations

import pytest

from asearch.agent.expert import Plan, WorldExpert, act

Q = "Who founded the employer of Ann Lee's spouse?"
PLAN = Plan(entities=("Ann Lee", "Bo Kim", "Kim Works"), values=("Bo Kim", "Kim Works", "Cy Dorn"))


def _prompt(blocks: list[str]) -> str:
    text = f"Question: {Q}\n"
    for entity, page in zip(PLAN.entities, blocks, strict=False):
        text += act("search", entity) + f"\n<information>\n[Doc 1] {page}\n</information>\n"
    return text


PAGES = ["Ann Lee : person ; spouse Bo Kim .", "Bo Kim : person ; employer Kim Works .", "Kim Works : company ; founder Cy Dorn ."]


@pytest.mark.parametrize("skip_at", ["every", "first"])
def test_where_the_expert_may_stop_short(skip_at: str) -> None:
    always = WorldExpert({Q: PLAN}, p_skip=1.0, p_wrong=0.0, skip_at=skip_at)
    never = WorldExpert({Q: PLAN}, p_skip=0.0, p_wrong=0.0, skip_at=skip_at)
    assert always(_prompt([])) == act("search", "Ann Lee")
    assert always(_prompt(PAGES[:1])) == act("answer", "Bo Kim")  # after the first search: both modes may stop
    # after the second: "every" may stop again, "first" finishes the walk
    assert always(_prompt(PAGES[:2])) == (act("answer", "Kim Works") if skip_at == "every" else act("search", "Kim Works"))
    assert [never(_prompt(PAGES[:k])) for k in range(4)] == [
        act("search", "Ann Lee"), act("search", "Bo Kim"), act("search", "Kim Works"), act("answer", "Cy Dorn"),
    ]  # fmt: skip


def test_the_experts_choices_depend_on_seed_and_prompt_only() -> None:
    a, b = (WorldExpert({Q: PLAN}, p_skip=0.5, p_wrong=0.0, seed=3) for _ in range(2))
    prompts = [_prompt(PAGES[:1]) + " " * k for k in range(40)]  # 40 different states
    assert [a(p) for p in prompts] == [b(p) for p in prompts]
    assert len({a(p) for p in prompts}) == 2  # both choices occur at p_skip 0.5
    with pytest.raises(ValueError, match="skip_at"):
        WorldExpert({Q: PLAN}, skip_at="last")
