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

from asearch.corpus.world.questions import statement_key

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


# ---------------------------------------------------------------------------- the reading expert (long pages)

# The long-horizon agent's format: the world style with access, and a reading turn (a <summary>) after
# each page chunk; search results are shown at once.
READING_STYLE = {**WORLD_STYLE, "actions": ("search", "access", "answer"), "reading_turns": True, "reading_tools": ("access",)}

_ACTION = re.compile(r"<(search|access|answer)> ?(.*?)</\1>|<summary> ?(.*?)</summary>", re.S)
_RESULT = re.compile(r"^\[Doc \d+\]\((\S+)\) (.+?) : ", re.M)
_MARKER = re.compile(r"\[page (\d+)/(\d+) of (\S+)\]")


# A reading turn's summary is `key value` when the chunk holds the asked line, `key none` when it does not:
# the key comes first either way, so the model writes what it looks for before it decides whether it is there.
NOT_FOUND = "none"


def summary_found(summary: str) -> bool:
    """Whether a summary's text (`employer Rurvin Partners` or `employer none`) reports the asked line."""
    words = summary.split()
    return len(words) >= 2 and words[-1] != NOT_FOUND


@dataclass(frozen=True)
class ReadingPlan:
    """The hops of one question on long pages: the subject to search first, and the key word of the line
    that holds each hop's fact (`employer`, `birthplace`, ...)."""

    subject: str
    keys: tuple[str, ...]


def reading_plan_from_record(record: Mapping[str, Any]) -> ReadingPlan:
    """A question's plan from its evidence: each statement is `key value`, so the key is what precedes the value."""
    ev = record["metadata"]["evidence"]
    return ReadingPlan(ev[0]["entity"], tuple(statement_key(e["statement"], e["value"]) for e in ev))


class ReadingExpert:
    """Policy(prompt text) -> next model output, as ASearcher's agent works on long pages: search the hop's
    entity, open the result titled with it, read the page chunk by chunk writing a `<summary>` of each (the
    asked line, or `<key> none`), open the next chunk until the line is found, then the next hop, then answer.

    It reads its state off the prompt, its own summaries included (old chunks may have been cut from the
    context), so it works the same after compaction. Its mistakes leave the right behaviour reachable:
    `p_skip` answers a middle hop's value as if it were the last, `p_stop` stops reading a page whose line
    it has not found yet and guesses a name from the chunk, `p_distract` summarises another line's name as
    the asked one when the chunk lacks it, and `p_skim` makes a whole episode impatient: it never opens a
    page's next chunk and guesses instead (a short-horizon agent, the habit RL has to break; the other
    episodes read every page to its line, so SFT still sees whole long chains). Choices depend on
    (seed, prompt) only, and the skim choice on (seed, question)."""

    def __init__(self, plans: Mapping[str, ReadingPlan], *, p_skip: float = 0.1, p_stop: float = 0.1,
                 p_distract: float = 0.1, p_skim: float = 0.0, seed: int = 0):  # fmt: skip
        self.plans, self.seed = dict(plans), seed
        self.p_skip, self.p_stop, self.p_distract, self.p_skim = p_skip, p_stop, p_distract, p_skim

    def _rng(self, prompt: str) -> random.Random:
        return random.Random(int(hashlib.sha256(f"{self.seed}|{prompt}".encode()).hexdigest()[:16], 16))

    def skims(self, question: str) -> bool:
        """Whether the episode of `question` is an impatient one (`p_skim`)."""
        return self.p_skim > 0 and self._rng(f"skim|{question}").random() < self.p_skim

    def __call__(self, prompt: str) -> str:
        plan = self.plans.get(_question_of(prompt))
        if plan is None:
            return act("answer", "unknown")
        rng = self._rng(prompt)
        events = [(m.group(1) or "summary", m.group(2) if m.group(1) else m.group(3)) for m in _ACTION.finditer(prompt)]
        hop = sum(1 for kind, text in events if kind == "summary" and summary_found(text))
        tail = prompt.split("<information>")[-1] if "<information>" in prompt else ""
        if prompt.endswith("<summary>"):
            return self._summary(plan.keys[min(hop, len(plan.keys) - 1)], tail, rng)
        if not events:
            return act("search", plan.subject)
        kind, text = events[-1]
        if kind == "search":
            return self._open_result(text, tail)
        if kind == "summary" and not summary_found(text):
            last_url = next((arg for k, arg in reversed(events) if k == "access"), "")
            return self._read_on(tail, last_url.strip(), rng, skim=self.skims(_question_of(prompt)))
        if kind == "summary":
            value = text.split(" ", len(plan.keys[hop - 1].split()))[-1]
            if hop >= len(plan.keys) or rng.random() < self.p_skip:
                return act("answer", value)
            return act("search", value)
        return act("answer", "unknown")  # a page that ended without the line, or an error

    def _summary(self, key: str, chunk: str, rng: random.Random) -> str:
        """The reading turn's text after `<summary>`: the line `key value` if the chunk has it."""
        lines = chunk.split("</information>")[0].splitlines()
        asked = [line for line in lines if line.startswith(key + " ")]
        if asked:
            return f" {asked[0]}</summary>"
        others = [line for line in lines[2:] if " " in line and not line.startswith("[")]
        if others and rng.random() < self.p_distract:
            name = others[rng.randrange(len(others))].split(" ", 1)[1]
            return f" {key} {name}</summary>"
        return f" {key} {NOT_FOUND}</summary>"

    def _open_result(self, query: str, results: str) -> str:
        """Open the result titled exactly as the entity searched for."""
        for url, title in _RESULT.findall(results):
            if title == query:
                return act("access", url)
        return act("answer", "unknown")

    def _read_on(self, chunk: str, url: str, rng: random.Random, *, skim: bool = False) -> str:
        """After a chunk without the asked line: open the page's next chunk (or, the mistake, guess). The
        chunk's marker says whether one is left; a chunk already cut from the context has none (go on)."""
        marker = _MARKER.search(chunk)
        if marker is not None and int(marker.group(1)) >= int(marker.group(2)) or not url:
            return act("answer", "unknown")
        if skim or rng.random() < self.p_stop:
            names = _NAME.findall(chunk.split("\n", 2)[-1])
            return act("answer", rng.choice(names) if names else "unknown")
        return act("access", url)
