"""The LLM backend's operators and gates, deterministically, against a scripted OpenAI-compatible server.

The server plays every role from the system prompt it receives: generator ([base], [inject], [fuzz]),
judge ([quality], [unique], answer grading) and the tool-less solver. Its generator writes real
questions about a small world's pages, so grounding is checked against real page text.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from asearch.corpus.world import WorldCorpus
from asearch.eval import load_dataset
from asearch.metrics.normalize import normalize_answer
from asearch.synth import SynthConfig, run_synthesis
from asearch.synth.config import DIRECT_ANSWER_PROMPT

WORLD = WorldCorpus(6, 300)


@dataclass
class Script:
    """Switches for the scripted roles (each test flips the ones it is about)."""

    solver_wrong: str = "Nobody"  # what the solver says to questions it has not memorised
    twin_fits: bool = False  # the uniqueness judge says the wrong answer also fits
    inject_changes_answer: bool = False
    inject_ungrounded: bool = False
    fuzz_two_questions: bool = False
    judge_unusable_on_unique: bool = False
    knows_fuzzed: bool = False  # the solver knows each question's fuzzed wording instead of the base one
    memory: dict[str, str] = field(default_factory=dict)  # question -> answer the solver knows
    bodies: list[dict] = field(default_factory=list)


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", text, re.M)
    assert m, (name, text)
    return m.group(1).strip()


def blur(question: str) -> str:
    """The scripted FUZZ: the first person's name becomes a description (their initials)."""
    return re.sub(
        r"of ([A-Z])\w+ ([A-Z])\w+", r"of the person with the initials \1 and \2", question, count=1
    )


def reply_for(s: Script, system: str, user: str) -> str:
    if system.startswith("[base]"):
        entity = WORLD.entity_by_url(_field(user, "URL"))
        if entity.type != "person":
            return "Sorry, I cannot write a question about this page."
        city = WORLD.graph.get(WORLD.graph.one(entity.id, "born_in"))
        q = f"Which city is the birthplace of {entity.name}?"
        s.memory[blur(q) if s.knows_fuzzed else q] = city.name  # a well-known fact: answered from memory
        aliases = [f"the city of {city.name}", city.name, ""]  # one alias, a repeat of the answer, a blank
        return json.dumps(
            {
                "question": q,
                "answer": city.name,
                "statement": WORLD.statement(entity, "born_in"),
                "aliases": aliases,
            }
        )
    if system.startswith("[inject]"):
        question, answer = _field(user, "Question"), _field(user, "Answer")
        page = WORLD.page(_field(user, "URL"))
        first_sentence = page.contents.split(". ")[0] + "."
        linked = page.title if answer not in page.title else "a neighbouring page"  # never leak the answer
        out = {
            "question": question[:-1] + f", the place linked to {linked}?",
            "statement": "The moon is made of cheese." if s.inject_ungrounded else first_sentence,
        }
        if s.inject_changes_answer:
            out["answer"] = answer + " Junior"
        return "Here you go:\n```json\n" + json.dumps(out) + "\n```"
    if system.startswith("[fuzz]"):
        question = _field(user, "Question")
        blurred = blur(question)
        if s.fuzz_two_questions:
            blurred += " And who founded it?"
        return json.dumps({"question": blurred, "blurred": "a name to a description"})
    if system.startswith("[quality]"):
        return json.dumps(
            {"fluent": True, "single": True, "solvable": True, "answer_fits": True, "reason": "ok"}
        )
    if system.startswith("[unique]"):
        if s.judge_unusable_on_unique:
            return "hmm, hard to say"
        candidate = _field(user, "Candidate answer")
        return json.dumps({"satisfies": s.twin_fits and candidate == "Twin", "reason": "scripted"})
    if system.startswith("You grade answers"):
        golds = re.findall(r"^- (.*)$", user.split("Predicted answer:")[0], re.M)
        prediction = user.split("Predicted answer:")[1].strip()
        ok = normalize_answer(prediction) in {normalize_answer(g) for g in golds}
        return json.dumps({"rationale": "scripted", "judgement": "correct" if ok else "incorrect"})
    if system == DIRECT_ANSWER_PROMPT:
        return s.memory.get(user, s.solver_wrong)
    raise AssertionError(f"unscripted system prompt: {system[:60]!r}")


@contextmanager
def scripted_server(script: Script):
    from asearch.retrieval.server import serve_in_thread

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        script.bodies.append(body)
        msgs = body["messages"]
        text = reply_for(script, msgs[0]["content"], msgs[-1]["content"])
        return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    with serve_in_thread(app) as url:
        yield f"{url}/v1"


