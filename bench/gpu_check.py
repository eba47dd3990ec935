"""The GPU check: the in-process engine, the trainer and a short asynchronous RL run on one GPU, nothing downloaded.

A random-initialised model of Qwen2.5-0.5B's shape (built from its config: 24 layers, hidden 896, 14 query and 2
KV heads, vocabulary 151,936, tied embeddings) in the device's dtype (bfloat16 on a GPU), then:
0. parity: the engine's greedy tokens and log-probs (float32 and bfloat16) against a float32 `transformers` forward;
1. decode: the in-process engine's output tokens/s at batch 1, 64 and 256 (prompt `--prompt` tokens, exactly
   `--new` sampled tokens per request), beside `transformers` `generate` on the same model in the same run; on a
   GPU the engine runs with its CUDA graphs (the default) and again with `cuda_graphs=false`;
2. train: `PolicyTrainer.train_step` tokens/s on synthetic episodes (the last half of each generated) and the
   model FLOPs utilisation, MFU = model FLOPs per second / the chip's dense bf16 peak, where model FLOPs per
   token = 6 x (non-embedding parameters) + 6 x layers x hidden x sequence length (causal attention, forward and
   backward) and the LM head's 6 x vocabulary x hidden on the generated tokens only (the trainer applies the
   head there alone);
3. rl: the CPU demo's whole pipeline (worlds, expert SFT, fully asynchronous RL with held-out accuracy before
   and after) shrunk to minutes, on the GPU (`asearch demo` with the overrides in `RL_OVERRIDES`);
4. long: the same for `asearch demo --preset long` (access, reading turns, 1-6 hops) with a ~26M-parameter model
   (`LONG_OVERRIDES`), plus its mean held-out turns and the share of correct episodes that used `access`.
5. plan: `asearch plan`'s predicted peak memory against the measured one (torch.cuda.max_memory_allocated on a
   GPU) for one train step (checkpointing off and on, LoRA, the KL reference) and one engine step of random Qwen2
   models up to the 0.5B shape (bench/plan_calibration.py);
6. weights: weight sync from a DistributedPolicyTrainer of world size 1 (NCCL on a GPU) to an `asearch engine
   serve` process on the same device, by disk (float32, bfloat16) and over a weight group, in seconds per GB
   (bench/weight_sync.py).
Each phase appends its rows to the JSON file as it finishes, so a run cut short keeps what it measured; the
table is printed at the end. `--shape tiny` runs the same code on a CPU in seconds (tests/bench/test_gpu_check.py).

    python bench/gpu_check.py --out gpu_check.json                   # on a GPU: every phase (parity ... long)
    python bench/gpu_check.py --phases long --out gpu_long.json      # the long preset alone (not yet run on a GPU)
    python bench/gpu_check.py --shape tiny --device cpu --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "tiny": {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024, "rope_theta": 1e4,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
}  # fmt: skip

# Dense bf16 peak FLOP/s (no sparsity) by device-name fragment: the MFU denominator.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}

# The demo shrunk to a few minutes: 16 worlds of 300 entities, 1,000 SFT steps, 120 s of RL; a wider model than the CPU's.
RL_OVERRIDES = [
    "world_entities=300", "heldout_entities=300", "train_worlds=16", "train_questions=300", "rl_questions=50",
    "expert_episodes=9600", "heldout_questions=100", "heldout_during_rl=100", "hidden=256", "layers=4", "heads=4",
    "sft.steps=1000", "rl.max_rl_seconds=120", "rl.heldout.every_s=30", "rl.engine.max_batch=256",
    "rl.rollout.max_concurrent=64", "setup_threads=8",
]  # fmt: skip
TINY_RL_OVERRIDES = [
    "world_entities=150", "heldout_entities=150", "train_worlds=2", "train_questions=30", "rl_questions=6",
    "expert_episodes=30", "heldout_questions=9", "heldout_during_rl=3", "vocab_size=400", "hidden=32", "layers=1",
    "heads=2", "sft.steps=3", "sft.batch_size=4", "rl.max_rl_seconds=10", "rl.steps=2", "rl.heldout.every_s=1",
    "setup_threads=1", "rl.rollout.batch_size=1", "rl.rollout.group_size=2", "rl.rollout.max_concurrent=2",
    "rl.agent.max_turns=3", "rl.rollout.drop_zero_variance=false",
]  # fmt: skip


# Issue 16's GPU part: the long-horizon preset (access, reading turns, 1-6 hops) with a ~26M-parameter model from
# scratch (hidden 512, 8 layers: 12 x 512^2 x 8 in the blocks); SFT and RL shortened to fit a lent device's minutes.
LONG_OVERRIDES = [
    "hidden=512", "layers=8", "heads=8", "setup_threads=8", "sft.steps=1200", "sft.batch_size=32",
    "sft.token_budget=16384", "sft.optim.lr=1e-3", "rl.max_rl_seconds=180", "rl.heldout.every_s=60",
    "rl.engine.max_batch=256", "rl.rollout.max_concurrent=64", "rl.trainer.token_budget=16384",
]  # fmt: skip
# Every phase, in the order a default run takes them (the long RL runs last).
PHASES = ("parity", "decode", "train", "plan", "weights", "rl", "long")
# phase -> (demo preset, overrides on a GPU, overrides at the tiny shape)
DEMO_PHASES = {"rl": ("default", RL_OVERRIDES, TINY_RL_OVERRIDES), "long": ("long", LONG_OVERRIDES, TINY_RL_OVERRIDES)}


def build_model(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


# --------------------------------------------------------------------------- 0. parity


async def engine_greedy(model, device: str, dtype: str, prompts: list[list[int]], new: int) -> list[Any]:
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    cfg = InProcessEngineConfig(
        device=device, dtype=dtype, max_batch=len(prompts), max_seq_len=max(map(len, prompts)) + new + 1, prefix_cache_mb=0
    )
    engine = InProcessEngine(model, None, cfg=cfg)
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=new)
        return await asyncio.gather(*(engine.generate(GenerateRequest(input_ids=p, sampling=greedy)) for p in prompts))
    finally:
        await engine.close()


def parity_rows(model, args) -> list[dict[str, Any]]:
    """The engine's greedy tokens and log-probs against a float32 `transformers` forward of the same sequences."""
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 17, 33, 64)]
    rows = []
    for dtype in ("float32", "bfloat16"):
        outs = asyncio.run(engine_greedy(model, args.device, dtype, prompts, args.parity_new))
        worst, agree, total = 0.0, 0, 0
        for prompt, out in zip(prompts, outs, strict=True):
            ids = torch.tensor([prompt + out.output_ids], device=dev)
            with torch.inference_mode():
                lp = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
            tokens = torch.tensor(out.output_ids, device=dev)
            ref = lp.gather(1, tokens[:, None])[:, 0]
            worst = max(worst, (ref - torch.tensor(out.output_logprobs, device=dev)).abs().max().item())
            agree += int((lp.argmax(-1) == tokens).sum())
            total += len(tokens)
        rows.append({"phase": "parity", "engine_dtype": dtype, "tokens": total, "max_abs_logprob_diff": worst,
                     "argmax_agreement": agree / total})  # fmt: skip
        print(f"parity {dtype}: max |log-prob diff| {worst:.2e}, greedy = reference argmax on {agree}/{total} tokens", flush=True)
    return rows


