"""Configuration of a synthesis run: backend, rounds and gates, the solver behind the difficulty gate, dedup."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from asearch.config import Config
from asearch.engine.registry import EngineConfig
from asearch.engine.remote.openai_chat import flat_endpoint_keys
from asearch.net import RetryConfig
from asearch.synth.backend import SYNTH_BACKENDS, backend_kind

DIRECT_ANSWER_PROMPT = (
    "Answer the question from memory with only the answer: a name, a year or a number. "
    "Do not explain. If you do not know, make your best guess."
)


class EndpointConfig(Config):
    """An OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp server, a hosted API): the engine config of
    kind openai (`engine`: base_url, model, api_key_env, max_concurrency, timeout_s, retries, ...), and how
    synthesis samples from it. The older flat keys (base_url, model, ... beside temperature) still load, with
    a FutureWarning, as `engine.*`."""

    engine: EngineConfig = Field(
        description="The endpoint as engine kind openai (docs/engines-remote.md): base_url (API root with its "
        "version prefix), model (the name it serves), api_key_env, max_concurrency, timeout_s and the retry knobs."
    )
    temperature: float = Field(0.7, ge=0, description="Sampling temperature of the operator or gate prompts.")
    max_tokens: int = Field(256, ge=1, description="Reply budget per call.")
    json_mode: Literal["off", "json_object", "json_schema"] = Field(
        "off",
        description="Constrain replies server-side: json_object (any JSON) or json_schema (the exact keys each "
        "prompt asks for); vLLM and llama.cpp support both, and small models need them.",
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_keys_moved(cls, data: Any) -> Any:
        return flat_endpoint_keys(data, "llm.<endpoint>", {"max_concurrency": 8, "retries": 3})

    @model_validator(mode="after")
    def _openai_kind(self) -> EndpointConfig:
        if self.engine.kind != "openai":
            raise ValueError(f"an endpoint is engine kind openai (got engine.kind={self.engine.kind!r})")
        return self


class SolverConfig(Config):
    """The tool-less model whose k direct answers measure difficulty."""

    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The model, as for every command (docs/engines.md): kind inprocess (a local model decoded "
        "here) or openai (an OpenAI-compatible endpoint: base_url, model = its served name).",
    )
    k: int = Field(4, ge=1, description="Direct answers per question version.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the direct answers.")
    max_tokens: int = Field(24, ge=1, description="Tokens per direct answer (answers are short).")
    system_prompt: str = Field(DIRECT_ANSWER_PROMPT, description="What the solver is told.")

    @model_validator(mode="before")
    @classmethod
    def _engine_keys_moved(cls, data: Any) -> Any:
        """The older shape named the engine beside k (solver.kind=chat, solver.model=...): say where it went."""
        moved = {"kind", "model", "base_url", "threads", "max_batch", "max_concurrency", "timeout_s"}
        if isinstance(data, dict) and moved & set(data):
            keys = ", ".join(f"solver.{k}" for k in sorted(moved & set(data)))
            raise ValueError(
                f"{keys}: the solver's model is now solver.engine, the engine config of every command "
                "(solver.engine.kind=inprocess|openai, solver.engine.model, solver.engine.base_url, "
                "solver.engine.threads, ...; kind 'chat' is now 'openai'; docs/engines.md)"
            )
        return data

    @property
    def name(self) -> str:
        """How output rows name the solver's model: `inprocess:<model>`, `chat:<served name>`."""
        kind = "chat" if self.engine.kind == "openai" else self.engine.kind
        return f"{kind}:{self.engine.model}"


class GradingConfig(Config):
    """How a direct answer is judged correct."""

    method: Literal["em", "f1", "judge"] = Field(
        "f1",
        description="em: exact match; f1: token F1 >= f1_threshold; judge: an LLM judge (needs llm.judge).",
    )
    f1_threshold: float = Field(
        0.8, gt=0, le=1, description="f1: the F1 at which an answer counts as correct."
    )


class GateConfig(Config):
    """When an edit is kept and when a question is hard enough."""

    max_correct: int = Field(
        0, ge=0, description="Hard: at most this many of the solver's k direct answers are correct."
    )
    reject_easier: bool = Field(
        True, description="Reject an edit whose direct-answer accuracy is higher than the version it edits."
    )
    max_words: int = Field(60, ge=5, description="Quality: longer questions are rejected as not fluent.")
    max_facts: int = Field(8, ge=1, description="Quality (graph): at most this many constraints.")
    max_depth: int = Field(3, ge=1, description="Quality (graph): at most this many nested relations.")


