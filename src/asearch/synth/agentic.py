"""The agentic backend: after the base QA, an LLM chooses every step of the synthesis in the agent loop.

Synthesis is one more rollout workflow: `SynthAgentWorkflow.arun_episode(engine, seed, seed=...)` runs
`asearch.agent.loop.run_episode` with five tools and returns the trajectory of an accepted question, or
None (the cause counted in `rejected`). Per seed:

    seed page --[base] prompt--> base QA --gates--> brief --agent loop, one action per turn:
      <search>keywords</search>, <access>url</access>        read pages (the corpus's search and access tools)
      <inject>{"question", "statement", "url"}</inject>     one more fact; its statement must be on that page
      <fuzz>{"question", "blurred"}</fuzz>                   one detail blurred
      <stop>why</stop>                                       submit the question as it stands

Every inject and fuzz is a proposed edit that goes through the same gates as the other backends
(`Synthesizer.gates`: quality, with each statement checked on its page, then difficulty, then uniqueness);
the agent reads the verdict and the solver's score, so it decides what to do next and when to stop. A stop
before `agent.min_injections` kept injections (or `min_edits` kept edits) is refused with the reason and the
episode goes on; a stop on a question the tool-less solver still answers is rejected as too easy
(`not_hard`); then a search agent with the same tools answers it `agent.tool_solver_k` times (difficulty
with tools, recorded; gated by `agent.min_tool_correct`). An episode that ends without an accepted stop
is rejected as `no_stop`. Uniqueness is the LLM backend's check of the solver's wrong answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asearch.agent.loop import AgentConfig, run_episode
from asearch.agent.trajectory import Trajectory
from asearch.agent.workflow import EpisodeItem, SearchAgentWorkflow
from asearch.synth.backend import Draft, EditAction, Seed, register_synth_backend
from asearch.synth.config import SynthConfig
from asearch.synth.llm_backend import LLMBackend, answer_changed, json_reply, split_links
from asearch.synth.records import Statement, Uniqueness
from asearch.synth.solver import DirectResult, answer_seed
from asearch.synth.synthesizer import Attempt, Synthesizer, edit_step
from asearch.tools import EpisodeContext, Observation, Tool, ToolArgumentError, close_all

if TYPE_CHECKING:
    from asearch.engine.types import Engine, Tokenizer

# The role marker opens the prompt so logs (and scripted test servers) can tell the calls apart.
AGENT_PROMPT = """[synth-agent] You make a quiz question hard to answer from memory while it keeps exactly \
one right answer. You get the question, its answer and the facts it is built from. Each turn, you may \
think briefly inside <think></think>, then write exactly one action:
{tools}
After each inject or fuzz you are told whether the checks kept it and how many direct answers (from \
memory, without searching) were still right. Inject at least one fact you read, and stop once no direct \
answer is right."""

INJECT_DESCRIPTION = (
    '<inject>{"question": "...", "statement": "...", "url": "..."}</inject> rewrites the question with one '
    'more fact: copy "statement" word for word from the page at "url" (a page you opened or a search '
    "result), e.g. replace a name in the question by what the statement says about it; the answer stays the same"
)
FUZZ_DESCRIPTION = (
    '<fuzz>{"question": "...", "blurred": "..."}</fuzz> blurs one detail of the question (a year becomes a '
    "decade, a name a description, a number a range); the answer stays the same"
)
STOP_DESCRIPTION = "<stop>why it is hard now</stop> submits the question as it stands and ends the task"

EDIT_KEYS: dict[str, tuple[str, ...]] = {"inject": ("question", "statement", "url"), "fuzz": ("question",)}
ACTIONS = ("search", "access", "inject", "fuzz", "stop")


def episode_seed(run_seed: int, key: str) -> int:
    """The sampling seed of one seed's episode: stable across runs and concurrency, within 63 bits."""
    return int.from_bytes(hashlib.sha256(f"synth-agent/{run_seed}/{key}".encode()).digest()[:8], "big") >> 1


