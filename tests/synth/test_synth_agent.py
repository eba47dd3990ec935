"""The agentic synthesis backend's control flow, deterministically, against a scripted LLM behind the real
engine server (`asearch.engine.server.app.create_app`: its OpenAI routes, chat template and stop strings).

The served "model" is a `ScriptedEngine` whose policy reads the chat back from the prompt and plays every
role from its system message: the base-QA generator, the quality and uniqueness judges, the tool-less
solver, the synthesis agent (a script of moves per test) and the search agent that measures difficulty
with tools. The agent's tools are real (BM25 search and access over a small world), so an injected
statement is checked against real page text.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from asearch.corpus.world import WorldCorpus
from asearch.synth import SynthConfig, run_synthesis
from asearch.synth.config import DIRECT_ANSWER_PROMPT

WORLD = WorldCorpus(6, 300)
ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = "smollm2-135m-instruct"  # the chat template both ends use (the scripted engine needs no weights)


@dataclass(frozen=True)
class Person:
    """A seed the scripts can use: a person educated at `school`, born in `city` (founded in `year`)."""

    name: str
    school: str
    statement: str  # the seed page's sentence naming the school
    city: str
    city_url: str
    year: str
    occupation: str
    birth_year: int

    @classmethod
    def of(cls, url: str) -> Person | None:
        e, g = WORLD.entity_by_url(url), WORLD.graph
        if e.type != "person" or not g.one(e.id, "alma_mater") or not g.one(e.id, "born_in"):
            return None
        school, city = g.get(g.one(e.id, "alma_mater")), g.get(g.one(e.id, "born_in"))
        city_url = WORLD.url(city.id)
        founded = re.search(rf"{re.escape(city.name)} was founded in (\d+)\.", WORLD.page(city_url).contents)
        if founded is None:
            return None
        return cls(e.name, school.name, WORLD.statement(e, "alma_mater"), city.name, city_url, founded[1],
                   e.attrs["occupation"], e.attrs["birth_year"])  # fmt: skip

    def version(self, name: str) -> str:
        return {
            "base": f"Which institution educated {self.name}?",
            "injected": f"Which institution educated {self.name}, who was born in a city founded in {self.year}?",
            "fuzzed": f"Which institution educated the {self.occupation} born in {self.birth_year} in a city "
            f"founded in {self.year}?",
        }[name]


PEOPLE = {url: p for page in WORLD.pages() if (p := Person.of(url := page.url)) is not None}
VERSIONS = {p.version(v): (p, v) for p in PEOPLE.values() for v in ("base", "injected", "fuzzed")}


def _inject(p: Person, statement: str | None = None) -> str:
    obj = {"question": p.version("injected"), "statement": statement or f"{p.city} was founded in {p.year}.",
           "url": p.city_url}  # fmt: skip
    return "<think>the city's page says when it was founded</think>\n<inject>" + json.dumps(obj) + "</inject>"


# The synthesis agent's moves, by name: each gets the seed person and returns the turn's text.
MOVES: dict[str, Callable[[Person], str]] = {
    "search": lambda p: f"<search>{p.city} founded</search>",
    "access": lambda p: f"<access>{p.city_url}</access>",
    "inject": _inject,
    "inject_unfounded": lambda p: _inject(p, f"{p.city} was founded by seven giants on a hill."),
    "inject_bad_json": lambda p: "<inject>the city was founded in some year</inject>",
    "fuzz": lambda p: (
        "<fuzz>"
        + json.dumps({"question": p.version("fuzzed"), "blurred": "the name became a description"})
        + "</fuzz>"
    ),
    "stop": lambda p: "<stop>no direct answer is right any more</stop>",
    "no_action": lambda p: "I think the question is hard enough already.",
    "answer_tag": lambda p: f"<answer>{p.school}</answer>",
    "unbalanced": lambda p: "enough thinking</think>",
}


@dataclass
class Script:
    """What the scripted roles do in one test."""

    moves: list[str]  # the synthesis agent's turns (the last one repeats)
    knows: set[str] = field(default_factory=lambda: {"base", "injected"})  # versions the solver answers
    not_fluent: set[str] = field(default_factory=set)  # versions the quality judge calls not fluent
    second_answer: set[str] = field(default_factory=set)  # versions the solver's wrong answer also fits
    tool_solver_right: bool = True
    roles: list[str] = field(default_factory=list)  # the role of every request, in order


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", text, re.M)
    assert m, (name, text)
    return m.group(1).strip()


def reply(script: Script, messages: list[dict[str, str]]) -> str:
    system, user = messages[0]["content"], messages[1]["content"]
    role = (
        "solver"
        if system == DIRECT_ANSWER_PROMPT
        else system[1 : system.find("]")]
        if system[0] == "["
        else "tool_solver"
    )
    script.roles.append(role)
    if role == "base":
        p = PEOPLE.get(_field(user, "URL"))
        if p is None:
            return "Sorry, I cannot write a question about this page."
        return json.dumps(
            {"question": p.version("base"), "answer": p.school, "statement": p.statement, "aliases": []}
        )
    if role == "synth-agent":
        turn = sum(m["role"] == "assistant" for m in messages)
        person = PEOPLE[re.search(r"^Seed page: .* \((\S+)\)$", user, re.M)[1]]
        return MOVES[script.moves[min(turn, len(script.moves) - 1)]](person)
    if role == "tool_solver":
        assert system.startswith("Answer the question. Reason inside"), system  # the search-r1 style
        p, _ = VERSIONS[user.removeprefix("Question: ")]
        return f"<answer>{p.school if script.tool_solver_right else 'Nobody'}</answer>"
    p, version = VERSIONS.get(user if role == "solver" else _field(user, "Question"), (None, "other"))
    if role == "solver":
        return p.school if p is not None and version in script.knows else "Nobody"
    if role == "quality":
        fluent = version not in script.not_fluent
        return json.dumps({"fluent": fluent, "single": True, "solvable": True, "answer_fits": True,
                           "reason": "scripted" if fluent else "it reads like a list"})  # fmt: skip
    assert role == "unique", system[:80]
    return json.dumps({"satisfies": version in script.second_answer, "reason": "scripted"})


@dataclass
class Served:
    url: str
    script: Script


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """The scripted model behind the engine server's real app, on loopback; tests swap `script`."""
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.engine.remote.openai_chat import ChatTemplateReader
    from asearch.engine.server.app import EngineServer, create_app
    from asearch.models.loading import load_tokenizer
    from asearch.retrieval.server import serve_in_thread

    tokenizer = load_tokenizer(TOKENIZER)
    reader = ChatTemplateReader(tokenizer)
    state = Served("", Script(["stop"]))

    def policy(prompt: str) -> str:
        messages, partial = reader.read(prompt)
        assert not partial, "the agent opens no turns here"
        return reply(state.script, messages)

    server = EngineServer(
        ScriptedEngine(tokenizer, policy), model_path="scripted", served_model_name="scripted"
    )
    with serve_in_thread(create_app(server)) as url:
        state.url = url
        yield state