class DedupConfig(Config):
    """Near-duplicate removal over the accepted questions (MinHash over word shingles, then exact Jaccard)."""

    enabled: bool = Field(
        True, description="Remove near-duplicates from questions.jsonl (counted in the report)."
    )
    threshold: float = Field(
        0.7, gt=0, le=1, description="Jaccard of word-bigram sets at which two questions clash."
    )
    same_answer_only: bool = Field(
        True, description="Only questions with the same (normalised) answer can be duplicates of each other."
    )
    num_perm: int = Field(128, ge=8, description="MinHash permutations.")
    bands: int | None = Field(
        None,
        ge=1,
        description="LSH bands (a divisor of num_perm); default: enough for 99.5% recall at the threshold.",
    )

    @model_validator(mode="after")
    def _bands_divide(self) -> DedupConfig:
        if self.bands is not None and self.num_perm % self.bands:
            raise ValueError(f"dedup.num_perm={self.num_perm} must be a multiple of dedup.bands={self.bands}")
        return self


class GraphBackendConfig(Config):
    """The knowledge-graph backend over the embedded world."""

    world_seed: int = Field(0, description="World seed (questions are about world:seed=<this>).")
    entities: int = Field(2000, ge=100, description="World size.")
    ask_attribute_share: float = Field(
        0.2, ge=0, le=1, description="Share of base questions asking an attribute (a year) instead of a name."
    )
    max_description_facts: int = Field(
        2, ge=1, description="FUZZ name->description adds up to this many facts to keep the answer unique."
    )


class LLMBackendConfig(Config):
    """The prompt-driven backend: every operator and gate is a chat call."""

    corpus: str = Field(
        "wiki10k", description="Seed pages and linked pages: wiki10k | world[:opts] | a jsonl path."
    )
    generator: EndpointConfig | None = Field(None, description="Writes base QAs and edits.")
    judge: EndpointConfig | None = Field(
        None,
        description="Quality and uniqueness gates (and grading when grading.method=judge); default: generator.",
    )
    page_chars: int = Field(2500, ge=200, description="Page text shown to the generator is cut to this.")
    max_answer_words: int = Field(8, ge=1, description="Base answers longer than this are rejected.")
    grounding: float = Field(
        0.8,
        gt=0,
        le=1,
        description="A statement counts as on its page when this share of its word pairs are there.",
    )
    max_aliases: int = Field(
        3,
        ge=0,
        description="Other spellings of the answer kept from the base reply (the paraphrase answers).",
    )
    max_candidates: int = Field(
        4, ge=1, description="Uniqueness: the solver's distinct wrong answers the judge checks, at most."
    )


class AgentBackendConfig(Config):
    """The agentic backend: after the base QA, an LLM chooses every step (search, access, inject, fuzz, stop)
    in the agent loop; the gates run after each edit and the agent reads their verdicts."""

    engine: EngineConfig | None = Field(
        None,
        description="The synthesis agent's model (docs/engines.md); it writes token prompts, so a chat endpoint "
        "is engine kind openai with the served model's tokenizer (engine.tokenizer). Default: llm.generator's "
        "endpoint as kind openai, the tokenizer named by its model.",
    )
    max_turns: int = Field(
        16, ge=1, description="LLM calls of the agent per seed; without an accepted stop by then: no_stop."
    )
    max_new_tokens: int = Field(
        384, ge=16, description="New tokens per agent turn (an edit is a JSON object)."
    )
    max_context_tokens: int = Field(
        8192,
        ge=256,
        description="Prompt + new tokens of one agent call; beyond it the episode ends (no_stop).",
    )
    temperature: float = Field(0.7, ge=0, description="Sampling temperature of the agent's turns.")
    search_topk: int = Field(5, ge=1, description="Results per search.")
    page_chars: int = Field(
        3000, ge=200, description="access shows a page this many characters at a time (the agent pages on)."
    )
    max_links: int = Field(
        8,
        ge=0,
        description="Pages linked from the seed page listed in the agent's brief (places to inject from).",
    )
    min_injections: int = Field(
        1,
        ge=0,
        description="Kept INJECT edits before a stop is accepted; an earlier stop is refused with the reason.",
    )
    tool_timeout_s: float = Field(
        600.0, gt=0, description="An edit's gates (judge and solver calls) must finish within this."
    )
    tool_solver_k: int = Field(
        1,
        ge=0,
        description="Episodes of a search agent (with tools) on the question the agent stops with; 0: none.",
    )
    tool_solver_style: str = Field(
        "search-r1",
        description="Agent style of that search agent (docs/agent.md): search-r1, asearcher, guided.",
    )
    tool_solver_max_turns: int = Field(8, ge=1, description="LLM calls of that search agent per episode.")
    min_tool_correct: int = Field(
        0,
        ge=0,
        description="Solvable: at least this many of the tool_solver_k episodes answer right (0: measured, not gated).",
    )

    @model_validator(mode="after")
    def _solver_can_pass(self) -> AgentBackendConfig:
        if self.min_tool_correct > self.tool_solver_k:
            raise ValueError(
                f"agent.min_tool_correct={self.min_tool_correct} can never be met with "
                f"agent.tool_solver_k={self.tool_solver_k} episodes"
            )
        from asearch.agent.styles import get_style  # the agent package is heavier than this config

        get_style(self.tool_solver_style)  # an unknown style names the known ones
        return self