@dataclass(slots=True)
class SynthSession:
    """One seed in the making: the question as it stands with its gate results, and what the agent did."""

    seed: Seed
    engine: Engine
    attempt: Attempt
    current: Draft
    result: DirectResult  # the tool-less solver on `current`
    uniqueness: Uniqueness
    proposed: int = 0  # inject + fuzz calls that reached the gates (the `rounds` budget)
    kept: Counter[str] = field(default_factory=Counter)  # kept edits by action
    refusals: list[str] = field(default_factory=list)  # stops and edits refused, with the reason
    bad_arguments: Counter[str] = field(default_factory=Counter)  # by tool: arguments it could not read
    outcome: tuple[str, str] | None = None  # (reason code, reason) once a stop is accepted or rejected
    tool_result: DirectResult | None = None  # the search agent (with tools) on the final question

    @property
    def kept_edits(self) -> int:
        return sum(self.kept.values())


class EditTool:
    """`inject` or `fuzz` for one session: the agent's JSON becomes a draft, the gates judge it."""

    argument_hint = "JSON object"

    def __init__(self, name: EditAction, session: SynthSession, flow: SynthAgentWorkflow):
        self.name, self.session, self.flow = name, session, flow

    @property
    def description(self) -> str:
        return INJECT_DESCRIPTION if self.name == "inject" else FUZZ_DESCRIPTION

    def parse(self, raw: str) -> dict[str, Any]:
        keys = EDIT_KEYS[self.name]
        obj = json_reply(raw, keys)
        if obj is None or not all(isinstance(obj[k], str) and obj[k].strip() for k in keys):
            self.session.bad_arguments[self.name] += 1
            fields = ", ".join(f'"{k}"' for k in keys)
            raise ToolArgumentError(f"{self.name} needs one JSON object with the strings {fields}")
        return obj

    async def call(self, args: dict[str, Any], episode: EpisodeContext) -> Observation:
        s, cfg = self.session, self.flow.cfg
        if s.proposed >= cfg.rounds:
            return _refused(s, f"no edits left ({cfg.rounds} proposed, rounds={cfg.rounds}): stop now")
        s.proposed += 1
        draft = self._draft(args, episode)
        step = edit_step(s.proposed, self.name, s.current, draft)
        s.attempt.history.append(step)
        verdict = await self.flow.synth.gates(s.result, draft, step, s.attempt, before=s.current)
        if verdict is not None:
            step.kept = True
            s.current, (s.result, s.uniqueness) = draft, verdict
            s.kept[self.name] += 1
        return Observation(self.flow.verdict_text(s, step.rejected_by, step.reason))

    def _draft(self, args: dict[str, Any], episode: EpisodeContext) -> Draft:
        """The proposed version; a problem found before the gates (an unknown page) fails quality."""
        s, backend = self.session, self.flow.backend
        before = s.current
        problem = answer_changed(args, before.answer)
        statements, urls = list(before.statements), list(before.state["urls"])
        note = f"fuzz: {str(args.get('blurred', '')).strip()[:200]}"
        if self.name == "inject":
            url = args["url"].strip()
            page = _episode_page(episode, url) or backend.find_page(url)
            if page is None:
                problem = (
                    problem or f"unknown page {url!r}: inject facts from pages you opened or saw in results"
                )
            else:
                backend.remember(page)
                url = page.url
            statements.append(Statement(args["statement"].strip(), url))
            urls.append(url)
            note = f"inject from {url}"
        return Draft(
            question=args["question"].strip(), answers=list(before.answers), statements=statements,
            state={"urls": urls, "problem": problem}, paraphrases=list(before.paraphrases), note=note,
        )  # fmt: skip