def seeds_through(n_people: int, run_seed: int = 0) -> int:
    """How many seeds (in the run's order) it takes to meet `n_people` scripted people."""
    from asearch.synth.config import GateConfig, LLMBackendConfig
    from asearch.synth.llm_backend import LLMBackend

    class Unused:
        model = "unused"

    backend = LLMBackend(
        LLMBackendConfig(corpus=WORLD.name), GateConfig(), run_seed, generator=Unused(), source=WORLD
    )
    hits = [i for i, s in enumerate(backend.seeds()) if s.url in PEOPLE]
    return hits[n_people - 1] + 1


def config(url: str, *, people: int = 1, **over: Any) -> dict[str, Any]:
    endpoint = {"base_url": f"{url}/v1", "model": "scripted", "retries": 0}
    cfg: dict[str, Any] = {
        "backend": "agent", "seed": 0, "n_questions": 5, "max_seeds": seeds_through(people), "rounds": 4,
        "min_edits": 1, "concurrency": 2, "id_prefix": "agent",
        "llm": {"corpus": WORLD.name, "generator": endpoint},
        "agent": {"engine": {"kind": "openai", "model": "scripted", "base_url": url, "tokenizer": TOKENIZER,
                             "retries": 0}, "max_turns": 8},
        "solver": {"engine": {"kind": "openai", "model": "scripted", "base_url": url}, "k": 2},
        "grading": {"method": "em"},
    }  # fmt: skip
    for key, value in over.items():
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return cfg


def run(served: Served, tmp_path: Path, script: Script, **over: Any) -> tuple[Any, list[dict], list[dict]]:
    """One run; (summary, attempts of the scripted people, every attempt)."""
    served.script = script
    summary = run_synthesis(
        SynthConfig.model_validate(config(served.url, **over)), tmp_path, log=lambda _: None
    )
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").open()]
    return summary, [a for a in attempts if a["seed"]["url"] in PEOPLE], attempts


