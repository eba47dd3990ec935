"""The difficulty gate's solver: a model answering without tools, k times, and the grader of its answers.

`build_solver` makes the engine `solver.engine` names through the engine registry: `ChatDirectSolver`
asks an OpenAI-compatible endpoint (kind openai) the chat messages as they are; `EngineDirectSolver`
runs any other engine (the in-process one, SmolLM2 by default). Both send a per-answer seed derived from the question, so
a rerun asks the same questions the same way. `Grader` scores answers by EM, F1 or an LLM judge.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from asearch.metrics.qa import exact_match, f1
from asearch.synth.config import EndpointConfig, GradingConfig, SolverConfig

if TYPE_CHECKING:
    from asearch.engine.types import Engine

_MAX_ANSWER_CHARS = 200
_PREFIX = re.compile(r"^\s*(?:final answer|answer|a)\s*[:\-]\s*", re.I)
_SPECIAL = re.compile(r"<\|[^|>]*\|>|</?s>")


def clean_answer(text: str) -> str:
    """The first line of a reply, without special tokens, an "Answer:" prefix or a trailing full stop."""
    text = _SPECIAL.sub("", text or "").strip()
    line = next((x for x in text.splitlines() if x.strip()), "")
    line = _PREFIX.sub("", line).strip().strip('"').strip()
    if line.endswith(".") and not line.endswith(".."):
        line = line[:-1]
    return line[:_MAX_ANSWER_CHARS]


def answer_seed(question: str, j: int, run_seed: int) -> int:
    """A stable per-(question, answer index) sampling seed (Python's hash() is salted per process)."""
    digest = hashlib.sha256(f"{run_seed}\x00{j}\x00{question}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class DirectSolver(Protocol):
    """Answers a question from memory; `name` identifies the model in output rows."""

    name: str

    async def answers(self, question: str, k: int, seed: int) -> list[str]: ...

    async def aclose(self) -> None: ...


class ChatDirectSolver:
    """k chat completions (sent concurrently) against an OpenAI-compatible endpoint."""

    def __init__(self, client: Any, cfg: SolverConfig):
        self.client, self.cfg = client, cfg
        self.name = cfg.name

    def messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.cfg.system_prompt}, {"role": "user", "content": question}]

    async def answers(self, question: str, k: int, seed: int) -> list[str]:
        async def one(j: int) -> str:
            reply = await self.client.chat(
                self.messages(question),
                temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
                seed=answer_seed(question, j, seed),
            )
            return clean_answer(reply.text)

        return list(await asyncio.gather(*(one(j) for j in range(k))))

    async def aclose(self) -> None:
        await self.client.aclose()


class EngineDirectSolver:
    """k generations from an `Engine` that takes chat messages (the in-process engine with its tokenizer)."""

    def __init__(self, engine: Engine, cfg: SolverConfig, name: str | None = None):
        self.engine, self.cfg = engine, cfg
        self.name = name or cfg.name
        tok = getattr(engine, "tokenizer", None)
        self._stop_ids = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []

    async def answers(self, question: str, k: int, seed: int) -> list[str]:
        from asearch.engine.types import GenerateRequest, SamplingParams

        messages = [
            {"role": "system", "content": self.cfg.system_prompt},
            {"role": "user", "content": question},
        ]

        async def one(j: int) -> str:
            sampling = SamplingParams(
                temperature=self.cfg.temperature,
                max_new_tokens=self.cfg.max_tokens,
                stop=["\n"],
                stop_token_ids=list(self._stop_ids),
                seed=answer_seed(question, j, seed),
            )
            response = await self.engine.generate(GenerateRequest(messages=messages, sampling=sampling))
            return clean_answer(response.text)

        return list(await asyncio.gather(*(one(j) for j in range(k))))

    async def aclose(self) -> None:
        await self.engine.close()


def build_solver(cfg: SolverConfig) -> DirectSolver:
    """The configured solver, its engine built through the registry (a local model is loaded here)."""
    from asearch.engine.registry import make_engine
    from asearch.engine.remote.openai_chat import OpenAIChatEngine

    if cfg.engine.kind == "inprocess":
        import torch

        torch.set_num_threads(cfg.engine.options.threads)  # this process's own torch work, like the engine's
    engine = make_engine(cfg.engine)
    if isinstance(engine, OpenAIChatEngine):  # the endpoint answers the messages as they are (no stop string)
        return ChatDirectSolver(engine.client, cfg)
    return EngineDirectSolver(engine, cfg)


def chat_client(cfg: EndpointConfig) -> Any:
    """An `OpenAIChatClient` for an endpoint config (its engine, kind openai)."""
    from asearch.engine.remote.openai_chat import chat_client as engine_chat_client

    return engine_chat_client(cfg.engine)


@dataclass(slots=True)
class DirectResult:
    """The solver's answers to one question version and how many were judged correct."""

    answers: list[str]
    correct: list[bool | None]  # None: the judge failed on that answer (counted as not correct)
    judge_errors: int = 0
    wrong: list[str] = field(default_factory=list)  # distinct answers judged incorrect

    @property
    def n_correct(self) -> int:
        return sum(1 for c in self.correct if c)

    @property
    def accuracy(self) -> float:
        return self.n_correct / len(self.correct) if self.correct else 0.0


class Grader:
    """Decides whether a direct answer is right: EM, F1 >= threshold, or an LLM judge."""

    def __init__(self, cfg: GradingConfig, judge: Any = None, *, owns_client: bool = False):
        if cfg.method == "judge" and judge is None:
            raise ValueError("grading.method='judge' needs a judge")
        self.cfg, self.judge, self._owns_client = cfg, judge, owns_client

    async def aclose(self) -> None:
        """Close the judge's client when this grader made it (a backend's judge is closed by the backend)."""
        if self._owns_client and self.judge is not None:
            await self.judge.client.aclose()

    @property
    def name(self) -> str:
        return f"f1>={self.cfg.f1_threshold:g}" if self.cfg.method == "f1" else self.cfg.method

    async def grade(self, question: str, answers: Sequence[str], golds: Sequence[str]) -> DirectResult:
        correct: list[bool | None]
        errors = 0
        if self.cfg.method == "em":
            correct = [exact_match(a, golds) == 1.0 for a in answers]
        elif self.cfg.method == "f1":
            correct = [f1(a, golds) >= self.cfg.f1_threshold for a in answers]
        else:
            verdicts = await asyncio.gather(*(self.judge.judge(question, a, golds) for a in answers))
            correct = [v.correct for v in verdicts]
            errors = sum(1 for v in verdicts if v.correct is None)
        wrong = list(dict.fromkeys(a for a, c in zip(answers, correct, strict=True) if c is False and a))
        return DirectResult(list(answers), correct, errors, wrong)