# --------------------------------------------------------------------------- 1. decode


async def engine_tokens_per_s(model, device: str, batch: int, prompt: int, new: int, cuda_graphs: bool | str = "auto") -> tuple[float, int]:
    """Output tokens/s of the in-process engine decoding `batch` requests at once (after a short warm-up), and
    the CUDA graphs it captured (engine.cuda_graphs: auto = on for CUDA; 0 on the CPU)."""
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    vocab = model.config.vocab_size
    cfg = InProcessEngineConfig(
        device=device, max_batch=batch, max_seq_len=prompt + new + 1, prefix_cache_mb=0,
        max_prefill_tokens=max(8192, prompt * min(batch, 64)), threads=max(1, min(4, os.cpu_count() or 1)),
        cuda_graphs=cuda_graphs,
    )  # fmt: skip
    engine = InProcessEngine(model, None, cfg=cfg)
    gen = torch.Generator().manual_seed(batch)

    def request(i: int, n: int) -> GenerateRequest:
        ids = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        return GenerateRequest(input_ids=ids, sampling=SamplingParams(temperature=1.0, max_new_tokens=n, seed=i))

    try:
        await asyncio.gather(*(engine.generate(request(i, 4)) for i in range(batch)))  # warm-up: kernels, cache
        t = time.perf_counter()
        out = await asyncio.gather(*(engine.generate(request(i, new)) for i in range(batch)))
        wall = time.perf_counter() - t
        graphs = engine.stats()["cuda_graphs"]
    finally:
        await engine.close()
    return sum(len(r.output_ids) for r in out) / wall, graphs