def test_the_agent_searches_reads_injects_fuzzes_and_stops(served, tmp_path):
    summary, (a,), everyone = run(served, tmp_path, Script(["search", "access", "inject", "fuzz", "stop"]))
    p = PEOPLE[a["seed"]["url"]]
    assert a["status"] == "accepted" and a["actions"] == {
        "search": 1,
        "access": 1,
        "inject": 1,
        "fuzz": 1,
        "stop": 1,
    }
    steps = a["history"]
    assert [(s["action"], s["kept"]) for s in steps] == [("base", True), ("inject", True), ("fuzz", True)]
    assert [s["direct_accuracy"] for s in steps] == [1.0, 1.0, 0.0]  # the solver knew the first two versions
    (row,) = [json.loads(line) for line in (tmp_path / "questions.jsonl").open()]
    assert (
        row["question"] == p.version("fuzzed") and row["answer"] == [p.school] and row["backend"] == "agent"
    )
    injected = row["statements"][1]
    assert injected == {"text": f"{p.city} was founded in {p.year}.", "url": p.city_url, "entity": "",
                        "relation": "", "value": ""}  # fmt: skip
    assert row["direct_accuracy"] == 0.0 and row["tool_accuracy"] == 1.0 and row["unique_verified"] is True
    assert row["models"]["agent"] == "chat:scripted"
    transcript = a["agent"]["transcript"]
    assert p.city_url in transcript[0]["observation"]  # search found the city's page...
    assert f"founded in {p.year}" in transcript[1]["observation"]  # ...and access showed its text
    assert (
        transcript[3]["observation"].startswith("Kept.")
        and "0 of 2 direct answers" in transcript[3]["observation"]
    )
    assert transcript[4]["observation"].startswith("Accepted") and a["agent"]["finish"] == "answer"
    report = summary.report
    assert report["agent"]["actions"] == {
        "search": 1,
        "access": 1,
        "inject": 1,
        "fuzz": 1,
        "stop": 1,
        "malformed": 0,
    }
    assert (
        report["seeds"]["finished"] == len(everyone)
        and report["seeds"]["rejected"]["base_quality"] == len(everyone) - 1
    )
    md = (tmp_path / "filter_report.md").read_text()
    assert "## Synthesis agent" in md and "| inject | 1 |" in md and "(agent backend)" in md
    # the agent's turns went through the server's chat route: the scripted model saw every role
    assert {"base", "synth-agent", "quality", "unique", "solver", "tool_solver"} <= set(served.script.roles)


def test_an_injected_statement_missing_from_its_page_is_rejected_with_the_reason(served, tmp_path):
    script = Script(["access", "inject_unfounded", "inject", "fuzz", "stop"])
    summary, (a,), _ = run(served, tmp_path, script)
    p = PEOPLE[a["seed"]["url"]]
    bad = a["history"][1]
    assert bad["action"] == "inject" and bad["rejected_by"] == "quality" and not bad["kept"]
    assert bad["reason"].startswith(f"statement not found on {p.city_url}: ") and "giants" in bad["reason"]
    assert bad["direct_accuracy"] is None  # rejected before any solver call
    assert "Rejected by the quality check: statement not found" in a["agent"]["transcript"][1]["observation"]
    assert a["status"] == "accepted" and [s["kept"] for s in a["history"]] == [True, False, True, True]
    assert summary.report["rejections_by_reason"]["quality"]["statement not found on <url>"] == 1


def test_malformed_turns_get_a_correction_and_are_counted(served, tmp_path):
    script = Script(["no_action", "answer_tag", "unbalanced", "inject_bad_json", "inject", "fuzz", "stop"])
    summary, (a,), _ = run(served, tmp_path, script, **{"agent.max_turns": 10})
    assert a["status"] == "accepted"
    assert a["actions"] == {"malformed": 3, "inject": 2, "fuzz": 1, "stop": 1}
    assert a["agent"]["parse_errors"] == 3 and a["agent"]["bad_arguments"] == {"inject": 1}
    errors = [t["error"] for t in a["agent"]["transcript"][:4]]
    assert errors[0].startswith("no action") and "<answer> is not available here" in errors[1]
    assert (
        errors[2].startswith("unbalanced tags")
        and 'inject needs one JSON object with the strings "question"' in errors[3]
    )
    assert [s["action"] for s in a["history"]] == ["base", "inject", "fuzz"]  # a bad call proposes no edit
    assert summary.report["agent"]["bad_arguments"] == {"inject": 1}


