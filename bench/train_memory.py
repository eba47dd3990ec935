"""The RL trainer's memory and speed, this tree against a base revision, in one run (issue 34).

1. Memory of one train step of a Qwen2.5-0.5B-shaped random model on 8,192 generated tokens (4 samples of 512
   prompt + 2,048 generated tokens; one micro-batch of the default 16,384-token budget): the policy's log-probs
   (the rev's own code: padded or packed rows, full or chunked head), a PPO-shaped loss (-sum of log-prob x
   advantage; its memory is one float per token either way), backward, the AdamW step. Neither fits this
   machine for real, so both run on fake tensors (FakeTensorMode) under torch's MemTracker, which counts every
   tensor's storage: parameters, gradients, optimiser state, activations, temporaries. The same step with FSDP
   over one process (a fake process group) shows the sharded path. A cross-check at a small shape (4 layers,
   2 x 512 tokens) runs the same step on real and on fake tensors, and reads the process's peak RSS as well.
2. Speed: trainer tokens/s (train_step, warm-up excluded) on the demo's model and samples (its RL settings:
   budget 4,096, 2 epochs, 64 samples a step) and on the 0.5B shape cut to --layers decoder layers (the full
   vocabulary) with lengths uniform in 256-4,096, a quarter of each generated; base rev, then this tree with
   packing off and on.
Each measurement runs in a fresh subprocess with PYTHONPATH at the rev's src/ (a `git worktree` of the base
revision at /tmp/wt-REV). Table to stdout and bench/results/train_memory.md.

    flock /tmp/asearch-heavy.lock .venv/bin/python bench/train_memory.py              # ~15 minutes, <= 8 GB
    .venv/bin/python bench/train_memory.py --only cross,fake --layers 1               # quicker parts
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import ROOT, worktree  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "train_memory.md"
SHAPE_05B = {
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}  # fmt: skip  (bench/gpu_check.py's SHAPES["qwen2.5-0.5b"])
GIB = 2**30


# --------------------------------------------------------------------------- the workers (one per subprocess)


def _samples(n: int, prompt: int, generated: int, vocab: int, seed: int = 0):
    from asearch.rl.trainer import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = prompt + generated
        ids = [rng.randrange(5, vocab) for _ in range(length)]
        behav = [-rng.random() * 5 for _ in range(length)]
        out.append(Sample(ids, [0] * prompt + [1] * generated, behav, [0] * length, 1.0 if i % 2 else -1.0))
    return out


def _trainer(model, trainer_keys: dict, fsdp: bool):
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig

    cfg = TrainerConfig(**trainer_keys)
    if not fsdp:
        return PolicyTrainer(model, cfg)
    import torch
    import torch.distributed as dist

    from asearch.net import free_port
    from asearch.rl.distributed import DistEnv, DistributedPolicyTrainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    return DistributedPolicyTrainer(model, cfg, env=DistEnv(0, 1, 0, torch.device("cpu")))


def _one_step(trainer, samples) -> None:
    """What a train step does that holds memory: log-probs, loss and backward per micro-batch, the AdamW step."""
    import torch

    from asearch.models.device import autocast
    from asearch.rl.trainer import PolicyTrainer, sequence_logprobs

    trainer.model.train()
    generated = sum(s.n_generated for s in samples)
    # the one-process grouping (an FSDP trainer's also all-reduces the count: a value fake tensors lack)
    for idx in PolicyTrainer._micro_batches(trainer, samples, list(range(len(samples)))):
        rows = [samples[i] for i in idx]
        with autocast(trainer.device, trainer.compute_dtype):
            if hasattr(trainer, "_logprobs"):
                lp = trainer._logprobs(trainer.model, rows)
            else:  # the base revision
                lp = sequence_logprobs(trainer.model, rows, 1.0, generated_only=True)
        weight = torch.zeros(lp.shape)
        for r, s in enumerate(rows):
            weight[r, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32) * s.advantage
        (-(lp * weight.to(lp.device)).sum() / generated).backward()
    master = getattr(trainer, "master", None)
    if master is not None:
        master.grads_in()
    trainer.optimizer.step()
    if master is not None:
        master.weights_out()


def _count_nonzero_as(count: int) -> None:
    """Fake tensors have no values, so a boolean selection's size is unknown: the base revision's `hidden[sel]`
    (sel: the loss mask, one micro-batch) is told it selects `count` positions, the step's generated tokens."""
    import torch
    from torch._subclasses import fake_impls

    def nonzero(fake_mode, func, arg):  # noqa: ANN001, ANN202
        return arg.new_empty((count, arg.dim()), dtype=torch.int64)

    fake_impls.op_implementations_dict[torch.ops.aten.nonzero.default] = nonzero