def hf_generate_tokens_per_s(model, batch: int, prompt: int, new: int) -> float:
    """Output tokens/s of `model.generate` (sampling, exactly `new` tokens per row) on the same batch shape."""
    dev = next(model.parameters()).device
    vocab = model.config.vocab_size

    def run(n: int) -> float:
        ids = torch.randint(0, vocab, (batch, prompt), device=dev)
        _sync(dev)
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
        _sync(dev)
        return (out.shape[1] - prompt) * batch / (time.perf_counter() - t)

    run(4)
    return run(new)


def decode_rows(model, args) -> list[dict[str, Any]]:
    rows = []
    for batch in args.batches:
        ours, graphs = asyncio.run(engine_tokens_per_s(model, args.device, batch, args.prompt, args.new))
        # on a GPU the same engine without CUDA graphs too (engine.cuda_graphs=false): what the graphs bring
        eager = asyncio.run(engine_tokens_per_s(model, args.device, batch, args.prompt, args.new, False))[0] if graphs else None
        theirs = hf_generate_tokens_per_s(model, batch, args.prompt, args.new)
        rows.append({
            "phase": "decode", "batch": batch, "prompt": args.prompt, "new": args.new,
            "engine_tokens_per_s": ours, "hf_generate_tokens_per_s": theirs, "ratio": ours / theirs,
            "cuda_graphs": graphs, "engine_without_graphs_tokens_per_s": eager,
        })  # fmt: skip
        without = f", without CUDA graphs {eager:10.0f} tok/s ({graphs} graphs)" if eager is not None else ""
        print(f"decode batch {batch:4d}: engine {ours:10.0f} tok/s, transformers generate {theirs:10.0f} tok/s, x{ours / theirs:.2f}{without}", flush=True)
    return rows


# --------------------------------------------------------------------------- 2. train


def train_rows(model, args, peak: float | None) -> list[dict[str, Any]]:
    """Tokens/s and MFU of `PolicyTrainer.train_step` at sequence length `--train-len`."""
    from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig

    cfg = model.config
    dev = next(model.parameters()).device
    policy = model.float().train()  # float32 master weights, bf16 autocast compute (trainer.dtype auto)
    trainer = PolicyTrainer(policy, TrainerConfig(dtype=args.train_dtype, token_budget=args.train_budget))
    gen = torch.Generator().manual_seed(0)
    L, half = args.train_len, args.train_len // 2
    samples = [
        Sample(torch.randint(0, cfg.vocab_size, (L,), generator=gen).tolist(), [0] * half + [1] * (L - half),
               [-2.0] * L, [0] * L, 1.0 if i % 2 else -1.0)
        for i in range(args.train_samples)
    ]  # fmt: skip
    trainer.train_step(samples, policy_version=0)  # warm-up
    _sync(dev)
    t = time.perf_counter()
    for _ in range(args.train_steps):
        stats = trainer.train_step(samples, policy_version=0)
    _sync(dev)
    wall = (time.perf_counter() - t) / args.train_steps
    tokens = L * len(samples)
    H, layers, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    non_embedding = sum(p.numel() for p in policy.parameters()) - V * H
    flops = 6 * non_embedding * tokens + 6 * layers * H * L * tokens + 6 * V * H * (L - half) * len(samples)
    row = {
        "phase": "train", "samples": len(samples), "seq_len": L, "dtype": str(trainer.compute_dtype),
        "step_s": wall, "tokens_per_s": tokens / wall, "tflops_per_s": flops / wall / 1e12,
        "mfu": flops / wall / peak if peak else None, "loss": stats.get("loss/policy"),
        "peak_memory_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
    }  # fmt: skip
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a (no known peak)"
    print(f"train: {row['tokens_per_s']:.0f} tok/s, {row['tflops_per_s']:.1f} TFLOP/s, MFU {mfu}, {wall:.2f} s/step", flush=True)
    return [row]


# --------------------------------------------------------------------------- 3. rl


