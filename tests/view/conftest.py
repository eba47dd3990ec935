"""Real run directories for the viewer tests, made by running the real producers in-process: agent runs on a
four-page corpus, synthesis on a small generated world.

runs/demo-seed0/            summary.json, curve.png (asearch.demo.report.write_plot), report.md
runs/demo-seed0/rl/         a train run: RunDir rows + trajectories of scripted agent episodes
runs/eval-mini/             asearch.eval.runner.evaluate over two datasets, k=2
runs/ask.json               one `asearch ask --json` trajectory whose model output is an XSS attempt
runs/synth/                 `asearch.synth.run_synthesis` on a small world with a scripted solver: questions.jsonl,
                            attempts.jsonl, filter_report.json, ... (histories with kept and rejected steps)
"""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import pytest

from asearch.agent import AgentConfig, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.eval.datasets import QARecord
from asearch.eval.runner import evaluate
from asearch.metrics.offpolicy import (
    MASKED_FRAC,
    MASKED_FRAC_BY_STALENESS,
    RATIO_HIST,
    RATIO_LABELS,
    VERSIONS_BEHIND_HIST,
    VERSIONS_BEHIND_LABELS,
    versions_behind_bin,
)
from asearch.metrics.reward import RewardConfig, compute_reward
from asearch.models.tiny import train_bpe_tokenizer
from asearch.retrieval.index import open_index
from asearch.runs import RunDir
from asearch.synth import SynthConfig, run_synthesis
from asearch.synth.graph_backend import GraphBackend
from asearch.tools import AccessTool, SearchTool

DOCS = [
    ("Ada Varn", "Ada Varn is a chemist. Ada Varn was born in Oslen. She works for Brightwell."),
    ("Oslen", "Oslen is a city in Tarnia. Oslen has a harbour."),
    ("Brightwell", "Brightwell is a company founded in 1921. Its headquarters are in Kettering."),
    ("Tomas Grell", "Tomas Grell is a painter born in Kettering."),
]
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 1">'


def scripted(query: str, answer: str, note: str, *, sloppy: bool = False):
    """A policy that searches `query`, summarises the results as `note`, then answers `answer`
    (`sloppy`: its first turn has no action, a format error the reward's gate punishes)."""

    searched = []  # one policy per episode: the first act turn searches, the next answers
    fumbled = [] if sloppy else [True]

    def policy(prompt: str) -> str:
        if not fumbled:
            fumbled.append(True)
            return "Let me think about where to look."
        if prompt.endswith("<summary>"):
            return f"The results say {note}.</summary>"
        if searched:
            return f"<think>So the answer is {answer}.</think>\n<answer>{answer}</answer>"
        searched.append(query)
        return f"<think>I should look up {query}.</think>\n<search>{query}</search>"

    return policy


QUESTIONS = {  # id: (dataset, question, gold, search query)
    "ada": ("mini-a", "Where was Ada Varn born?", "Oslen", "Ada Varn born"),
    "founded": ("mini-a", "When was Brightwell founded?", "1921", "Brightwell founded"),
    "tomas": ("mini-a", "Where was Tomas Grell born?", "Kettering", "Tomas Grell"),
    "country": ("mini-b", "Which country is Oslen in?", "Tarnia", "Oslen city"),
    "hq": ("mini-b", "Where are Brightwell's headquarters?", "Kettering", "Brightwell headquarters"),
}
# seed 0 answers all but "tomas" right; seed 1 also gets "hq" wrong
WRONG = {0: {"tomas"}, 1: {"tomas", "hq"}}


class World:
    def __init__(self, root: Path, build_mini_index):
        index = open_index(build_mini_index(root / "index", "view-mini", DOCS))
        self.tools = {
            "search": SearchTool(index.retriever("bm25"), {"topk": 2}),
            "access": AccessTool(index.pages),
        }
        texts = [x for _, x in DOCS] * 20 + [
            "<search></search><answer></answer><summary></summary><think></think>"
        ] * 20
        self.tok = train_bpe_tokenizer(texts, vocab_size=400)

    async def episode(self, question: str, policy, *, version: int = 0, **kw):
        engine = ScriptedEngine(self.tok, policy, version=version)
        return await run_episode(engine, self.tok, self.tools, question, AgentConfig(), **kw)