def config(url: str, **over) -> SynthConfig:
    endpoint = {"base_url": url, "model": "scripted", "json_mode": "json_object", "retries": 0}
    base = {
        "backend": "llm",
        "seed": 0,
        "n_questions": 6,
        "max_seeds": 24,
        "rounds": 3,
        "min_edits": 1,
        "concurrency": 4,
        "llm": {"corpus": WORLD.name, "generator": endpoint},
        "solver": {"engine": {"kind": "openai", "model": "scripted", "base_url": url}, "k": 2},
        "grading": {"method": "judge"},
    }
    base.update(over)
    return SynthConfig.model_validate(base)


def run(tmp_path: Path, script: Script, **over):
    with scripted_server(script) as url:
        summary = run_synthesis(config(url, **over), tmp_path, log=lambda _: None)
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").open()]
    return summary, attempts


def steps(attempts: list[dict]) -> list[dict]:
    return [s for a in attempts for s in a["history"]]


def test_happy_path_accepts_grounded_questions_that_became_hard(tmp_path):
    script = Script()
    summary, attempts = run(tmp_path, script)
    rows = [json.loads(line) for line in (tmp_path / "questions.jsonl").open()]
    assert len(rows) >= 6
    for r in rows:
        assert r["backend"] == "llm" and r["models"]["generator"] == "scripted"
        assert r["edit_history"][0]["direct_accuracy"] == 1.0 and r["direct_accuracy"] == 0.0
        assert r["uniqueness"]["method"] == "llm-candidates"
        assert r["unique_verified"] is True and "1 candidate(s) ruled out" in r["uniqueness"]["detail"]
        assert r["aug_answer"] == [f"the city of {r['answer'][0]}"]  # the alias, once; no repeat, no blank
        seed_url = r["seed"]["url"]
        assert r["statements"][0]["url"] == seed_url
        for s in r["statements"]:  # every statement is a sentence of its page
            assert s["text"].rstrip(".") in WORLD.page(s["url"]).contents
    # non-person seed pages made the generator refuse: counted as base quality rejections
    refusals = [a for a in attempts if a["reason_code"] == "base_quality"]
    assert refusals and all("no JSON" in a["reason"] for a in refusals)
    assert summary.report["seeds"]["rejected"]["base_quality"] == len(refusals)
    # json mode asked the server for JSON on generator and judge calls, never on the solver's
    roles = {b["messages"][0]["content"][:12]: b.get("response_format") for b in script.bodies}
    assert roles["[base] You w"] == {"type": "json_object"} and roles["[quality] Yo"] == {
        "type": "json_object"
    }
    assert roles[DIRECT_ANSWER_PROMPT[:12]] is None
    assert len(load_dataset(tmp_path / "questions.jsonl")) == len(rows)


def test_a_second_fitting_answer_fails_the_uniqueness_gate(tmp_path):
    summary, attempts = run(tmp_path, Script(solver_wrong="Twin", twin_fits=True), max_seeds=12)
    edits = [s for s in steps(attempts) if s["round"] > 0]
    assert edits and all(s["rejected_by"] in ("uniqueness", "quality") for s in edits)
    unique_rejections = [s for s in edits if s["rejected_by"] == "uniqueness"]
    assert unique_rejections and all("also satisfied by: Twin" in s["reason"] for s in unique_rejections)
    assert summary.written == 0
    assert summary.report["edits"]["rejected_by"]["uniqueness"] == len(unique_rejections)
    assert summary.report["seeds"]["rejected"]["not_hard"] == sum(
        a["reason_code"] == "not_hard" for a in attempts
    )


@pytest.mark.parametrize(
    ("switch", "reason"),
    [
        ("inject_changes_answer", "answer changed"),
        ("inject_ungrounded", "statement not found on"),
        ("fuzz_two_questions", "several questions in one"),
    ],
)
def test_quality_gate_rejects_bad_edits(tmp_path, switch, reason):
    summary, attempts = run(
        tmp_path, Script(**{switch: True}), max_seeds=10, p_inject=1.0 if "inject" in switch else 0.0
    )
    rejected = [s for s in steps(attempts) if s["rejected_by"] == "quality" and s["round"] > 0]
    assert rejected and all(reason in s["reason"] for s in rejected)
    assert summary.report["edits"]["rejected_by"]["quality"] == len(rejected)
    assert summary.written == 0  # min_edits=1 and every edit was bad


