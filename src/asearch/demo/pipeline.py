"""`asearch demo`: world -> tokenizer + tiny model -> expert SFT -> asynchronous RL -> held-out eval, plot, report.

Everything is real: BM25 top-k over all passages of the world (distractors come back), the agent
loop, the in-process engine, the decoupled-PPO trainer. Held-out questions come from another world
(another seed: other facts under the same pool of names), so accuracy there measures search, not memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, ValidationError, model_validator

from asearch.agent.expert import WORLD_STYLE
from asearch.agent.loop import AgentConfig
from asearch.agent.workflow import SearchAgentWorkflow
from asearch.config import Config
from asearch.demo.worlds import (
    ExpertJob,
    ExpertMistakes,
    Mapper,
    WorldJob,
    expert_engine,
    expert_episodes,
    interleave,
    prepare_world,
    worker_pool,
)
from asearch.engine.registry import EngineConfig
from asearch.errors import ConfigError
from asearch.eval.datasets import QARecord, load_dataset
from asearch.eval.horizon import episode_row, horizon_summary, read_episode_rows, write_episode_rows
from asearch.eval.runner import EpisodeScores, evaluate_workflow
from asearch.files import atomic_write_json, write_jsonl
from asearch.launch.train import HeldoutConfig, TrainConfig, train
from asearch.metrics.reward import RewardConfig
from asearch.rl.controller import ControllerConfig
from asearch.rl.loss import LossConfig
from asearch.rl.sft import SFTConfig, sft
from asearch.rl.trainer import OptimConfig, Sample, TrainerConfig
from asearch.runs import RunDir
from asearch.tools import ToolsConfig, open_tools

# The demo agent: the expert's prompt format, no system prompt (the tiny model learns the protocol from SFT).
DEMO_STYLE = WORLD_STYLE
Log = Callable[[str], None]


def _demo_rl() -> TrainConfig:
    """The demo's RL stage. Paths are relative to the demo's run directory; `seed`, `tools.corpus` and
    `heldout.tools` follow the demo's seed and worlds (`DemoConfig._derive_rl`)."""
    # no access tool here, so urls would only cost tokens; compact results keep every name after a space,
    # so it is the same tokens wherever it appears (docs/demo.md)
    tools = ToolsConfig(search={"topk": 2, "max_doc_chars": 400, "show_urls": False, "compact": True}, access=None)
    return TrainConfig(
        out=Path("rl"), model="model-sft", data="data/rl.jsonl", trainer_threads=1,
        engine=EngineConfig(kind="inprocess", model="model-sft", threads=1, max_batch=128, max_seq_len=1024),
        tools=tools, corpus_from_data=True,
        agent=AgentConfig(
            style="search-r1", style_options=DEMO_STYLE, max_turns=8, max_new_tokens=48, max_context_tokens=1024,
            temperature=0.7,  # the SFT policy at 1.0 is too diffuse to earn rewards (docs/demo.md)
        ),
        reward=RewardConfig(metric="em", format_gate=True),
        rollout=ControllerConfig(batch_size=8, group_size=8, max_staleness=2, max_concurrent=16),
        trainer=TrainerConfig(
            optim=OptimConfig(lr=2e-4, schedule="cosine", min_lr_ratio=0.1),  # decays over the time budget
            loss=LossConfig(eps_clip=0.2), token_budget=4096,
            epochs=2,  # a second pass uses the time the trainer would wait for the engine (docs/demo.md)
        ),
        steps=1000, max_rl_seconds=510.0,  # the target: 85% held-out within 10 minutes, the whole demo in 20
        heldout=HeldoutConfig(dataset="data/heldout_small.jsonl", tools=tools, every_s=60.0),
        checkpoint_every=20,
    )  # fmt: skip


# DemoConfig keys that moved into its `rl` section (the RL stage is a whole TrainConfig now)
_MOVED_KEYS = {
    "rl_seconds": "rl.max_rl_seconds", "rl_steps": "rl.steps", "rollout": "rl.rollout", "lr": "rl.trainer.optim.lr",
    "lr_schedule": "rl.trainer.optim.schedule", "lr_min_ratio": "rl.trainer.optim.min_lr_ratio",
    "rl_epochs": "rl.trainer.epochs", "rl_token_budget": "rl.trainer.token_budget",
    "temperature": "rl.agent.temperature", "eval_every_s": "rl.heldout.every_s", "max_turns": "rl.agent.max_turns",
    "topk": "rl.tools.search.topk", "threads": "rl.trainer_threads and rl.engine.threads",
}  # fmt: skip
# The demo's own files, relative to its run directory: the stages before RL write them
_RUN_FILES = {"out": Path("rl"), "model": "model-sft", "data": "data/rl.jsonl"}


