"""The seam between the synthesis pipeline and its backends (knowledge graph, LLM, agentic LLM, any registered
one): drafts, gate results, and the registry `SynthConfig.backend` names them by.

A backend proposes (seed -> base QA, INJECT, FUZZ) and checks (quality, uniqueness); the pipeline
owns the loop, the difficulty gate, stopping, concurrency and bookkeeping, so every backend shares it.
A backend is one module of `asearch.synth` whose build function registers it:

    @register_synth_backend("graph")
    def build_graph_backend(cfg: SynthConfig) -> GraphBackend: ...
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from asearch.registry import Registry
from asearch.synth.records import Statement, Uniqueness

EditAction = Literal["inject", "fuzz"]


@dataclass(frozen=True, slots=True)
class Seed:
    """Where one question starts: a stable key (resume skips done keys), a url and a label for humans."""

    index: int  # position in the run's seed order
    key: str  # entity id or page url
    url: str
    title: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "key": self.key, "url": self.url, "title": self.title}


@dataclass(slots=True)
class Draft:
    """A question in the making. `answer` never changes after the base QA; `state` is the backend's own."""

    question: str
    answers: list[str]  # canonical first, then accepted variants
    statements: list[Statement]
    state: Any = None
    paraphrases: list[str] = field(default_factory=list)
    note: str = ""  # what the last edit did, for the edit history

    @property
    def answer(self) -> str:
        return self.answers[0]


@dataclass(frozen=True, slots=True)
class GateResult:
    passed: bool
    reason: str = ""


class SynthBackend(Protocol):
    """What the pipeline needs from a backend. Operators return None when they cannot apply."""

    name: str
    corpus: str  # the corpus spec a search agent needs to answer the questions
    candidates_for_uniqueness: (
        bool  # True: uniqueness checks the solver's wrong answers (runs after difficulty)
    )

    def seeds(self) -> list[Seed]:
        """Every seed of the run in a fixed order (the pipeline takes them in this order)."""
        ...

    def models(self) -> dict[str, str]:
        """Names of the generator (and judge) behind the operators and gates, for the output rows."""
        ...

    async def base(self, seed: Seed, rng: random.Random) -> Draft | None: ...

    async def edit(self, draft: Draft, action: EditAction, rng: random.Random) -> Draft | None: ...

    async def quality(self, before: Draft | None, after: Draft) -> GateResult: ...

    async def uniqueness(self, draft: Draft, wrong_answers: list[str]) -> Uniqueness: ...

    async def aclose(self) -> None: ...


BuildBackend = Callable[[Any], SynthBackend]  # (SynthConfig) -> the backend


@dataclass(frozen=True)
class BackendKind:
    """A registered synthesis backend: how it is built from a `SynthConfig`, and what the run around it needs."""

    name: str
    build: BuildBackend
    uses_generator: bool  # its operators call an LLM: llm.generator is required
    agentic: bool  # an LLM agent picks each step: seeds run in the agent loop (synth/agentic.py), agent reason codes
    judges: bool  # it has a judge of its own: grading.method=judge needs no llm.judge


SYNTH_BACKENDS: Registry[BackendKind] = Registry(
    "synth backend", "asearch.synth", wants=lambda source: "@register_synth_backend(" in source
)


def register_synth_backend(
    name: str, *, uses_generator: bool = False, agentic: bool = False, judges: bool = False
) -> Callable[[BuildBackend], BuildBackend]:
    """Make the decorated `build(cfg: SynthConfig) -> SynthBackend` the backend `backend=<name>` picks."""

    def add(build: BuildBackend) -> BuildBackend:
        SYNTH_BACKENDS.add(name, BackendKind(name, build, uses_generator, agentic, judges), origin=build)
        return build

    return add


def backend_kind(name: str) -> BackendKind:
    """The registration of backend `name`; a ConfigError naming the nearest one if there is none."""
    return SYNTH_BACKENDS.get(name)