def rl_rows(args, out_dir: Path, phase: str = "rl") -> list[dict[str, Any]]:
    """A demo preset's whole pipeline, shrunk, on this device (phase rl: the default preset; long: the long-horizon
    one with a model of ~26M parameters); its summary as one row."""
    from asearch.config import load_config
    from asearch.demo.pipeline import DemoConfig, run_demo
    from asearch.demo.presets import preset

    preset_name, gpu_overrides, tiny_overrides = DEMO_PHASES[phase]
    overrides = tiny_overrides if args.shape == "tiny" else gpu_overrides
    overrides = [*overrides, f"sft.device={args.device}", f"rl.trainer.device={args.device}", f"rl.engine.device={args.device}"]
    run = out_dir / f"{phase}-demo"
    cfg = load_config(
        DemoConfig, None, [f"seed={args.seed}", f"out={run}", *overrides], base=preset(preset_name)
    )
    t = time.perf_counter()
    summary = run_demo(cfg, log=lambda m: print(f"  {phase} | {m}", flush=True))
    metrics = _last_metrics(run / "rl" / "metrics.jsonl")
    row = {
        "phase": phase, "overrides": overrides, "wall_s": time.perf_counter() - t,
        "setup_s": summary["setup_seconds"], "sft_s": summary["sft_seconds"], "rl_s": summary["rl_wall_seconds"],
        "rl_steps": summary["rl_steps"], "heldout_before": summary["heldout_acc_before"],
        "heldout_after": summary["heldout_acc_after"], "parameters": summary["parameters"],
        "rejected_groups": summary["rejected_groups"],
        "mean_turns_after": summary.get("heldout_mean_turns_after"),
        "access_rate_correct": summary.get("heldout_access_rate_correct"),
        "trajectories_per_s": metrics.get("perf/trajectories_per_s"), "staleness_mean": metrics.get("staleness/mean"),
    }  # fmt: skip
    print(f"{phase}: {row['rl_steps']} steps in {row['rl_s']:.0f} s, held-out {row['heldout_before']:.3f} -> "
          f"{row['heldout_after']:.3f}", flush=True)  # fmt: skip
    return [row]


# --------------------------------------------------------------------------- 5. plan

# bench/plan_calibration.py's shapes the plan phase measures: up to the real 0.5B shape on a GPU, the smallest on a CPU.
PLAN_SHAPES = {"qwen2.5-0.5b": ["large", "qwen2.5-0.5b"], "tiny": ["small"]}


def plan_rows(args) -> list[dict[str, Any]]:
    from plan_calibration import calibration_rows

    rows = calibration_rows(PLAN_SHAPES[args.shape], device=args.device)
    for r in rows:
        print(f"plan {r['what']} {r['shape']}: predicted {r['predicted'] / 2**30:.2f} GiB, measured "
              f"{r['measured'] / 2**30:.2f} GiB ({r['error']:+.1%})", flush=True)  # fmt: skip
    return [{"phase": "plan", **{k: v for k, v in r.items() if isinstance(v, int | float | str | bool | None)}} for r in rows]