class SynthConfig(Config):
    """One synthesis run (`asearch synth configs/synth-world.yaml --out DIR`)."""

    backend: SYNTH_BACKENDS.name_type() = Field(
        "graph",
        description="graph: the embedded world; llm: one prompt per operator; agent: an LLM picks each step "
        "(search, access, inject, fuzz, stop) in the agent loop; or any registered backend (synth/backend.py).",
    )
    seed: int = Field(0, description="Seeds the seed order and every operator's choices.")
    n_questions: int = Field(
        500,
        ge=1,
        description="At most this many distinct questions are written (seeds in flight are cut off).",
    )
    max_seeds: int | None = Field(None, ge=1, description="Try at most this many seeds (default: all).")
    rounds: int = Field(6, ge=0, description="T: edit rounds per question at most (agent: edits proposed).")
    min_edits: int = Field(2, ge=0, description="Kept edits a question needs before it may stop as hard.")
    p_inject: float = Field(
        0.6,
        ge=0,
        le=1,
        description="Chance a round tries INJECT first (else FUZZ first); the agent chooses itself.",
    )
    concurrency: int = Field(32, ge=1, description="Questions in the making at once.")
    id_prefix: str = Field("synth", description="Question ids are <prefix>-<seed index>.")
    out: Path | None = Field(None, description="Output directory (rerun with it to resume).")
    graph: GraphBackendConfig = Field(default_factory=GraphBackendConfig)
    llm: LLMBackendConfig = Field(default_factory=LLMBackendConfig)
    agent: AgentBackendConfig = Field(default_factory=AgentBackendConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)
    grading: GradingConfig = Field(default_factory=GradingConfig)
    gates: GateConfig = Field(default_factory=GateConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)

    @model_validator(mode="after")
    def _backend_ready(self) -> SynthConfig:
        kind = backend_kind(self.backend)
        if kind.uses_generator and self.llm.generator is None:
            raise ValueError(
                f"backend={self.backend!r} needs llm.generator (base_url and model of the generator endpoint)"
            )
        if self.grading.method == "judge" and not kind.judges and self.llm.judge is None:
            raise ValueError(
                f"grading.method='judge' with the {self.backend} backend needs llm.judge (the judge endpoint)"
            )
        return self

    def identity(self) -> dict:
        """The settings that decide what the questions are: a resumed run must match them."""
        d = self.model_dump(mode="json")
        for key in ("n_questions", "max_seeds", "concurrency", "out"):
            d.pop(key)
        speed = ("max_concurrency", "max_batch", "threads", "timeout_s", *RetryConfig.model_fields)  # how fast, not what
        endpoints = [e["engine"] for e in (d["llm"]["generator"], d["llm"]["judge"]) if e]
        for engine in (d["solver"]["engine"], d["agent"]["engine"] or {}, *endpoints):
            for key in speed:
                engine.pop(key, None)
        return d

    def agent_engine(self) -> EngineConfig:
        """The synthesis agent's engine: `agent.engine`, else the generator's endpoint as kind openai."""
        if self.agent.engine is not None:
            return self.agent.engine
        gen = self.llm.generator
        assert gen is not None, "backend agent needs llm.generator"  # _backend_ready checks it
        return gen.engine