def test_unusable_uniqueness_verdicts_leave_uniqueness_unverified(tmp_path):
    summary, attempts = run(tmp_path, Script(judge_unusable_on_unique=True), max_seeds=12)
    rows = [json.loads(line) for line in (tmp_path / "questions.jsonl").open()]
    assert rows, "questions are still accepted"
    assert all(r["unique_verified"] is False and "unusable" in r["uniqueness"]["detail"] for r in rows)
    assert summary.report["questions"]["unique_verified"] == 0


def test_an_edit_that_gets_easier_is_rejected_by_the_difficulty_gate(tmp_path):
    # the solver knows the fuzzed wording of each question but not the base: every fuzz makes it easier
    summary, attempts = run(tmp_path, Script(knows_fuzzed=True), max_seeds=10, p_inject=0.0, rounds=2)
    easier = [s for s in steps(attempts) if s["rejected_by"] == "difficulty"]
    assert easier and all(s["reason"] == "easier: direct accuracy 0.00 -> 1.00" for s in easier)
    assert summary.report["edits"]["rejected_by"]["difficulty"] == len(easier)
    assert summary.written == 0


def test_json_schema_mode_sends_each_prompt_its_keys(tmp_path):
    script = Script()
    with scripted_server(script) as url:
        cfg = config(url, max_seeds=6, rounds=1)
        cfg.llm.generator.json_mode = "json_schema"
        run_synthesis(cfg, tmp_path, log=lambda _: None)
    schemas = {}
    for body in script.bodies:
        fmt = body.get("response_format")
        role = body["messages"][0]["content"].split("]")[0].lstrip("[")[:12]
        schemas[role] = None if fmt is None else fmt["json_schema"]["schema"]["required"]
    assert schemas["base"] == ["question", "answer", "statement", "aliases"]
    assert schemas["quality"] == ["fluent", "single", "solvable", "answer_fits", "reason"]
    assert schemas["You grade an"] == ["rationale", "judgement"]  # the answer judge, constrained too
    assert schemas[DIRECT_ANSWER_PROMPT[:12]] is None  # the solver answers freely


class FakeChat:
    """A chat client in process: every call gets `reply`; the user messages are kept."""

    model = "fake"

    def __init__(self, reply: str):
        self.reply, self.users = reply, []

    async def chat(self, messages, **sampling):
        from types import SimpleNamespace

        self.users.append(messages[-1]["content"])
        return SimpleNamespace(text=self.reply)

    async def aclose(self):
        return None


def _backend(reply: str):
    from asearch.synth.config import GateConfig, LLMBackendConfig
    from asearch.synth.llm_backend import LLMBackend

    client = FakeChat(reply)
    return LLMBackend(
        LLMBackendConfig(corpus=WORLD.name), GateConfig(), generator=client, source=WORLD
    ), client


def test_answer_in_question_is_a_whole_word_match():
    import asyncio

    from asearch.synth.backend import Draft
    from asearch.synth.records import Statement

    ok = {"fluent": True, "single": True, "solvable": True, "answer_fits": True, "reason": "ok"}
    backend, _ = _backend(json.dumps(ok))
    person = next(e for e in WORLD.graph.entities("person") if WORLD.graph.one(e.id, "born_in"))
    statement = Statement(WORLD.statement(person, "born_in"), WORLD.url(person.id))

    def draft(question: str, answer: str) -> Draft:
        return Draft(question, [answer], [statement], state={"urls": [statement.url], "problem": ""})

    # "Ari" inside "Ariadne" is not the answer in the question; "Ari" as a word is
    assert asyncio.run(backend.quality(None, draft("Where was Ariadne's teacher born?", "Ari"))).passed
    leak = asyncio.run(backend.quality(None, draft("Where was the teacher of Ari born?", "Ari")))
    assert not leak.passed and leak.reason == "the answer appears in the question"


def test_uniqueness_skips_wrong_answers_that_are_aliases_and_caps_the_candidates():
    import asyncio

    from asearch.synth.backend import Draft

    backend, judge = _backend(json.dumps({"satisfies": False, "reason": "no"}))
    d = Draft("Which city?", ["Velmo"], [], state={"urls": []}, paraphrases=["the city of Velmo"])
    wrong = ["The city of Velmo", "A", "B", "C", "D", "E"]
    verdict = asyncio.run(backend.uniqueness(d, wrong))
    assert verdict.verified and verdict.detail == "4 candidate(s) ruled out"
    asked = [u.split("Candidate answer: ")[1] for u in judge.users]
    assert asked == ["A", "B", "C", "D"]  # the alias is not a second answer; max_candidates=4