class StopTool:
    """`stop` for one session: refused before enough kept edits, else the final checks decide."""

    name = "stop"
    argument_hint = "reason"
    description = STOP_DESCRIPTION

    def __init__(self, session: SynthSession, flow: SynthAgentWorkflow):
        self.session, self.flow = session, flow

    def parse(self, raw: str) -> str:
        return raw.strip()

    async def call(self, args: str, episode: EpisodeContext) -> Observation:
        s, cfg = self.session, self.flow.cfg
        if s.kept["inject"] < cfg.agent.min_injections:
            return _refused(
                s, f"no fact injected yet ({s.kept['inject']} kept, agent.min_injections="
                f"{cfg.agent.min_injections}): read a page, then <inject> a fact from it",
            )  # fmt: skip
        if s.kept_edits < cfg.min_edits:
            return _refused(s, f"{s.kept_edits} kept edits < min_edits={cfg.min_edits}: edit more first")
        s.outcome = await self.flow.final_checks(s)
        code, reason = s.outcome
        verdict = "Accepted" if code == "accepted" else "Rejected"
        return Observation(f"{verdict}: {reason}", metadata={"ends_episode": True})


def _refused(s: SynthSession, reason: str) -> Observation:
    """A call the agent may not make now: it reads why and the episode goes on."""
    s.refusals.append(reason)
    text = f"Refused: {reason}"
    return Observation(text, metadata={"refused": True}, error=text)


def _episode_page(episode: EpisodeContext, url: str) -> Any:
    from asearch.retrieval.protocol import url_variants

    keys = set(url_variants(url))
    return next((p for p in reversed(episode.pages) if p.url in keys), None)