def _answer(qid: str, seed: int) -> str:
    gold = QUESTIONS[qid][2]
    return "Brightwell" if qid in WRONG[seed] else gold


def make_train_run(world: World, path: Path, steps: int = 6) -> RunDir:
    """A train run dir as `asearch train` leaves it mid-run: config, metric rows, sampled trajectories."""
    run = RunDir(path, tensorboard=False)
    (path / "config.yaml").write_text("seed: 0\nsteps: 100\nrollout:\n  batch_size: 1\n  group_size: 4\n")
    run.log(0, {"eval/heldout_acc": 0.25, "perf/rl_wall_s": 0.0})
    ids = list(QUESTIONS)
    for step in range(1, steps + 1):
        qid = ids[step % len(ids)]
        _, question, gold, query = QUESTIONS[qid]
        trajs = []
        for k in range(4):
            answer = gold if k < 1 + step // 2 else "Brightwell"  # the policy improves with steps
            policy = scripted(query, answer, f"{answer} (sample {k})", sloppy=k == 0 and step % 2 == 0)
            traj = asyncio.run(world.episode(question, policy, version=max(0, step - 1 - k % 2)))
            res = compute_reward(traj, [gold], RewardConfig(metric="em", invalid_answer_penalty=-0.5))
            traj.reward, traj.score = res.reward, res.score
            trajs.append(traj)
        n = len(trajs)
        metrics = {  # the names `asearch.rl.loop.rollout_metrics` writes
            "rollout/reward_mean": sum(t.reward for t in trajs) / n,
            "rollout/accuracy": sum(t.score for t in trajs) / n,
            "rollout/turns_mean": sum(t.num_turns for t in trajs) / n,
            "rollout/searches_mean": sum(t.counters.get("searches", 0) for t in trajs) / n,
            "rollout/gen_tokens_mean": sum(t.generated_tokens for t in trajs) / n,
            "rollout/parse_errors": float(sum(t.counters.get("parse_errors", 0) for t in trajs)),
            "rollout/tool_errors": float(sum(t.counters.get("tool_errors", 0) for t in trajs)),
            "rollout/no_answer_rate": sum(t.answer is None for t in trajs) / n,
            "rollout/staleness_max": float(max(step - 1 - t.min_version for t in trajs)),
            "rollout/staleness_mean": sum(step - 1 - t.min_version for t in trajs) / n,
            "rollout/rejected/stale": float(step // 3),
            "perf/trajectories_per_s": 4.0 / (0.5 + 0.1 * step),
            "perf/step_s": 0.5 + 0.1 * step,
            "perf/rl_wall_s": run.wall_s,
            "loss/policy": 0.1 / step,
        }
        metrics.update(_staleness_lab(trajs, policy_version=step - 1))
        if step % 3 == 0:
            metrics["eval/heldout_acc"] = 0.25 + 0.1 * step / 3
        run.log(step, metrics)
        for t in trajs:
            run.log_trajectory({"step": step, "group": step, **t.to_dict()})
    return run


def _staleness_lab(trajs, policy_version: int) -> dict[str, float]:
    """The staleness lab's keys as the trainer writes them (`asearch.rl.trainer.staleness_lab_stats`): tokens
    by versions behind from the trajectories; every importance ratio in the middle bin but a tenth of the
    stale ones, which the correction masked."""
    behind = [0.0] * len(VERSIONS_BEHIND_LABELS)
    for t in trajs:
        for seg in t.segments:
            for v, m in zip(seg.versions, seg.loss_mask, strict=True):
                behind[versions_behind_bin(policy_version - v)] += m
    masked = [0.1 * n if b else 0.0 for b, n in enumerate(behind)]
    ratio = dict.fromkeys(RATIO_LABELS, 0.0) | {"0.8-1.25": sum(behind) - sum(masked), "5-10": sum(masked)}
    return {
        **{f"{VERSIONS_BEHIND_HIST}{b}": n for b, n in zip(VERSIONS_BEHIND_LABELS, behind, strict=True)},
        **{f"{RATIO_HIST}{b}": n for b, n in ratio.items()},
        **{f"{MASKED_FRAC_BY_STALENESS}{b}": m / n for b, m, n in zip(VERSIONS_BEHIND_LABELS, masked, behind, strict=True) if n},
        MASKED_FRAC: sum(masked) / sum(behind),
    }


def make_eval_run(world: World, path: Path) -> None:
    records = [QARecord(id=q, question=x[1], golds=[x[2]], dataset=x[0]) for q, x in QUESTIONS.items()]

    async def solve(rec: QARecord, seed: int):
        _, question, _, query = QUESTIONS[rec.id]
        answer = _answer(rec.id, seed)
        return await world.episode(
            question,
            scripted(query, answer, f"it is {answer}"),
            trajectory_id=f"{rec.dataset}/{rec.id}/seed{seed}",
            seed=seed,
            metadata={"dataset": rec.dataset, "question_id": rec.id},
        )

    evaluate(solve, records, out_dir=path, k=2, concurrency=4, progress=False)


def make_ask_file(world: World, path: Path) -> dict:
    searched = []

    def policy(prompt: str) -> str:
        if prompt.endswith("<summary>"):
            return f"Nothing here {XSS}</summary>"
        if searched:
            return f"<think>Done {XSS}</think>\n<answer>{XSS}</answer>"
        searched.append(1)
        return f"<think>Try {XSS}</think>\n<search>Oslen {XSS}</search>"

    traj = asyncio.run(world.episode(f"Who is {XSS}?", policy))
    record = traj.to_dict()
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n")
    return record


class RecallingSolver:
    """A tool-less direct solver (`asearch.synth.solver.DirectSolver`) answering from a memory the backend fills."""

    name = "recall"

    def __init__(self) -> None:
        self.memory: dict[str, str] = {}

    async def answers(self, question: str, k: int, seed: int) -> list[str]:
        return [self.memory.get(question, "no idea")] * k

    async def aclose(self) -> None:
        return None


class WellKnownBackend(GraphBackend):
    """The graph backend with every base QA, and a fixed third of the edited versions (by a hash of their text),
    put into the solver's memory: base questions need edits to get hard, and some edits are rejected for making
    the question easier again, so the histories hold kept steps and steps rejected by the difficulty gate."""

    def __init__(self, memory: dict[str, str], **kw):
        super().__init__(**kw)
        self.memory = memory

    async def base(self, seed, rng):
        draft = await super().base(seed, rng)
        if draft is not None:
            self.memory[draft.question] = draft.answer
        return draft

    async def edit(self, draft, action, rng):
        new = await super().edit(draft, action, rng)
        if new is not None and zlib.crc32(new.question.encode()) % 3 == 0:
            self.memory[new.question] = new.answer
        return new


def make_synth_run(path: Path) -> None:
    """A finished `asearch synth` output directory (graph backend, world seed 5, 300 entities; well under a second)."""
    cfg = SynthConfig.model_validate(
        {"backend": "graph", "seed": 1, "n_questions": 8, "rounds": 4, "min_edits": 2, "concurrency": 4,
         "id_prefix": "view", "graph": {"world_seed": 5, "entities": 300}, "grading": {"method": "em"},
         "solver": {"k": 2}}
    )  # fmt: skip
    solver = RecallingSolver()
    backend = WellKnownBackend(solver.memory, cfg=cfg.graph, gates=cfg.gates, run_seed=cfg.seed)
    run_synthesis(cfg, path, backend=backend, solver=solver, log=lambda _: None)


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory, build_mini_index) -> Path:
    tmp = tmp_path_factory.mktemp("view")
    world = World(tmp, build_mini_index)
    root = tmp / "runs"
    demo = root / "demo-seed0"
    rl = make_train_run(world, demo / "rl")
    summary = {"seed": 0, "heldout_acc_before": 0.25, "heldout_acc_after": 0.45, "rl_steps": 6}
    (demo / "summary.json").write_text(json.dumps(summary))
    (demo / "report.md").write_text("# Demo report\n\nheld-out accuracy 0.25 -> 0.45\n")
    try:
        from asearch.demo.report import write_plot

        write_plot(rl.metrics(), demo / "curve.png", before=0.25, after=0.45)
    except ImportError:  # matplotlib is in the cpu extra; the viewer test does not need the png
        pass
    make_eval_run(world, root / "eval-mini")
    make_ask_file(world, root / "ask.json")
    make_synth_run(root / "synth")
    return root
