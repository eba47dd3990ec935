"""A scripted search expert for the world: searches each hop's entity, copies the fact it reads, answers.

It plays through the real agent loop as a policy (`ScriptedEngine`), so its trajectories are token-exact
and see real BM25 results with distractors. It makes deliberate mistakes (answering a multi-hop question
after too few hops, or copying a wrong name on one-hop questions) so the supervised policy starts weak
but still samples the right behaviour sometimes, which is what RL needs to sharpen.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*\b")

# The prompt format the expert reads (style options of the `search-r1` style): no system prompt, the question
# on a `Question:` line, each result in an <information> block. The demo's agent uses it too.
WORLD_STYLE = {
    "system_prompt": "",
    "use_chat_template": False,
    "reading_turns": False,
    "user_template": "Question: {question}",
    "observation_template": "\n<information>\n{text}\n</information>\n",
}


@dataclass(frozen=True)
class Plan:
    """The hops of one question: entity names to search, in order, and the value each hop yields."""

    entities: tuple[str, ...]  # e_0 (the subject) .. e_{H-1}
    values: tuple[str, ...]  # v_0 .. v_{H-1}; v_i = e_{i+1}, v_{H-1} = the answer


def plan_from_record(record: Mapping[str, Any]) -> Plan:
    ev = record["metadata"]["evidence"]
    return Plan(tuple(e["entity"] for e in ev), tuple(str(e["value"]) for e in ev))


def act(tag: str, text: str) -> str:
    """`<tag> text</tag>`: the space makes the first word the token it is in the question and the results
    (byte-level BPE glues `>` to a following word, so `<search>Name` would spell Name differently)."""
    return f"<{tag}> {text}</{tag}>"


class WorldExpert:
    """Policy(prompt text) -> next model output. `plans` maps question text to its Plan."""

    def __init__(
        self, plans: Mapping[str, Plan], *, p_skip: float = 0.5, p_wrong: float = 0.25, seed: int = 0,
        skip_at: str = "every",
    ):  # fmt: skip
        """`skip_at`: "every" extra hop may be skipped (each with p_skip), or only the "first" (an expert that
        went on to a second search finishes the question)."""
        if skip_at not in ("every", "first"):
            raise ValueError(f"skip_at must be 'every' or 'first', got {skip_at!r}")
        self.plans, self.p_skip, self.p_wrong, self.seed, self.skip_at = dict(plans), p_skip, p_wrong, seed, skip_at

    def _rng(self, prompt: str) -> random.Random:
        # decisions depend on the state only, so a trajectory is reproducible whatever the scheduling
        return random.Random(int(hashlib.sha256(f"{self.seed}|{prompt}".encode()).hexdigest()[:16], 16))

    def __call__(self, prompt: str) -> str:
        question = _question_of(prompt)
        plan = self.plans.get(question)
        if plan is None:
            return act("answer", "unknown")
        blocks = prompt.split("<information>")[1:]
        hop = len(blocks)  # searches done so far
        rng = self._rng(prompt)
        if hop == 0:
            return act("search", plan.entities[0])
        last = blocks[-1].split("</information>")[0]
        value = plan.values[hop - 1]
        if value not in last:  # the page did not come back: the expert cannot copy what it did not read
            names = [n for n in _NAME.findall(last) if n != plan.entities[hop - 1]]
            return act("answer", rng.choice(names) if names else "unknown")
        if hop == len(plan.values):  # last hop read: answer (one-hop questions sometimes with a wrong name)
            if len(plan.values) == 1 and rng.random() < self.p_wrong:
                names = [n for n in set(_NAME.findall(last)) if n not in (value, plan.entities[0])]
                if names:
                    return act("answer", rng.choice(sorted(names)))
            return act("answer", value)
        if (self.skip_at == "every" or hop == 1) and rng.random() < self.p_skip:  # the mistake: stop short
            return act("answer", value)
        return act("search", value)


def _question_of(prompt: str) -> str:
    m = re.search(r"Question: (.*?)\n", prompt)
    return m.group(1).strip() if m else ""