class SynthAgentWorkflow:
    """Synthesis as a rollout workflow: one seed's synthesis agent episode on the engine it is handed.

    `synth` brings the backend (base QA prompt, quality and uniqueness checks), the tool-less solver and
    the grader; `tools` are the reading tools (search, access) over the seed corpus, which the search agent
    behind `agent.tool_solver_k` uses too. `rejected` counts rejected seeds by reason code."""

    def __init__(
        self,
        synth: Synthesizer,
        tokenizer: Tokenizer,
        tools: Mapping[str, Tool],
        cfg: SynthConfig,
        *,
        agent_name: str = "agent",
    ):
        if not isinstance(synth.backend, LLMBackend):
            raise TypeError("the agent backend writes base QAs and runs its checks with an LLMBackend")
        self.synth, self.backend, self.cfg = synth, synth.backend, cfg
        self.tokenizer, self.tools, self.agent_name = tokenizer, tools, agent_name
        a = cfg.agent
        style = {"name": "synth-agent", "system_prompt": AGENT_PROMPT, "user_template": "{question}",
                 "actions": ACTIONS, "reading_turns": False}  # fmt: skip
        self.agent_cfg = AgentConfig(
            style="search-r1", style_options=style, max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
            max_context_tokens=a.max_context_tokens, temperature=a.temperature, tool_timeout_s=a.tool_timeout_s,
        )  # fmt: skip
        solver_cfg = AgentConfig(
            style=a.tool_solver_style, max_turns=a.tool_solver_max_turns, max_new_tokens=a.max_new_tokens,
            max_context_tokens=a.max_context_tokens, temperature=a.temperature,
        )  # fmt: skip
        self.tool_solver = SearchAgentWorkflow(tokenizer, tools, solver_cfg)
        self.rejected: Counter[str] = Counter()

    async def arun_episode(self, engine: Engine, item: Seed, *, seed: int | None = None) -> Trajectory | None:
        """The accepted question's trajectory (`metadata["question"]` is its output row), or None."""
        attempt, traj = await self.run_seed(engine, item, seed=seed)
        if attempt.question is None or traj is None:
            self.rejected[attempt.reason_code] += 1
            return None
        traj.metadata["question"] = attempt.question.to_row()
        return traj

    async def run_seed(
        self, engine: Engine, item: Seed, *, seed: int | None = None
    ) -> tuple[Attempt, Trajectory | None]:
        """The seed's attempt record (accepted or rejected with its reason) and the agent's trajectory (None
        when the base QA failed and no episode ran)."""
        t0 = time.perf_counter()
        attempt = Attempt(item, "rejected", "", "", [])
        rng = random.Random(f"asearch-synth/{self.cfg.seed}/{item.key}")
        started = await self.synth.start(item, rng, attempt)
        if started is None:
            attempt.elapsed_s = time.perf_counter() - t0
            return attempt, None
        session = SynthSession(item, engine, attempt, *started)
        tools = {**self.tools, "inject": EditTool("inject", session, self), "fuzz": EditTool("fuzz", session, self),
                 "stop": StopTool(session, self)}  # fmt: skip
        traj = await run_episode(
            engine, self.tokenizer, tools, self.brief(session), self.agent_cfg, seed=seed,
            trajectory_id=f"synth-{item.index}-{random.getrandbits(32):08x}", metadata={"seed": item.key},
        )  # fmt: skip
        self._record(session, traj)
        attempt.elapsed_s = time.perf_counter() - t0
        return attempt, traj

    def brief(self, s: SynthSession) -> str:
        """The agent's first message: the base QA, its facts, the seed page's links, the solver's score."""
        links = []
        page = self.backend.page(s.seed.url)
        if page is not None:
            links = split_links(page.contents)[1][: self.cfg.agent.max_links]
        lines = [
            f"Seed page: {s.seed.title} ({s.seed.url})",
            f"Question: {s.current.question}",
            f"Answer: {s.current.answer}",
            "Facts it uses:",
            *(f"- {st.text} (source: {st.url})" for st in s.current.statements),
        ]
        if links:
            lines += ["Pages linked from the seed page:", *(f"- {title}: {url}" for title, url in links)]
        lines.append(self._score(s) + " Make the question hard, then stop.")
        return "\n".join(lines)

    def _score(self, s: SynthSession) -> str:
        r, gates = s.result, self.cfg.gates
        return (
            f"Without searching, {r.n_correct} of {len(r.correct)} direct answers are right "
            f"(hard: at most {gates.max_correct})."
        )

    def verdict_text(self, s: SynthSession, gate: str | None, reason: str) -> str:
        """What the agent reads after an edit: kept or rejected (by which gate, why), the question now."""
        left = self.cfg.rounds - s.proposed
        head = "Kept." if gate is None else f"Rejected by the {gate} check: {reason}"
        return (
            f"{head}\nThe question is now: {s.current.question}\n{self._score(s)} "
            f"Kept edits: {s.kept_edits} ({s.kept['inject']} inject). Edits left: {left}."
        )

    async def final_checks(self, s: SynthSession) -> tuple[str, str]:
        """At an allowed stop: too easy without tools, then the search agent with tools; (code, reason)."""
        r, a = s.result, self.cfg.agent
        if not self.synth.is_hard(r):
            return "not_hard", (
                f"too easy: {r.n_correct}/{len(r.correct)} direct answers right at stop "
                f"(hard = at most {self.cfg.gates.max_correct})"
            )
        if a.tool_solver_k:
            s.tool_result = await self.solve_with_tools(s.engine, s.current)
            s.attempt.judge_errors += s.tool_result.judge_errors
            n = s.tool_result.n_correct
            if n < a.min_tool_correct:
                return "not_solvable", (
                    f"the search agent answered {n}/{a.tool_solver_k} right with tools "
                    f"(agent.min_tool_correct={a.min_tool_correct})"
                )
        return "accepted", f"hard after {s.kept_edits} kept edits"

    async def solve_with_tools(self, engine: Engine, draft: Draft) -> DirectResult:
        """`agent.tool_solver_k` search-agent episodes on the question, graded like the direct answers."""
        item = EpisodeItem(id="synth-tool-solver", question=draft.question, golds=tuple(draft.answers))

        async def one(j: int) -> str:
            seed = answer_seed(draft.question, j, self.cfg.seed)
            traj = await self.tool_solver.arun_episode(engine, item, seed=seed)
            return (traj.answer or "") if traj is not None else ""

        answers = list(await asyncio.gather(*(one(j) for j in range(self.cfg.agent.tool_solver_k))))
        return await self.synth.grader.grade(draft.question, answers, draft.answers + draft.paraphrases)

    def _record(self, s: SynthSession, traj: Trajectory) -> None:
        """The attempt's outcome, its agent record (actions by kind, refusals, transcript) and its row."""
        attempt = s.attempt
        code, reason = s.outcome or (
            "no_stop",
            f"the agent did not stop with a question ({traj.finish} after {traj.num_turns} turns)",
        )
        attempt.status = "accepted" if code == "accepted" else "rejected"
        attempt.reason_code, attempt.reason = code, reason
        attempt.actions = dict(Counter((t.action or "malformed") if t.parse_error is None else "malformed"
                                       for t in traj.turns if t.kind == "act"))  # fmt: skip
        attempt.agent = {
            "finish": traj.finish,
            "turns": traj.num_turns,
            "refusals": list(s.refusals),
            "bad_arguments": dict(s.bad_arguments),
            "parse_errors": traj.counters.get("parse_errors", 0),
            "transcript": [_turn_record(t) for t in traj.turns],
        }
        if s.tool_result is not None:
            attempt.agent["tool_solver"] = {
                "answers": s.tool_result.answers,
                "accuracy": s.tool_result.accuracy,
            }
        attempt.structure = {
            "statements": len(s.current.statements),
            "words": len(s.current.question.split()),
        }
        if code == "accepted":
            tool_accuracy = s.tool_result.accuracy if s.tool_result is not None else None
            attempt.question = self.synth.question(
                s.seed, s.current, attempt, s.uniqueness, s.result, tool_accuracy
            )
            attempt.question.models["agent"] = self.agent_name


