"""Training speed on the CPU demo's own samples: micro-batch token budget, precision, and the LM head.

1. Token budget. A step's samples are sorted by length and cut into micro-batches of at most `token_budget`
   padded tokens (rows x longest). A large budget puts a whole batch in one micro-batch padded to its
   longest episode; the demo's episodes run from ~60 to ~300 tokens, so about half of it is padding.
2. Precision. SFT under bfloat16 autocast against float32, at the demo's budget.
3. The LM head. An RL step's loss needs log-probs of the generated tokens only (a fifth of the positions);
   `sequence_logprobs(..., generated_only=True)` applies the head and softmax there alone.
4. Attention. An RL step under SDPA against plain matmul ("eager") attention, on the demo's episodes and on
   long ones (the demo's episodes joined into rows of `--long-tokens`, as a 30+-turn episode is long).
Each is timed beside its baseline in the same run. Table to stdout and bench/results/train_speed.md.

    .venv/bin/python bench/train_speed.py                 # 2 threads, 12 SFT and 4 RL steps per setting
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from asearch.files import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "train_speed.md"


def demo_samples(n_questions: int):
    """Expert episodes of the demo (facts pages, top-2 compact results, p_skip 0.75) on one world, with its BPE."""
    from asearch.agent.expert import WorldExpert, plan_from_record
    from asearch.agent.loop import AgentConfig
    from asearch.agent.workflow import SearchAgentWorkflow, run_workflow
    from asearch.corpus.world import WorldCorpus
    from asearch.demo.pipeline import DEMO_STYLE, DemoConfig, _Layout, _tokenizer_texts
    from asearch.demo.worlds import world_records
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.models.tiny import build_tiny_model, train_bpe_tokenizer
    from asearch.rl.sft import trajectories_to_samples
    from asearch.tools import ToolsConfig, build_tools

    world = WorldCorpus(1, 1000, names=255, pages="facts")
    records = world_records(1, 1000, n_questions, (1, 2, 3), "bench", 255, "facts", name_answers=True)
    demo = DemoConfig()
    tokenizer = train_bpe_tokenizer(_tokenizer_texts(world, records, demo, _Layout.of(demo)), vocab_size=2000)
    tools, closers = build_tools(
        ToolsConfig(corpus=world.name, search={"topk": 2, "show_urls": False, "compact": True}, access=None), progress=False
    )
    expert = WorldExpert({r.question: plan_from_record(r.model_dump()) for r in records}, p_skip=0.75)
    engine = ScriptedEngine(tokenizer, expert)
    agent = AgentConfig(style="search-r1", style_options=DEMO_STYLE, max_turns=8, max_new_tokens=48)

    workflow = SearchAgentWorkflow(tokenizer, tools, agent)
    trajectories = asyncio.run(run_workflow(workflow, engine, records, concurrency=len(records)))
    samples = trajectories_to_samples([t for t in trajectories if t is not None])
    for close in closers:
        close()
    return samples, lambda: build_tiny_model(tokenizer, max_positions=4096, seed=0)


def time_sft(new_model, samples, budget: int, steps: int, bf16: bool = False) -> float:
    from asearch.rl.sft import SFTConfig, sft

    cfg = SFTConfig(steps=steps, batch_size=32, token_budget=budget, context_loss_weight=1.0, dtype="bfloat16" if bf16 else "float32")
    model = new_model()
    sft(model, samples[:64], cfg.model_copy(update={"steps": 1}))  # warm-up
    t0 = time.perf_counter()
    sft(model, samples, cfg)
    return (time.perf_counter() - t0) / steps


def time_rl(new_model, samples, budget: int, steps: int, attention: str | None = None, per_step: int = 64) -> float:
    from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig

    rl = [Sample(s.token_ids, s.loss_mask, [-1.0] * len(s.token_ids), [0] * len(s.token_ids), (-1.0) ** i) for i, s in enumerate(samples)]
    trainer_cfg = TrainerConfig(token_budget=budget, attention=attention or "auto")  # eager/sdpa: that one throughout
    trainer = PolicyTrainer(new_model(), trainer_cfg, total_steps=steps + 1)
    trainer.train_step(rl[:per_step], policy_version=0)  # warm-up
    t0 = time.perf_counter()
    for k in range(steps):
        trainer.train_step(rl[per_step * (k + 1) : per_step * (k + 2)], policy_version=0)
    return (time.perf_counter() - t0) / steps


def time_logprobs(new_model, samples, generated_only: bool, steps: int) -> float:
    """Forward and backward of the policy log-probs of 64-sample steps (the demo's RL budget of 4,096)."""
    from asearch.rl.trainer import micro_batches, sequence_logprobs

    model = new_model().train()
    t0 = time.perf_counter()
    for k in range(steps):
        rows = samples[64 * k : 64 * (k + 1)]
        for mb in micro_batches(rows, 4096):
            batch = [rows[i] for i in mb]
            sequence_logprobs(model, batch, 0.7, generated_only=generated_only).sum().backward()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=12)
    ap.add_argument("--rl-steps", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=2500, help="row length of the long episodes in section 4")
    ap.add_argument("--only-attention", action="store_true", help="section 4 alone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    samples, new_model = demo_samples(600)
    lengths = sorted(len(s.token_ids) for s in samples)
    print(f"{len(samples)} expert episodes, tokens min/median/max {lengths[0]}/{lengths[len(lengths) // 2]}/{lengths[-1]}; {args.threads} threads")

    rows = attention_rows(new_model, samples, args)
    if args.only_attention:
        return report(rows, samples, args)
    sft_base = time_sft(new_model, samples, 8192, args.sft_steps)
    for budget in (16384, 8192, 4096, 2048, 1024):
        t = sft_base if budget == 8192 else time_sft(new_model, samples, budget, args.sft_steps)
        rows.append(("SFT step (32 episodes)", budget, t, sft_base / t))
        print(f"sft  budget {budget:6d}: {t:.3f} s/step  x{sft_base / t:.2f} vs 8192", flush=True)
    bf16 = time_sft(new_model, samples, 2048, args.sft_steps, bf16=True)
    fp32 = time_sft(new_model, samples, 2048, args.sft_steps)
    rows.append(("SFT step, bf16 autocast (baseline: float32 below)", 2048, bf16, 1.0))
    rows.append(("SFT step, float32", 2048, fp32, bf16 / fp32))
    print(f"sft  float32 {fp32:.3f} s/step against bf16 {bf16:.3f}: x{bf16 / fp32:.2f}", flush=True)
    every = time_logprobs(new_model, samples, False, args.rl_steps * 2)
    generated = time_logprobs(new_model, samples, True, args.rl_steps * 2)
    rows.append(("RL log-probs fwd+bwd, head on every position (baseline)", 4096, every, 1.0))
    rows.append(("RL log-probs fwd+bwd, head on generated tokens", 4096, generated, every / generated))
    print(f"rl   head on generated tokens {generated:.3f} s/step against every position {every:.3f}: x{every / generated:.2f}", flush=True)
    rl_base = time_rl(new_model, samples, 16384, args.rl_steps)
    for budget in (16384, 4096, 2048):
        t = rl_base if budget == 16384 else time_rl(new_model, samples, budget, args.rl_steps)
        rows.append(("RL train_step (64 samples)", budget, t, rl_base / t))
        print(f"rl   budget {budget:6d}: {t:.3f} s/step  x{rl_base / t:.2f} vs 16384", flush=True)
    report(rows, samples, args)
    best_sft = max((r for r in rows if r[0] == "SFT step (32 episodes)"), key=lambda r: r[3])
    print(f"sft speed ratio (budget {best_sft[1]} / 8192): {best_sft[3]:.2f}")
    print(f"sft float32/bf16 speed ratio: {bf16 / fp32:.2f}")
    print(f"rl generated-only/full head speed ratio: {every / generated:.2f}")


def attention_rows(new_model, samples, args) -> list[tuple[str, int, float, float]]:
    """RL steps under eager (the baseline) and SDPA attention, on the demo's episodes and on long rows."""
    long_rows, ids, mask = [], [], []
    for s in samples:  # episodes end to end until a row is --long-tokens long
        ids, mask = ids + list(s.token_ids), mask + list(s.loss_mask)
        if len(ids) >= args.long_tokens:
            long_rows.append(SimpleNamespace(token_ids=ids[: args.long_tokens], loss_mask=mask[: args.long_tokens]))
            ids, mask = [], []
    rows = []
    for what, data, budget, per_step in (
        ("demo episodes", samples, 4096, 64),
        (f"{args.long_tokens}-token episodes", long_rows, 2 * args.long_tokens, 8),
    ):
        steps = min(args.rl_steps, len(data) // per_step - 1)
        if steps < 1:
            print(f"rl   {what}: fewer than {2 * per_step} rows, skipped (lower --long-tokens)", flush=True)
            continue
        eager = time_rl(new_model, data, budget, steps, "eager", per_step)
        sdpa = time_rl(new_model, data, budget, steps, "sdpa", per_step)
        rows.append((f"RL train_step ({per_step} {what}), eager attention (baseline)", budget, eager, 1.0))
        rows.append((f"RL train_step ({per_step} {what}), SDPA", budget, sdpa, eager / sdpa))
        print(f"rl   {what}: sdpa {sdpa:.3f} s/step against eager {eager:.3f}: x{eager / sdpa:.2f}", flush=True)
    return rows


def report(rows, samples, args) -> None:
    lengths = sorted(len(s.token_ids) for s in samples)
    table = ["| what | token budget | s/step | speed vs its baseline |", "|---|---|---|---|"]
    table += [f"| {w} | {b} | {t:.3f} | {r:.2f}x |" for w, b, t, r in rows]
    text = (
        f"# Training speed ({args.threads} threads)\n\n{len(samples)} demo expert episodes, "
        f"tokens min/median/max {lengths[0]}/{lengths[len(lengths) // 2]}/{lengths[-1]}.\n\n" + "\n".join(table) + "\n"
    )
    atomic_write_text(RESULTS, text)
    print("\n".join(table))


if __name__ == "__main__":
    main()