def test_a_stop_before_any_injection_is_refused_and_the_episode_goes_on(served, tmp_path):
    _, (a,), _ = run(served, tmp_path / "then-inject", Script(["stop", "stop", "inject", "fuzz", "stop"]))
    assert a["status"] == "accepted" and a["actions"]["stop"] == 3
    assert [r.split(" (")[0] for r in a["agent"]["refusals"]] == ["no fact injected yet"] * 2
    assert a["agent"]["transcript"][0]["observation"].startswith("Refused: no fact injected yet")

    summary, (b,), _ = run(served, tmp_path / "only-stops", Script(["stop"]), **{"agent.max_turns": 3})
    assert (
        b["reason_code"] == "no_stop"
        and b["reason"] == "the agent did not stop with a question (max_turns after 3 turns)"
    )
    assert len(b["agent"]["refusals"]) == 3 and summary.written == 0
    assert summary.report["seeds"]["rejected"]["no_stop"] == 1
    assert (
        "| the agent never stopped with a question (turn or context limit) | 1 |"
        in (tmp_path / "only-stops" / "filter_report.md").read_text()
    )


@pytest.mark.parametrize(
    ("script", "over", "gate", "reason", "code"),
    [
        (Script(["inject", "fuzz", "stop"], not_fluent={"fuzzed"}), {}, "quality",
         "judge: not fluent (it reads like a list)", "not_hard"),
        (Script(["inject", "fuzz", "stop"], second_answer={"fuzzed"}), {}, "uniqueness",
         "also satisfied by: Nobody", "not_hard"),
        (Script(["inject", "fuzz", "stop"], knows={"base", "injected", "fuzzed"}), {}, None, None, "not_hard"),
        (Script(["inject", "fuzz", "stop"], tool_solver_right=False), {"agent.min_tool_correct": 1}, None, None,
         "not_solvable"),
    ],
    ids=["quality", "uniqueness", "too-easy", "not-solvable-with-tools"],
)  # fmt: skip
def test_gate_rejections_are_recorded_with_their_reasons(served, tmp_path, script, over, gate, reason, code):
    summary, (a,), _ = run(served, tmp_path, script, **over)
    fuzz = a["history"][2]
    assert a["reason_code"] == code and summary.written == 0
    if (
        gate is not None
    ):  # the fuzz was rejected, so the injected version (which the solver knows) is submitted
        assert fuzz["rejected_by"] == gate and fuzz["reason"] == reason
        assert "Rejected by the " + gate in a["agent"]["transcript"][1]["observation"]
        assert a["reason"] == "too easy: 2/2 direct answers right at stop (hard = at most 0)"
    elif code == "not_hard":
        assert fuzz["kept"] and a["reason"].startswith("too easy: 2/2")
    else:
        assert a["reason"] == "the search agent answered 0/1 right with tools (agent.min_tool_correct=1)"
        assert a["agent"]["tool_solver"] == {"answers": ["Nobody"], "accuracy": 0.0}
    by_reason = summary.report["rejections_by_reason"]
    final = "difficulty at stop" if code == "not_hard" else "difficulty with tools"
    assert sum(by_reason[final].values()) == 1
    if gate is not None:
        assert by_reason[gate][reason.split(" (")[0]] == 1


def test_n_questions_is_a_ceiling_and_a_rerun_with_more_writes_the_rest(served, tmp_path):
    # every seed starts at once (concurrency > seeds), so all five people are accepted before the target stops
    # the run: the ceiling must come from the writing, in seed order
    script = Script(["inject", "fuzz", "stop"])
    summary, people, everyone = run(served, tmp_path, script, people=5, n_questions=2, concurrency=64)
    rows = [json.loads(line) for line in (tmp_path / "questions.jsonl").open()]
    assert sum(a["status"] == "accepted" for a in people) == 5
    assert len(rows) == summary.written == 2 and summary.report["questions"]["over_target"] == 3
    assert [r["seed"]["index"] for r in rows] == sorted(a["seed"]["index"] for a in people)[:2]
    assert "| accepted past n_questions, not written | 3 |" in (tmp_path / "filter_report.md").read_text()
    again, _, _ = run(served, tmp_path, script, people=5, n_questions=5, concurrency=64)
    assert again.written == 5 and again.attempted_now == 0 and again.resumed == len(everyone)


