"""The demo's set-up work, spread over worker processes: each world's questions and search index, and
the scripted expert's episodes on each training world (token-exact, through the real loop and tools).

Each job is a pure function of its arguments, so the result does not depend on how many workers ran it.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from asearch.agent.loop import AgentConfig, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.engine.types import Tokenizer
from asearch.eval.datasets import QARecord
from asearch.rl.sft import trajectories_to_samples
from asearch.rl.trainer import Sample
from asearch.tools import ToolsConfig, ensure_index, open_tools

J = TypeVar("J")
R = TypeVar("R")
Mapper = Callable[[Callable[[J], R], Sequence[J]], list[R]]


def _init_worker() -> None:
    # two workers on two cores: neither may start thread pools of its own
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


@contextlib.contextmanager
def worker_pool(workers: int) -> Iterator[Mapper]:
    """A `map(fn, jobs) -> results in order` over `workers` processes (in this process when 1)."""
    if workers <= 1:
        yield lambda fn, jobs: [fn(j) for j in jobs]
        return
    # spawn, not fork: the parent has torch loaded, and a forked OpenMP runtime can hang
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker) as pool:
        yield lambda fn, jobs: list(pool.map(fn, jobs))


# ---------------------------------------------------------------------------- questions and indexes


def world_records(
    seed: int, entities: int, n: int, hops: tuple[int, ...], dataset: str, names: int | None = None,
    pages: str = "prose", name_answers: bool = False, phrasing: str = "natural",
) -> list[QARecord]:  # fmt: skip
    """`n` questions of world `seed` whose hops only go forward (the expert walks them page by page), split
    evenly over `hops` and ordered by hop count; with `name_answers`, only those answered by an entity;
    `phrasing` as `generate_questions`'s."""
    from asearch.eval.builtin import WorldSetSpec, world_questions

    spec = WorldSetSpec(
        seed=seed, n=n, hops=hops, entities=entities, names=names, pages=pages, forward=True,
        answers="entity" if name_answers else "any", phrasing=phrasing,
    )  # fmt: skip
    records = world_questions(spec, dataset=dataset)
    return [r for h in hops for r in records if r.metadata["hops"] == h]


@dataclass(frozen=True)
class WorldJob:
    """Questions of one world (the arguments of `world_records`), and its index built into the cache."""

    seed: int
    entities: int
    n: int
    hops: tuple[int, ...]
    dataset: str
    names: int | None
    pages: str
    name_answers: bool
    tools: ToolsConfig | None  # build the index these tools search (None: questions only)
    phrasing: str = "natural"


def prepare_world(job: WorldJob) -> list[QARecord]:
    records = world_records(job.seed, job.entities, job.n, job.hops, job.dataset, job.names, job.pages, job.name_answers, job.phrasing)
    if job.tools is not None:
        ensure_index(job.tools.corpus or "", job.tools.build, progress=False)
    return records


# ---------------------------------------------------------------------------- expert episodes


@dataclass(frozen=True)
class ExpertJob:
    """`episodes` expert episodes on one world, spread evenly over `records` (`spread`)."""

    records: list[QARecord]
    episodes: int
    tools: ToolsConfig
    tokenizer: Tokenizer
    agent: AgentConfig
    mistakes: ExpertMistakes
    seed: int  # the expert's own: its choices depend on (seed, prompt) only


@dataclass(frozen=True)
class ExpertMistakes:
    """How often the scripted expert errs (DemoConfig documents each); `reading` picks the expert that opens
    pages and reads them chunk by chunk (long pages) over the one that reads search results."""

    p_skip: float = 0.6
    p_wrong: float = 0.0
    skip_at: str = "every"
    reading: bool = False
    p_stop: float = 0.1
    p_distract: float = 0.1
    p_skim: float = 0.0


def expert_engine(tokenizer: Tokenizer, records: Sequence[QARecord], mistakes: ExpertMistakes, seed: int) -> ScriptedEngine:
    """The scripted expert (with its deliberate mistakes) for `records`, as an engine the agent loop drives."""
    from asearch.agent.expert import ReadingExpert, WorldExpert, plan_from_record, reading_plan_from_record

    m = mistakes
    if m.reading:
        plans = {r.question: reading_plan_from_record(r.model_dump()) for r in records}
        return ScriptedEngine(tokenizer, ReadingExpert(plans, p_skip=m.p_skip, p_stop=m.p_stop, p_distract=m.p_distract, p_skim=m.p_skim, seed=seed))
    world_plans = {r.question: plan_from_record(r.model_dump()) for r in records}
    return ScriptedEngine(tokenizer, WorldExpert(world_plans, p_skip=m.p_skip, p_wrong=m.p_wrong, seed=seed, skip_at=m.skip_at))


def expert_episodes(job: ExpertJob) -> list[list[Sample]]:
    """Per episode, its training samples (one per segment with generated tokens), in episode order."""
    engine = expert_engine(job.tokenizer, job.records, job.mistakes, job.seed)

    async def go():
        sem = asyncio.Semaphore(64)
        async with open_tools(job.tools, progress=False) as tools:

            async def one(i: int):
                async with sem:
                    return await run_episode(engine, job.tokenizer, tools, job.records[i].question, job.agent)

            return await asyncio.gather(*(one(i) for i in spread(len(job.records), job.episodes)))

    trajectories = asyncio.run(go())
    return [trajectories_to_samples([t]) for t in trajectories]


def spread(items: int, picks: int) -> list[int]:
    """`picks` indexes into `items` things in order, each thing picked floor or ceil(picks / items) times.

    Records come grouped by hop count, so taking the first `picks` of them (fewer picks than records) would
    leave the longest questions out of SFT altogether.
    """
    return [j * items // picks for j in range(picks)] if items else []


def interleave(per_world: Sequence[Sequence[R]]) -> list[R]:
    """Episode i of the whole run is episode i // W of world i % W (W worlds): the worlds take turns."""
    out: list[R] = []
    for j in range(max((len(x) for x in per_world), default=0)):
        out += [x[j] for x in per_world if j < len(x)]
    return out