def _last_metrics(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[-1] if lines else {}


# --------------------------------------------------------------------------- driver


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(device), "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, memory_gib=props.total_memory / 2**30, sms=props.multi_processor_count)
    return env


def table(result: dict[str, Any]) -> str:
    lines = [f"GPU check on {result['env'].get('gpu', result['env']['device'])} (torch {result['env']['torch']}), shape {result['shape']}", ""]
    for r in (r for r in result["rows"] if r["phase"] == "parity"):
        lines.append(f"parity, engine in {r['engine_dtype']}: max |log-prob - float32 transformers| {r['max_abs_logprob_diff']:.2e}, "
                     f"greedy token = reference argmax on {r['argmax_agreement']:.1%} of {r['tokens']}")  # fmt: skip
    decode = [r for r in result["rows"] if r["phase"] == "decode"]
    if decode:
        lines += ["", "| batch | in-process engine tok/s | transformers generate tok/s | ratio | engine without CUDA graphs tok/s |",
                  "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in decode:
        eager = r.get("engine_without_graphs_tokens_per_s")
        lines.append(f"| {r['batch']} | {r['engine_tokens_per_s']:,.0f} | {r['hf_generate_tokens_per_s']:,.0f} | {r['ratio']:.2f} | "
                     + (f"{eager:,.0f} |" if eager is not None else "- |"))  # fmt: skip
    for r in (r for r in result["rows"] if r["phase"] == "train"):
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        lines += ["", f"trainer: {r['samples']} x {r['seq_len']} tokens per step, {r['dtype']}: {r['tokens_per_s']:,.0f} tok/s, "
                  f"{r['tflops_per_s']:.1f} TFLOP/s, MFU {mfu}, {r['step_s']:.2f} s/step"]  # fmt: skip
    for r in (r for r in result["rows"] if r["phase"] in ("rl", "long")):
        name = "demo" if r["phase"] == "rl" else "long-horizon preset"
        lines += ["", f"async RL ({name}, {r['parameters']:,} parameters): set-up {r['setup_s']:.0f} s, SFT {r['sft_s']:.0f} s, "
                  f"RL {r['rl_s']:.0f} s = {r['rl_steps']} steps ({sum(r['rejected_groups'].values())} groups rejected), "
                  f"held-out {r['heldout_before']:.3f} -> {r['heldout_after']:.3f}"]  # fmt: skip
        if r["mean_turns_after"] is not None:
            access = "none correct" if r["access_rate_correct"] is None else f"{r['access_rate_correct']:.2f}"
            lines[-1] += f", {r['mean_turns_after']:.1f} turns an episode after, correct ones using access: {access}"
    plan = [r for r in result["rows"] if r["phase"] == "plan"]
    if plan:
        lines += ["", "| memory plan: what | shape | checkpointing | predicted GiB | measured GiB | error |",
                  "|---|---|---|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {r['what']} | {r['shape']} | {'on' if r.get('checkpointing') else 'off'} | {r['predicted'] / 2**30:.2f} "
                  f"| {r['measured'] / 2**30:.2f} | {r['error']:+.1%} |" for r in plan]  # fmt: skip
    for r in (r for r in result["rows"] if r["phase"] == "weights"):
        what = f"{r['seconds']:.2f} s for {r['gb']:.2f} GB = {r['s_per_gb']:.2f} s/GB" if "error" not in r else f"failed: {r['error']}"
        lines += [f"weight sync {r['method']} ({r['backend']}): {what}"]
    for name, err in result["errors"].items():
        lines += ["", f"{name} FAILED: {err.strip().splitlines()[-1]}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from asearch.files import atomic_write_json
    from asearch.models.device import resolve_device, resolve_dtype

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated: {', '.join(PHASES)}")
    ap.add_argument("--parity-new", type=int, default=24, help="greedy tokens per prompt in the parity phase")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64, 256])
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per request")
    ap.add_argument("--new", type=int, default=128, help="sampled tokens per request")
    ap.add_argument("--train-len", type=int, default=2048)
    ap.add_argument("--train-samples", type=int, default=32)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--train-budget", type=int, default=16384, help="trainer.token_budget")
    ap.add_argument("--train-dtype", default="auto", help="trainer.dtype")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="where the RL phase's demo run goes (default: beside --out)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    args.device = str(device)
    result: dict[str, Any] = {"shape": args.shape, "env": environment(device), "rows": [], "errors": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(result["env"]), flush=True)
    phases = args.phases.split(",")
    if unknown := set(phases) - set(PHASES):
        ap.error(f"unknown phases {sorted(unknown)} ({', '.join(PHASES)})")
    for phase in phases:
        t = time.perf_counter()
        try:
            if phase == "parity":
                rows = parity_rows(build_model(args.shape, device, torch.float32), args)
            elif phase == "decode":
                rows = decode_rows(build_model(args.shape, device, resolve_dtype("auto", device)), args)
            elif phase == "train":
                rows = train_rows(build_model(args.shape, device, torch.float32), args, peak_flops(device))
            elif phase == "weights":  # weight sync to a server on this device (bench/weight_sync.py)
                from weight_sync import gpu_check_rows

                rows = gpu_check_rows(args.shape, args.device)
            elif phase == "plan":  # the memory plan against the measured peak (bench/plan_calibration.py)
                rows = plan_rows(args)
            else:
                rows = rl_rows(args, args.work or args.out.parent, phase)
            result["rows"] += rows
        except Exception:  # one phase failing must not lose the others' numbers
            result["errors"][phase] = traceback.format_exc()
            print(result["errors"][phase], file=sys.stderr, flush=True)
        result.setdefault("phase_seconds", {})[phase] = time.perf_counter() - t
        if device.type == "cuda":
            torch.cuda.empty_cache()
        atomic_write_json(args.out, result)
    print(table(result), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