def _skip_noop_moves() -> None:
    """`module.to(device)` where the module already is: a no-op (FSDP's shard_model calls it), which fake
    parameters cannot go through (their conversion swaps tensors that the fake mode holds weak references to)."""
    import torch

    real_to = torch.nn.Module.to

    def to(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is None and all(device is None or p.device == device for p in self.parameters()):
            return self
        return real_to(self, *args, **kwargs)

    torch.nn.Module.to = to


def memory_worker(spec: dict) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import Qwen2Config, Qwen2ForCausalLM

    warnings.filterwarnings("ignore")  # MemTracker's module-hierarchy notes
    torch.set_num_threads(spec.get("threads", 2))
    torch.manual_seed(0)
    shape = SHAPE_05B | {"num_hidden_layers": spec["layers"]} | spec.get("shape", {})
    samples = _samples(spec["samples"], spec["prompt"], spec["generated"], shape["vocab_size"])
    if spec["fake"]:
        _count_nonzero_as(sum(s.n_generated for s in samples))
        _skip_noop_moves()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with FakeTensorMode() if spec["fake"] else contextlib.nullcontext():
        if spec["trainer"].get("param_dtype") == "bfloat16":  # born bf16: fake parameters cannot be swapped by .to()
            torch.set_default_dtype(torch.bfloat16)
        model = Qwen2ForCausalLM(Qwen2Config(**shape, attn_implementation="sdpa"))
        torch.set_default_dtype(torch.float32)
        trainer = _trainer(model, spec["trainer"], spec.get("fsdp", False))
        tracker = MemTracker()
        tracker.track_external(trainer.model, trainer.optimizer)
        with tracker:
            _one_step(trainer, samples)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak": peak, "rss_peak": rss, "rss_before": rss_before}


def speed_worker(spec: dict) -> dict:
    import torch

    from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    if spec["model"] == "demo":
        sys.path.insert(0, str(ROOT / "bench"))
        from train_speed import demo_samples

        episodes, new_model = demo_samples(spec["questions"])
        model = new_model()
        samples = [
            Sample(s.token_ids, s.loss_mask, [-1.0] * len(s.token_ids), [0] * len(s.token_ids), (-1.0) ** i)
            for i, s in enumerate(episodes)
        ]
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE_05B | {"num_hidden_layers": spec["layers"]}, attn_implementation="sdpa"))
        rng = random.Random(0)
        samples = []
        for _ in range(spec["per_step"] * spec["steps"] + 1):
            n = rng.randint(256, 4096)
            samples += _samples(1, n - n // 4, n // 4, SHAPE_05B["vocab_size"], seed=rng.randrange(1 << 30))
    trainer = PolicyTrainer(model, TrainerConfig(**spec["trainer"]), total_steps=spec["steps"] + 1)
    per = spec["per_step"]
    trainer.train_step(samples[-1:], policy_version=0)  # warm-up: lazy initialisations, the optimiser's state
    tokens, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    for k in range(spec["steps"]):
        batch = samples[per * k : per * (k + 1)]
        trainer.train_step(batch, policy_version=0)
        tokens += sum(len(s.token_ids) for s in batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu, "tokens": tokens}


# --------------------------------------------------------------------------- the driver


def run(kind: str, spec: dict, src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(spec.get("threads", 2))}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", kind, json.dumps(spec)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_rows(args, base_src: Path, args_src: Path) -> list[str]:
    step = {"samples": 4, "prompt": 512, "generated": 2048, "layers": 24, "fake": True}
    mine = {"token_budget": 16384}
    variants = [
        ("base rev", base_src, {"token_budget": 16384}),
        ("this tree, checkpointing off (the CPU default)", args_src, mine | {"activation_checkpointing": False}),
        ("this tree, checkpointing on (the CUDA default)", args_src, mine | {"activation_checkpointing": True}),
        ("this tree, checkpointing on, bf16 parameters", args_src, mine | {"activation_checkpointing": True, "param_dtype": "bfloat16"}),
    ]  # fmt: skip
    rows = ["| step (0.5B shape, 8,192 generated of 10,240 tokens, fake tensors) | peak GiB | vs base |", "|---|---|---|"]
    base = {}
    for what, src, trainer in variants:
        got = run("memory", step | {"trainer": trainer, "threads": args.threads}, src)["peak"]
        ref = base.setdefault("base", got)
        rows.append(f"| {what} | {got / GIB:.2f} | {got / ref:.2f} |")
        print(rows[-1], flush=True)
    return rows


def fsdp_rows(args, base_src: Path, args_src: Path) -> list[str]:
    """FSDP over one gloo process, real tensors (fake ones do not go through DTensor's sharding), at a shape that
    fits: the 0.5B shape's vocabulary with hidden 256 and 2 layers, 2 x (128 prompt + 384 generated) tokens."""
    shape = {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2}
    step = {"samples": 2, "prompt": 128, "generated": 384, "layers": 2, "shape": shape, "fake": False, "fsdp": True}
    step["threads"] = args.threads
    rows = ["| FSDP world 1 (gloo), vocabulary 151,936, hidden 256, 2 layers, 768 generated of 1,024 tokens, real "
            "| peak GiB | vs base |", "|---|---|---|"]  # fmt: skip
    base = None
    for what, src, trainer in (
        ("base rev (full logits at every position)", base_src, {"token_budget": 16384}),
        ("this tree, checkpointing off", args_src, {"activation_checkpointing": False}),
        ("this tree, checkpointing on", args_src, {"activation_checkpointing": True}),
    ):
        got = run("memory", step | {"trainer": trainer}, src)["peak"]
        base = base or got
        rows.append(f"| {what} | {got / GIB:.2f} | {got / base:.2f} |")
        print(rows[-1], flush=True)
    return rows


def cross_rows(args, base_src: Path, args_src: Path) -> list[str]:
    step = {"samples": 2, "prompt": 256, "generated": 256, "layers": 4, "threads": args.threads}
    rows = ["| cross-check (4 layers, 2 x 512 tokens) | fake peak GiB | real peak GiB | real RSS rise GiB |", "|---|---|---|---|"]
    for what, src, trainer in (
        ("base rev", base_src, {"token_budget": 16384}),
        ("this tree, checkpointing on", args_src, {"activation_checkpointing": True}),
    ):
        fake = run("memory", step | {"fake": True, "trainer": trainer}, src)
        real = run("memory", step | {"fake": False, "trainer": trainer}, src)
        rise = real["rss_peak"] - real["rss_before"]
        rows.append(f"| {what} | {fake['peak'] / GIB:.3f} | {real['peak'] / GIB:.3f} | {rise / GIB:.3f} |")
        print(rows[-1], flush=True)
    return rows


def speed_rows(args, base_src: Path, args_src: Path) -> list[str]:
    """Wall-clock tokens/s, and tokens per CPU-second of the process (all its threads): the figure that a
    machine shared with other jobs disturbs least."""
    rows = ["| trainer tokens/s (tokens per CPU-second) | base rev | packing off | packing on | on vs base |",
            "|---|---|---|---|---|"]  # fmt: skip
    demo = {"model": "demo", "questions": 600, "per_step": 64, "steps": args.demo_steps, "threads": args.threads}
    demo_trainer = {"token_budget": 4096, "epochs": 2}
    big = {"model": "0.5b", "layers": args.layers, "per_step": args.per_step, "steps": args.big_steps, "threads": args.threads}
    models = {
        "demo": ("demo model and samples (budget 4,096, 2 epochs, 64 samples)", demo, demo_trainer),
        "0.5b": (f"0.5B shape, {args.layers} layers, lengths 256-4,096 ({args.per_step} samples)", big, {"token_budget": 16384}),
    }  # fmt: skip
    for what, spec, trainer in (models[m] for m in args.speed_models.split(",")):
        base = run("speed", spec | {"trainer": trainer}, base_src)
        off = run("speed", spec | {"trainer": trainer | {"packing": False}}, args_src)
        on = run("speed", spec | {"trainer": trainer | {"packing": True}}, args_src)
        cells = [f"{r['tokens_per_s']:,.0f} ({r['tokens_per_cpu_s']:,.0f})" for r in (base, off, on)]
        ratio = f"{on['tokens_per_s'] / base['tokens_per_s']:.2f}x ({on['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x)"
        rows.append(f"| {what} | {' | '.join(cells)} | {ratio} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-rev", default="1685d1a")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="memory,fsdp,cross,speed", help="comma-separated: memory, fsdp, cross, speed")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the 0.5B shape in the speed part")
    ap.add_argument("--per-step", type=int, default=8, help="samples a step, 0.5B-shape speed part")
    ap.add_argument("--big-steps", type=int, default=1)
    ap.add_argument("--demo-steps", type=int, default=4)
    ap.add_argument("--speed-models", default="demo,0.5b", help="comma-separated rows of the speed part: demo, 0.5b")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, spec = args.worker
        out = (memory_worker if kind == "memory" else speed_worker)(json.loads(spec))
        print(json.dumps(out))
        return
    base_src, args_src = worktree(args.baseline_rev) / "src", ROOT / "src"
    parts = {"memory": memory_rows, "fsdp": fsdp_rows, "cross": cross_rows, "speed": speed_rows}
    tables = [parts[p](args, base_src, args_src) for p in args.only.split(",")]
    text = f"# RL trainer memory and speed against {args.baseline_rev} ({args.threads} threads)\n\n"
    text += "\n\n".join("\n".join(t) for t in tables) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