def _turn_record(turn: Any) -> dict[str, Any]:
    """One agent turn for the attempts log: what it did and what it read back (cut to 400 characters)."""
    return {
        "action": turn.action if turn.parse_error is None else "malformed",
        "text": turn.output_text[:400],
        "observation": (turn.observation or "")[:400],
        "error": turn.parse_error or turn.tool_error,
    }


class AgentSynthesizer:
    """The run's per-seed step for backend agent: the workflow's episode on the agent's engine."""

    def __init__(self, workflow: SynthAgentWorkflow, engine: Engine, closers: list[Any]):
        self.workflow, self.engine, self._closers = workflow, engine, closers

    def models(self) -> dict[str, str]:
        return {**self.workflow.synth.models(), "agent": self.workflow.agent_name}

    async def synthesize(self, seed: Seed) -> Attempt:
        sampling_seed = episode_seed(self.workflow.cfg.seed, seed.key)
        attempt, _ = await self.workflow.run_seed(self.engine, seed, seed=sampling_seed)
        return attempt

    async def aclose(self) -> None:
        await close_all(self._closers)


def build_agent_synthesizer(cfg: SynthConfig, synth: Synthesizer, *, engine: Any = None) -> AgentSynthesizer:
    """The agent's engine (`engine`, else built from `cfg.agent_engine()`) and its reading tools over
    `llm.corpus`; they are closed by `AgentSynthesizer.aclose` (an engine passed in is the caller's)."""
    from asearch.engine.registry import build_engine
    from asearch.tools import ToolsConfig, build_tools

    a = cfg.agent
    tools_cfg = ToolsConfig.model_validate({
        "corpus": cfg.llm.corpus,
        "search": {"topk": a.search_topk},
        "access": {"chunk_chars": a.page_chars, "chunks_per_call": 1},
    })  # fmt: skip
    tools, closers = build_tools(tools_cfg, progress=False)
    engine_cfg = cfg.agent_engine()
    if engine is None:
        engine, tokenizer = build_engine(engine_cfg)
        closers = [*closers, engine.close]
        name = f"{'chat' if engine_cfg.kind == 'openai' else engine_cfg.kind}:{engine_cfg.model}"
    else:
        tokenizer, name = engine.tokenizer, f"given:{type(engine).__name__}"
    workflow = SynthAgentWorkflow(synth, tokenizer, tools, cfg, agent_name=name)
    return AgentSynthesizer(workflow, engine, closers)


@register_synth_backend("agent", uses_generator=True, agentic=True, judges=True)
def build_agent_backend(cfg: SynthConfig) -> LLMBackend:
    """The LLM backend writes the base QA and runs the gates; the agent loop (`build_agent_synthesizer`) does the rest."""
    return LLMBackend(cfg.llm, cfg.gates, cfg.seed)