def test_synthesis_is_a_rollout_workflow(served, tmp_path):
    from asearch.synth.agentic import build_agent_synthesizer
    from asearch.synth.pipeline import Synthesizer, build_backend, build_grader
    from asearch.synth.solver import build_solver

    cfg = SynthConfig.model_validate(config(served.url))
    backend = build_backend(cfg)
    solver, grader = build_solver(cfg.solver), build_grader(cfg, backend)
    runner = build_agent_synthesizer(cfg, Synthesizer(backend, solver, grader, cfg))
    seed = next(s for s in backend.seeds() if s.url in PEOPLE)
    flow = runner.workflow

    async def episodes() -> tuple[Any, Any]:
        try:
            served.script = Script(["inject", "fuzz", "stop"])
            accepted = await flow.arun_episode(runner.engine, seed, seed=7)
            served.script = Script(["inject", "stop"])
            rejected = await flow.arun_episode(runner.engine, seed, seed=7)
            return accepted, rejected
        finally:
            for part in (runner, solver, backend):
                await part.aclose()

    accepted, rejected = asyncio.run(episodes())
    assert accepted.finish == "answer" and accepted.answer == "no direct answer is right any more"
    assert accepted.metadata["question"]["question"] == PEOPLE[seed.url].version("fuzzed")
    assert [t.action for t in accepted.turns] == ["inject", "fuzz", "stop"]
    assert rejected is None and flow.rejected == {"not_hard": 1}


def test_a_server_that_is_not_up_fails_the_run_before_any_seed(tmp_path):
    from asearch.cli.app import app
    from asearch.net import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    for name, overrides in [
        ("synth-agent.yaml", [f"llm.generator.engine.base_url={dead}/v1"]),
        ("synth-llm.yaml", [f"llm.generator.engine.base_url={dead}/v1", f"solver.engine.base_url={dead}/v1"]),
    ]:
        out = tmp_path / name
        args = ["synth", "run", str(ROOT / "configs" / name), "--out", str(out), "--no-progress", *overrides]
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0
        message = str(result.exception)
        assert (
            "cannot reach the server" in message
            and f"llm.generator.engine.base_url={dead}/v1: ConnectError" in message
        )
        assert not (out / "attempts.jsonl").exists() and not (out / "errors.jsonl").exists()


def test_a_run_that_writes_nothing_exits_non_zero_with_the_reason(served, tmp_path):
    import yaml

    from asearch.cli.app import app

    served.script = Script(["stop"])
    cfg = config(served.url, **{"agent.max_turns": 2})
    path = tmp_path / "synth.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(
        app, ["synth", "run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    )
    assert result.exit_code != 0 and "questions written" in result.output
    assert str(result.exception).startswith(f"no questions written to {tmp_path / 'out' / 'questions.jsonl'}")
    assert "no_stop 1" in str(result.exception)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smollm2_drives_the_agent_through_engine_serve(served, tmp_path):
    """Plumbing with a real model: SmolLM2-135M-Instruct, served by `asearch engine serve` (a subprocess),
    writes every agent turn; the base QA, judges and solver stay scripted, so each scripted person gets an
    episode. SmolLM2 is far too small to follow the protocol: this checks that its turns travel token prompt ->
    chat messages -> server -> parser and that every turn and seed is accounted for (about 2 minutes)."""
    from asearch.engine.server.app import launch_engine_server

    sup, url = launch_engine_server(
        TOKENIZER, log_path=tmp_path / "engine.log", threads=1, max_seq_len=8192, served_model_name="smollm2"
    )
    try:
        served.script = Script(["stop"])  # the scripted agent is not asked: SmolLM2 is
        engine = {
            "kind": "openai",
            "model": "smollm2",
            "base_url": url,
            "tokenizer": TOKENIZER,
            "timeout_s": 600,
        }
        over = {"agent.engine": engine, "agent.max_turns": 6, "agent.max_new_tokens": 160}
        cfg = SynthConfig.model_validate(config(served.url, people=3, n_questions=3, concurrency=3, **over))
        summary = run_synthesis(cfg, tmp_path / "out", log=print)
    finally:
        sup.stop()
    print((tmp_path / "out" / "filter_report.md").read_text())
    attempts = [json.loads(line) for line in (tmp_path / "out" / "attempts.jsonl").open()]
    episodes = [a for a in attempts if a.get("agent")]
    assert summary.errors == 0 and len(attempts) == cfg.max_seeds and len(episodes) == 3
    for a in episodes:
        transcript = a["agent"]["transcript"]
        assert len(transcript) == a["agent"]["turns"] == sum(a["actions"].values())  # every turn is counted
        assert all(t["text"] for t in transcript)  # the model's own words came back through the server
        assert a["reason_code"] in ("accepted", "not_hard", "not_solvable", "no_stop")
    report = summary.report
    assert report["agent"]["episodes"] == 3 and report["models"]["agent"] == "chat:smollm2"
    assert sum(report["agent"]["actions"].values()) == sum(len(a["agent"]["transcript"]) for a in episodes)