class DemoConfig(Config):
    """The CPU learning demo: worlds, tokenizer and model, expert SFT, then `rl`, the RL stage (docs/demo.md
    explains every default and the runs behind it)."""

    seed: int = Field(0, description="Seeds the worlds, the model, SFT and RL (rl.seed follows it).")
    out: Path | None = Field(None, description="Run directory (default runs/demo-seed<seed>-<time>).")
    world_entities: int = Field(1000, ge=100, description="Entities of each training world.")
    heldout_entities: int = Field(1000, ge=100, description="Entities of the held-out world.")
    preset: str = Field("default", description="The preset these settings started from (`asearch demo --preset`).")
    pages: Literal["facts", "prose", "long"] = Field(
        "facts",
        description="Page style of every world: 'facts' (`key value` fields in a fixed order, docs/world.md), "
        "'prose' (templated sentences: a harder reading task than a 1M-parameter model learns in minutes) or "
        "'long' (the facts among distractor lines behind a snippet: the agent opens pages and reads them "
        "chunk by chunk with the reading expert; the `long` preset).",
    )
    names: int | None = Field(
        255,
        description="Every world draws its names from world `names`'s pool (facts stay per seed; "
        "docs/world.md); None: each world its own names, so held-out names are words never seen.",
    )
    hops: tuple[int, ...] = Field((1, 2, 3), description="Hop counts of the questions, equally many of each.")
    phrasing: Literal["natural", "keys"] = Field(
        "natural",
        description="How questions word their relations: 'natural' (several wordings, idioms such as \"the country "
        "where X was born\") or 'keys' (each hop worded with the key its page states the fact under: \"the "
        "birthplace of X\"; the long preset, whose model must name the key it looks for on every page, docs/demo.md).",
    )
    name_answers: bool = Field(
        True,
        description="Ask only questions whose answer is an entity (a name): the tiny model does not learn to copy "
        "numbers and occupations within the budget (docs/demo.md).",
    )
    train_questions: int = Field(
        1200, description="Expert (SFT) questions per training world; `expert_episodes` cycle over them."
    )
    rl_questions: int = Field(
        100, ge=1, description="RL questions per training world, none of them among the SFT ones (RL on questions "
        "SFT trained on rewards remembered answers).",
    )
    heldout_questions: int = Field(300, description="Held-out questions for the accuracy before and after RL.")
    heldout_during_rl: int = Field(100, description="Held-out questions evaluated periodically during RL.")
    model: str | None = Field(
        None,
        description="A pretrained model (HF directory, name or alias such as smollm2-135m-instruct) to warm-start "
        "and train instead of the tiny one: its own tokenizer is used (`tokenizer`, `vocab_size`, `hidden`, "
        "`layers`, `heads`, `max_positions` are ignored).",
    )
    tokenizer: Literal["bpe", "word"] = Field(
        "bpe",
        description="'word': one token per word, number, tag or punctuation mark seen in the training worlds "
        "(a name word is one token to copy); 'bpe': byte-level BPE of `vocab_size` tokens fitted on "
        "`tokenizer_worlds` other worlds (name words in 2-3 pieces; docs/demo.md).",
    )
    vocab_size: int = Field(
        2000, description="With tokenizer=bpe: BPE tokens at most (fewer when the texts have no more merges); "
        "larger vocabularies made the supervised start worse (docs/demo.md).",
    )
    whole_numbers: bool = Field(
        True, description="With tokenizer=bpe: numbers are not split into digits before merging, so most years "
        "are one token (shorter episodes).",
    )
    tokenizer_worlds: int = Field(1, ge=1, description="Worlds (other seeds than training and held-out) the tokenizer is fitted on.")
    hidden: int = Field(128, description="Width of the tiny Qwen2.")
    layers: int = Field(4, description="Decoder layers of the tiny Qwen2.")
    heads: int = Field(4, description="Attention heads of the tiny Qwen2.")
    expert_episodes: int = Field(
        38400, description="Expert episodes for SFT, spread evenly over the worlds and their questions (SFT sees each once)."
    )
    train_worlds: int = Field(
        40, ge=1, description="Training worlds: the SFT expert episodes and the RL questions are spread over "
        "them. With `names` set, facts differ between worlds under the same names, so only reading lowers "
        "the loss (one world: the model remembers its facts).",
    )
    p_skip: float = Field(
        0.6, description="Expert answers one hop short with this probability (see skip_at): the greedy start "
        "stops early, the mistake RL learns to fix (docs/demo.md).",
    )
    skip_at: Literal["every", "first"] = Field(
        "every",
        description="Where the expert may stop short: at 'every' extra hop (a 3-hop question is finished 1 time "
        "in 16 at p_skip 0.75), or only after its 'first' search (once it searches a second time it finishes).",
    )
    p_wrong: float = Field(
        0.0,
        description="Expert copies a wrong name on one-hop questions with this probability (off: it made the "
        "supervised start copy worse, docs/demo.md).",
    )
    p_stop: float = Field(
        0.1, description="pages=long: the reading expert stops reading a page before it found the asked line "
        "(and guesses a name from the chunk) with this probability, per chunk.",
    )
    p_distract: float = Field(
        0.1, description="pages=long: the reading expert summarises another line's name as the asked one, when "
        "the chunk lacks it, with this probability.",
    )
    p_skim: float = Field(
        0.0, description="pages=long: the share of expert episodes that never read past a page's first chunk "
        "(guessing a name when the asked line is not in it): the greedy start then stops reading early, the "
        "habit RL learns to break, while the other episodes read every page to its line (docs/demo.md).",
    )
    max_positions: int = Field(1024, ge=64, description="Positions of the tiny Qwen2 (the longest context it can see).")
    attention: Literal["eager", "sdpa"] = Field(
        "eager", description="The model's attention in SFT and the RL trainer: 'eager' (plain matmuls) is the faster "
        "one on short episodes, 'sdpa' on long ones (2.2x at 620 tokens per sequence; docs/demo.md). Either way the "
        "trainers use SDPA for micro-batches of attention_switch_tokens (384) or more (sft.attention, "
        "rl.trainer.attention: auto).",
    )
    sft: SFTConfig = Field(
        default_factory=lambda: SFTConfig(
            steps=1200, batch_size=32, token_budget=2048, context_loss_weight=1.0, context_tokens="repeated",
            optim=OptimConfig(lr=3e-3, weight_decay=0.01, warmup_steps=20, schedule="cosine", min_lr_ratio=0.1),
        ),
        description="The supervised warm start on the expert episodes.",
    )
    setup_threads: int = Field(
        2, ge=1, description="torch threads for SFT and the before/after evaluations (nothing else runs then)."
    )
    rl: TrainConfig = Field(
        default_factory=_demo_rl,
        description="The RL stage, a whole `asearch train` config (configs/train-world-tiny.yaml is this one), "
        "whose agent and tools every stage shares. Its out, model, data and heldout.dataset are the demo's "
        "files (relative to the run directory); seed, tools.corpus and heldout.tools follow `seed` and the worlds.",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        moved = [k for k in _MOVED_KEYS if isinstance(data, dict) and k in data]
        if moved:
            raise ValueError("moved into the RL stage: " + ", ".join(f"{k} -> {_MOVED_KEYS[k]}" for k in moved))
        return data

    @model_validator(mode="after")
    def _derive_rl(self) -> DemoConfig:
        """The RL stage trains the demo's files, with the demo's seed, on its worlds."""
        rl = self.rl
        changed = {k: getattr(rl, k) for k, v in _RUN_FILES.items() if getattr(rl, k) != v}
        if rl.heldout.dataset != "data/heldout_small.jsonl":
            changed["heldout.dataset"] = rl.heldout.dataset
        if changed:
            raise ValueError(f"rl.{', rl.'.join(changed)} are the demo's own files: leave them ({changed})")
        first_world = _world(self, _train_seeds(self)[0], self.world_entities).name
        heldout_world = _world(self, _heldout_seed(self), self.heldout_entities).name
        derived = {
            "seed": self.seed,
            "tools": rl.tools.model_copy(update={"corpus": first_world}),
            "heldout": rl.heldout.model_copy(update={"tools": rl.tools.model_copy(update={"corpus": heldout_world})}),
        }
        if any(getattr(rl, k) != v for k, v in derived.items()):  # assigning validates again: then nothing differs
            self.rl = rl.model_copy(update=derived)
        return self

    def rl_stage(self, run_dir: Path) -> TrainConfig:
        """The `TrainConfig` the demo trains with in `run_dir`: `rl` with its files under `run_dir`."""
        at = lambda path: str(run_dir / path)  # noqa: E731
        return self.rl.model_copy(update={
            "out": run_dir / self.rl.out, "model": at(self.rl.model), "data": at(self.rl.data),
            "engine": self.rl.engine.model_copy(update={"model": at(self.rl.engine.model)}),
            "heldout": self.rl.heldout.model_copy(update={"dataset": at(self.rl.heldout.dataset)}),
        })  # fmt: skip


def _split_per_hop(records: list[Any], per_hop: int) -> tuple[list[Any], list[Any]]:
    """(the rest, the last `per_hop` questions of each hop count): disjoint, both balanced over hops."""
    by_hops: dict[int, list[Any]] = {}
    for r in records:
        by_hops.setdefault(r.metadata["hops"], []).append(r)
    cut = {h: max(0, len(rs) - per_hop) for h, rs in by_hops.items()}
    return [r for h, rs in by_hops.items() for r in rs[: cut[h]]], [r for h, rs in by_hops.items() for r in rs[cut[h] :]]


def _tokenizer_texts(corpus, records, cfg: DemoConfig, layout: _Layout) -> Any:
    """Pages as search results, and questions, actions and observations, so tags and result headers are known."""
    from asearch.agent.expert import act

    yield from page_texts(corpus, cfg.rl.tools.search.topk)
    for r in records[:500]:
        ev = r.metadata["evidence"]
        yield DEMO_STYLE["user_template"].format(question=r.question) + act("search", ev[0]["entity"])
        yield DEMO_STYLE["observation_template"].format(text="[Doc 1]") + act("answer", r.golds[0])


def _episode_texts(corpus, records, cfg: DemoConfig, layout: _Layout) -> list[str]:
    """Expert episodes on `corpus` as text (through the loop with a byte tokenizer: nothing to fit), and its
    pages: urls, page markers and summaries are then known words."""
    from asearch.models.tiny import train_bpe_tokenizer

    byte_tokenizer = train_bpe_tokenizer([], vocab_size=300)
    tools = _tools_over(cfg, corpus.seed)
    return _expert_texts(byte_tokenizer, records, tools, _byte_budgets(layout.agent), cfg) + [page.contents for page in corpus.pages()]


def _byte_budgets(agent: AgentConfig) -> AgentConfig:
    """`agent` with token budgets a byte tokenizer cannot run out of: a url spelled byte by byte is longer than
    an action's budget in model tokens, which cut every episode at its first `access`."""
    style = {**agent.style_options, "read_max_new_tokens": 4096, "act_max_new_tokens": 4096}
    return agent.model_copy(update={"max_new_tokens": 4096, "max_context_tokens": 1_000_000, "style_options": style})


def _tools_over(cfg: DemoConfig, seed: int) -> ToolsConfig:
    return cfg.rl.tools.model_copy(update={"corpus": _world(cfg, seed, cfg.world_entities).name})


def page_texts(corpus, topk: int) -> Any:
    """Every page of `corpus` as the compact search results show it, `topk` to a text."""
    docs = list(corpus.documents())
    for k in range(0, len(docs), topk):
        yield "\n".join(f"[Doc {j + 1}] {doc.text}" for j, doc in enumerate(docs[k : k + topk]))


def _expert_texts(tokenizer, records, tools_cfg: ToolsConfig, agent_cfg, cfg) -> list[str]:
    """The texts of expert episodes on `records` through the real loop and tools (with `tokenizer`)."""
    engine = expert_engine(tokenizer, records, _mistakes(cfg), cfg.seed)

    async def go():
        async with open_tools(tools_cfg, progress=False) as tools:
            workflow = SearchAgentWorkflow(tokenizer, tools, agent_cfg, cfg.rl.reward)
            return await asyncio.gather(*(workflow.arun_episode(engine, r) for r in records))

    trajs = asyncio.run(go())
    return [tokenizer.decode([t for seg in traj.segments for t in seg.token_ids]) for traj in trajs if traj is not None]


@dataclass
class _Layout:
    """What every phase derives from the config alone: world seeds, the tools over each world, the agent."""

    train_seeds: list[int]
    tokenizer_seeds: list[int]
    heldout_seed: int
    train_tools: list[ToolsConfig]
    heldout_tools: ToolsConfig
    agent: AgentConfig

    @classmethod
    def of(cls, cfg: DemoConfig) -> _Layout:
        train_seeds = _train_seeds(cfg)
        return cls(
            train_seeds=train_seeds,
            tokenizer_seeds=[2 * cfg.seed + 64 + 256 * k for k in range(cfg.tokenizer_worlds)],
            heldout_seed=_heldout_seed(cfg),
            train_tools=[cfg.rl.tools.model_copy(update={"corpus": _world(cfg, seed, cfg.world_entities).name}) for seed in train_seeds],
            heldout_tools=cfg.rl.heldout.tools or cfg.rl.tools,  # `DemoConfig._derive_rl` set its corpus
            agent=cfg.rl.agent,  # the scripted expert ignores its temperature; the evaluations are greedy
        )


# Training worlds 2s+1+256k never share a seed mod 256 (which picks own names) with the held-out world
# 2s+128, nor with the tokenizer's 2s+64+256k.
def _train_seeds(cfg: DemoConfig) -> list[int]:
    return [2 * cfg.seed + 1 + 256 * k for k in range(cfg.train_worlds)]


def _heldout_seed(cfg: DemoConfig) -> int:
    return 2 * cfg.seed + 128


def _mistakes(cfg: DemoConfig) -> ExpertMistakes:
    return ExpertMistakes(
        p_skip=cfg.p_skip, p_wrong=cfg.p_wrong, skip_at=cfg.skip_at, reading=cfg.pages == "long",
        p_stop=cfg.p_stop, p_distract=cfg.p_distract, p_skim=cfg.p_skim,
    )  # fmt: skip


def _world(cfg: DemoConfig, seed: int, entities: int):
    from asearch.corpus.world import WorldCorpus

    return WorldCorpus(seed, entities, names=cfg.names, pages=cfg.pages)


def run_demo(cfg: DemoConfig, *, log=print) -> dict[str, Any]:
    """The whole demo into `cfg.out`. A directory holding an interrupted run of the same config resumes it:
    the supervised start is kept once written, and RL continues from its last checkpoint."""
    t_start = time.perf_counter()
    log = _clocked(log, t_start)
    torch.manual_seed(cfg.seed)
    name = "demo" if cfg.preset == "default" else f"demo-{cfg.preset}"
    out = cfg.out or Path("runs") / f"{name}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    _check_resumable(out, cfg)
    run = RunDir(out)
    run.save_config(cfg)
    layout = _Layout.of(cfg)
    data_dir, model_dir = run.path / "data", run.path / "model-sft"
    if (run.path / "summary.json").exists():
        log(f"{run.path} holds a finished run: its summary.json stands (use another --out to run again)")
        return json.loads((run.path / "summary.json").read_text())

    # ---- 1-3. worlds and questions, tokenizer and model, expert episodes and SFT: the supervised start
    start = _read_json(model_dir / "sft.json")
    resumed = start is not None
    if start is None:
        start = _supervised_start(cfg, layout, run, log)
    else:
        log(f"resuming {run.path}: the supervised start in {model_dir} is kept (SFT took {start['sft_seconds']:.0f}s)")
    model, tokenizer = _load_tiny(model_dir, cfg.attention)
    heldout_records = load_dataset(str(data_dir / "heldout.jsonl"))

    # ---- 4. held-out accuracy before RL
    before = _heldout_before(cfg, layout, run, start, model, tokenizer, heldout_records, log)
    log(f"      before: {before:.3f}")

    # ---- 5. asynchronous RL (resumes from rl/checkpoints)
    train_cfg = cfg.rl_stage(run.path)
    seconds = train_cfg.max_rl_seconds
    log(f"[5/6] asynchronous RL for up to {train_cfg.steps} steps" + (f" or {seconds:.0f}s" if seconds is not None else ""))
    rl_run = RunDir(train_cfg.out)
    rl_summary = asyncio.run(train(train_cfg, run=rl_run, log=lambda m: log("      " + m), model=model, tokenizer=tokenizer))

    # ---- 6. held-out accuracy after RL, summary, plot, report
    torch.set_num_threads(cfg.setup_threads)
    episodes = _heldout(model, tokenizer, layout.heldout_tools, heldout_records, cfg)
    rows_after = _episode_rows(episodes, heldout_records)
    write_episode_rows(run.path / "heldout_after.jsonl", rows_after)
    after = episodes.mean_score
    log(f"[6/6] held-out accuracy after RL: {after:.3f} (before {before:.3f})")
    wall_seconds = time.perf_counter() - t_start + (start["wall_seconds"] if resumed else 0.0)
    summary = _summary(cfg, start, rl_summary, before, after, model, len(heldout_records),
                       wall_seconds=wall_seconds, resumed=resumed)  # fmt: skip
    summary |= horizon_summary(rows_after, _rows_if_any(run.path / "heldout_before.jsonl"))
    _write_figures_and_report(cfg, run, rl_run, summary)
    run.write_summary(summary)  # last: its presence marks the run finished
    return summary


def _heldout_before(
    cfg: DemoConfig, layout: _Layout, run: RunDir, start: dict[str, Any], model: Any, tokenizer: Any,
    records: list[QARecord], log: Log,
) -> float:  # fmt: skip
    """Step 4: greedy held-out accuracy of the supervised start, once (its episodes' rows first, then sft.json
    records it: the step is done)."""
    if "heldout_acc_before" not in start:
        log(f"[4/6] held-out accuracy before RL (greedy, {len(records)} questions)")
        episodes = _heldout(model, tokenizer, layout.heldout_tools, records, cfg)
        write_episode_rows(run.path / "heldout_before.jsonl", _episode_rows(episodes, records))
        start["heldout_acc_before"] = episodes.mean_score
        atomic_write_json(run.path / "model-sft" / "sft.json", start)
    return start["heldout_acc_before"]


def _summary(
    cfg: DemoConfig, start: dict[str, Any], rl_summary: dict[str, Any], before: float, after: float, model: Any,
    heldout_questions: int, *, wall_seconds: float, resumed: bool,
) -> dict[str, Any]:  # fmt: skip
    """summary.json's figures, but the horizon's."""
    return {
        "seed": cfg.seed,
        "heldout_acc_before": before,
        "heldout_acc_after": after,
        "rl_wall_seconds": rl_summary["rl_wall_seconds"],
        "rl_steps": rl_summary["steps"],
        "setup_seconds": start["setup_seconds"],
        "sft_seconds": start["sft_seconds"],
        "sft_final_loss": start["sft_final_loss"],
        # resumed: this process's time plus the supervised start's (RL time before the interruption not counted)
        "wall_seconds": wall_seconds,
        "resumed": resumed,
        "parameters": sum(p.numel() for n, p in model.named_parameters() if ".lora_" not in n),  # the model's own
        "expert_mean_tokens": start["expert_mean_tokens"],
        "heldout_questions": heldout_questions,
        "rejected_groups": rl_summary["rejected_groups"],
        "episodes_generated": rl_summary.get("episodes_generated", 0),
        "episodes_kept": rl_summary.get("episodes_kept", 0),
    }


def _write_figures_and_report(cfg: DemoConfig, run: RunDir, rl_run: RunDir, summary: dict[str, Any]) -> None:
    """curve.png (held-out accuracy along RL), horizon.png and report.md."""
    from asearch.demo.report import write_horizon_plot, write_plot, write_report

    before, after = summary["heldout_acc_before"], summary["heldout_acc_after"]
    write_plot(rl_run.metrics(), run.path / "curve.png", before=before, after=after, temperature=cfg.rl.agent.temperature)
    write_horizon_plot(run.path / "horizon.png", summary.get("horizon_before"), summary["horizon"])
    write_report(run.path / "report.md", summary, cfg)


def _supervised_start(cfg: DemoConfig, layout: _Layout, run: RunDir, log: Log) -> dict[str, Any]:
    """Phases 1-3 into RUN/data and RUN/model-sft (model, tokenizer, and sft.json, written last).
    The world and expert work runs in `setup_threads` worker processes: worlds are independent."""
    from asearch.models.tiny import save_tiny

    t_start = time.perf_counter()
    with worker_pool(cfg.setup_threads) as pmap:
        data = _prepare_worlds(cfg, layout, run.path / "data", pmap, log)
        model, tokenizer = _tokenizer_and_model(cfg, layout, data, log)
        t0 = time.perf_counter()
        per_episode = _expert_episodes(cfg, layout, data.per_world, tokenizer, pmap)
    samples = [s for episode in per_episode for s in episode]
    mean_len = sum(len(s.token_ids) for s in samples) / len(samples)
    setup_seconds = time.perf_counter() - t_start
    log(f"[3/6] {len(per_episode)} expert episodes on {len(data.per_world)} world(s) in {time.perf_counter() - t0:.0f}s "
        f"(mean {mean_len:.0f} tokens); SFT {cfg.sft.steps} steps")  # fmt: skip
    losses, sft_seconds = _finetune(cfg, model, samples, log)
    start = {
        "setup_seconds": setup_seconds, "sft_seconds": sft_seconds, "sft_final_loss": losses[-1],
        "expert_mean_tokens": mean_len, "wall_seconds": time.perf_counter() - t_start,
    }  # fmt: skip
    model_dir = run.path / "model-sft"
    save_tiny(model, tokenizer, model_dir)
    atomic_write_json(model_dir / "sft.json", start)
    return start


@dataclass
class DemoData:
    """Phase 1's questions: the expert's (SFT) per training world, RL's, the held-out ones, and those of the
    worlds the tokenizer is fitted on."""

    per_world: list[list[QARecord]]
    rl_records: list[QARecord]
    heldout_records: list[QARecord]
    tokenizer_records: list[list[QARecord]]

    @property
    def train_records(self) -> list[QARecord]:
        return [r for recs in self.per_world for r in recs]

    def write(self, data_dir: Path, heldout_during_rl: int) -> None:
        """train.jsonl, rl.jsonl, heldout.jsonl and heldout_small.jsonl (the questions RL's held-out curve asks)."""
        held = self.heldout_records
        small = held[:: max(1, len(held) // heldout_during_rl)][:heldout_during_rl]
        for name, records in (("train", self.train_records), ("rl", self.rl_records), ("heldout", held),
                              ("heldout_small", small)):  # fmt: skip
            write_jsonl(data_dir / f"{name}.jsonl", (r.to_jsonl_dict() for r in records))


def _prepare_worlds(cfg: DemoConfig, layout: _Layout, data_dir: Path, pmap: Mapper, log: Log) -> DemoData:
    """Phase 1: every world's questions and search index; the training worlds' questions split into SFT and RL."""
    log(f"[1/6] worlds: {cfg.train_worlds} for training ({layout.train_tools[0].corpus}, ...), "
        f"held-out {layout.heldout_tools.corpus}")  # fmt: skip
    prepared = pmap(prepare_world, _world_jobs(cfg, layout))
    n_train = len(layout.train_seeds)
    per_world, rl_records = [], []
    for recs in prepared[:n_train]:
        sft_part, rl_part = _split_per_hop(recs, cfg.rl_questions // len(cfg.hops))
        per_world.append(sft_part)
        rl_records += rl_part
    data = DemoData(per_world, rl_records, prepared[n_train], prepared[n_train + 1 :])
    data.write(data_dir, cfg.heldout_during_rl)
    log(f"      {len(data.train_records)} expert (SFT), {len(rl_records)} RL and {len(data.heldout_records)} held-out "
        f"questions (hops {cfg.hops}), indexes built")  # fmt: skip
    return data


def _world_jobs(cfg: DemoConfig, layout: _Layout) -> list[WorldJob]:
    """The training worlds, the held-out world, and (a tiny model's BPE) the tokenizer's worlds."""
    train_n = cfg.train_questions + cfg.rl_questions
    jobs = [_world_job(cfg, seed, cfg.world_entities, train_n, "world-train", tools)
            for seed, tools in zip(layout.train_seeds, layout.train_tools, strict=True)]  # fmt: skip
    jobs.append(_world_job(cfg, layout.heldout_seed, cfg.heldout_entities, cfg.heldout_questions, "world-heldout",
                           layout.heldout_tools))  # fmt: skip
    if cfg.tokenizer == "bpe" and cfg.model is None:
        jobs += [_tokenizer_job(cfg, seed) for seed in layout.tokenizer_seeds]
    return jobs


def _tokenizer_job(cfg: DemoConfig, seed: int) -> WorldJob:
    # long pages: the tokenizer learns from expert episodes on its worlds, so those need their indexes
    tools = _tools_over(cfg, seed) if cfg.pages == "long" else None
    return _world_job(cfg, seed, cfg.world_entities, 300, "world-tokenizer", tools, name_answers=False)


def tokenizer_worlds(cfg: DemoConfig) -> list[tuple[Any, ToolsConfig, list[QARecord]]]:
    """The worlds a tiny model's BPE is fitted on (no training or held-out world), each with its tools and the
    questions phase 1 makes there: for an agent of another format to fit its own tokenizer by the demo's recipe."""
    return [
        (_world(cfg, seed, cfg.world_entities), _tools_over(cfg, seed), prepare_world(_tokenizer_job(cfg, seed)))
        for seed in _Layout.of(cfg).tokenizer_seeds
    ]


def _world_job(
    cfg: DemoConfig, seed: int, entities: int, n: int, dataset: str, tools: ToolsConfig | None,
    name_answers: bool | None = None,
) -> WorldJob:  # fmt: skip
    answers = cfg.name_answers if name_answers is None else name_answers
    return WorldJob(seed, entities, n, cfg.hops, dataset, cfg.names, cfg.pages, answers, tools, cfg.phrasing)


def _tokenizer_and_model(cfg: DemoConfig, layout: _Layout, data: DemoData, log: Log) -> tuple[Any, Any]:
    """Phase 2: the tiny model and its tokenizer built here, or a pretrained pair loaded. The tokenizer learns
    from other worlds, to which training and held-out names are equally foreign (fit on the training world,
    copying learned on its names would not carry over; docs/demo.md)."""
    from asearch.models.tiny import build_tiny_model

    if cfg.model is not None:
        from asearch.models.loading import load_model, load_tokenizer

        tokenizer, model = load_tokenizer(cfg.model), load_model(cfg.model)
    else:
        tokenizer = _word_tokenizer(cfg, layout, data) if cfg.tokenizer == "word" else _bpe_tokenizer(cfg, layout, data)
        model = build_tiny_model(tokenizer, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                                 max_positions=cfg.max_positions, seed=cfg.seed)  # fmt: skip
    model.set_attn_implementation(cfg.attention)
    unknown = _unknown_words(tokenizer, _world(cfg, layout.heldout_seed, cfg.heldout_entities))
    which = f"{cfg.model}: its tokenizer" if cfg.model else f"{cfg.tokenizer} tokenizer"
    log(f"[2/6] {which} {len(tokenizer)} tokens ({unknown} of the held-out pages' tokens unknown); "
        f"model {sum(p.numel() for p in model.parameters()):,} parameters")  # fmt: skip
    return model, tokenizer


def _word_tokenizer(cfg: DemoConfig, layout: _Layout, data: DemoData) -> Any:
    """The training worlds' own words (the shared name pool, the page keys) and the loop's exact texts: expert
    episodes through it with a byte tokenizer (no merges: nothing to fit)."""
    from asearch.models.tiny import train_bpe_tokenizer, train_word_tokenizer

    byte_tok = train_bpe_tokenizer([], vocab_size=300)
    texts = _expert_texts(byte_tok, data.per_world[0][:300], layout.train_tools[0], _byte_budgets(layout.agent), cfg)
    topk = cfg.rl.tools.search.topk
    pages = (page_texts(_world(cfg, seed, cfg.world_entities), topk) for seed in layout.train_seeds)
    return train_word_tokenizer(itertools.chain(texts, itertools.chain.from_iterable(pages)))


def _bpe_tokenizer(cfg: DemoConfig, layout: _Layout, data: DemoData) -> Any:
    """Byte-level BPE fitted on the tokenizer worlds' pages and questions (long pages: whole expert episodes)."""
    from asearch.models.tiny import train_bpe_tokenizer

    texts_of = _episode_texts if cfg.pages == "long" else _tokenizer_texts
    texts = (texts_of(_world(cfg, seed, cfg.world_entities), recs, cfg, layout)
             for seed, recs in zip(layout.tokenizer_seeds, data.tokenizer_records, strict=True))  # fmt: skip
    return train_bpe_tokenizer(
        itertools.chain.from_iterable(texts), vocab_size=cfg.vocab_size, whole_numbers=cfg.whole_numbers
    )


def _expert_episodes(
    cfg: DemoConfig, layout: _Layout, per_world: list[list[QARecord]], tokenizer: Any, pmap: Mapper
) -> list[list[Sample]]:
    """Phase 3: expert trajectories through the real loop and tools, one expert per world (a question's text may
    recur in another world with another answer), the worlds taking turns; each episode's training samples."""
    W = len(per_world)
    jobs = [
        ExpertJob(recs, len(range(k, cfg.expert_episodes, W)), tools, tokenizer, layout.agent, _mistakes(cfg),
                  cfg.seed + 7919 * k)
        for k, (recs, tools) in enumerate(zip(per_world, layout.train_tools, strict=True))
    ]  # fmt: skip
    return interleave(pmap(expert_episodes, jobs))


def _finetune(cfg: DemoConfig, model: Any, samples: list[Sample], log: Log) -> tuple[list[float], float]:
    """Phase 3's SFT on the expert samples with the set-up's threads: (losses, seconds)."""
    t0 = time.perf_counter()
    torch.set_num_threads(cfg.setup_threads)
    progress = _SFTProgress(cfg.sft.steps, log, t0)
    losses = sft(model, samples, cfg.sft.model_copy(update={"seed": cfg.seed}), on_step=progress)
    return losses, time.perf_counter() - t0


@dataclass
class _SFTProgress:
    """SFT's loss every 50 steps and at the end, with the time a step takes and the time left."""

    steps: int
    log: Log
    t0: float

    def __call__(self, step: int, loss: float) -> None:
        if (step + 1) % 50 == 0 or step + 1 == self.steps:
            per_step = (time.perf_counter() - self.t0) / (step + 1)
            left = _mmss(per_step * (self.steps - step - 1))
            self.log(f"      sft step {step + 1}/{self.steps} loss {loss:.3f} ({per_step:.2f}s/step, {left} left)")


def _load_tiny(model_dir: Path, attention: str):
    """The saved supervised start, with the attention it trains with (`DemoConfig.attention`)."""
    from asearch.models.loading import load_model, load_tokenizer

    model = load_model(model_dir)
    model.set_attn_implementation(attention)  # a saved model loads with the library default (SDPA)
    return model, load_tokenizer(model_dir)


def _check_resumable(out: Path, cfg: DemoConfig) -> None:
    """An existing run directory is resumed only under the config it was started with."""
    saved = out / "config.yaml"
    if not saved.exists():
        return
    import yaml

    old = yaml.safe_load(saved.read_text()) or {}
    new = cfg.model_dump(mode="json")
    try:  # a setting added since the run started is compared at its default, which keeps the old behaviour
        old = type(cfg).model_validate({**old, "out": cfg.out}).model_dump(mode="json")
    except ValidationError:
        pass  # a setting since removed or renamed: the raw comparison below names it
    diff = [d for d in _differences(old, new) if d[0] != "out"]
    if diff:
        raise ConfigError(
            f"{out} holds a demo run with other settings ({', '.join(f'{k}: {a!r} -> {b!r}' for k, a, b in diff)}); "
            "resume it with the same settings or pass another --out"
        )


def _differences(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs between two config dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [(prefix.rstrip("."), old, new)]


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _clocked(log, t_start: float):
    """`log` with the time since `t_start` in front of every line."""
    return lambda msg: log(f"{_mmss(time.perf_counter() - t_start):>5} {msg}")


def _rows_if_any(path: Path) -> list[dict[str, Any]] | None:
    return read_episode_rows(path) if path.exists() else None  # a run started before the rows were written


def _episode_rows(episodes: EpisodeScores, records) -> list[dict[str, Any]]:
    """One row per held-out question (a rejected episode has none): turns, tool calls, compactions, hops."""
    return [episode_row(t, r) for t, r in zip(episodes.trajectories, records, strict=True) if t is not None]


def _heldout(model, tokenizer, tools_cfg: ToolsConfig, records, cfg: DemoConfig) -> EpisodeScores:
    """Greedy episodes (scored with the RL reward's metric) of `model` on `records`, with the set-up's threads."""
    from asearch.engine.local.inprocess import InProcessEngine

    agent = cfg.rl.agent.model_copy(update={"temperature": 0.0})

    async def go():
        engine = InProcessEngine(model, tokenizer, cfg=cfg.rl.engine.options.model_copy(update={"threads": cfg.setup_threads}))
        try:
            async with open_tools(tools_cfg, progress=False) as tools:
                workflow = SearchAgentWorkflow(tokenizer, tools, agent, cfg.rl.reward)
                return await evaluate_workflow(workflow, engine, records, concurrency=128)
        finally:
            await engine.close()

    return asyncio.run(go())


def _unknown_words(tokenizer, corpus) -> str:
    """The share of a corpus's tokens the tokenizer maps to unk, as text ("0.0%"; byte-level BPE has none)."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return "0.0%"
    ids = [i for doc in corpus.documents() for i in tokenizer.encode(doc.text, add_special_tokens=False)]
    return f"{100 * sum(i == unk for i in ids) / max(1, len(ids)):.1f}%"
