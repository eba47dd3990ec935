"""The memory plan (asearch.launch.plan) against measured peaks: one RL train step and one in-process engine step.

Train: a random Qwen2 of the given shape, `PolicyTrainer.train_step` on rows of `--row` tokens (the last
`--generated` share of each generated), two micro-batches a step, after one warm-up step (AdamW's moments
exist, as in every later step). Engine: the in-process decoder's weights, its KV-cache rectangle (max_batch x
max_seq_len) and one prefill and one decode forward. On a CPU the peak is the bytes of live tensor storages,
tracked by a TorchDispatchMode (`LiveTensorBytes`; no allocator statistics there); on CUDA it is
torch.cuda.max_memory_allocated. `calibration_rows` is what bench/gpu_check.py can call on a GPU.

    flock /tmp/asearch-heavy.lock .venv/bin/python bench/plan_calibration.py            # three shapes, ~6 min
    .venv/bin/python bench/plan_calibration.py --shapes small --device cpu              # one small shape
"""

from __future__ import annotations

import argparse
import gc
import json
import weakref
from dataclasses import replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from asearch.launch.plan import (
    ModelShape,
    ServerSettings,
    TrainerSettings,
    optimizer_step_bytes,
    server_components,
    trainer_components,
)

# (name, shape, rows of `row` tokens per micro-batch, row tokens): the CPU shapes fit in a few GB.
SHAPES: dict[str, tuple[ModelShape, int, int]] = {
    "small": (ModelShape("hidden256-l2", 8000, 256, 2, 4, 2, 768, qkv_bias=True), 4, 256),
    "medium": (ModelShape("hidden512-l4", 16000, 512, 4, 8, 2, 1536, qkv_bias=True), 4, 512),
    "large": (ModelShape("hidden896-l6", 32000, 896, 6, 14, 2, 4864, qkv_bias=True), 2, 1024),
    "qwen2.5-0.5b": (ModelShape("Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 4864, tie_embeddings=True, qkv_bias=True), 8, 1024),
}


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages alive, and their peak, over the ops run inside it (plus `add`ed tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[tuple[int, int], Any] = {}
        self.current = self.peak = 0

    def add(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[1] == 0 or key in self.live:
            return
        self.live[key] = weakref.ref(storage, lambda _ref, k=key: self._free(k))
        self.current += key[1]
        self.peak = max(self.peak, self.current)

    def _free(self, key: tuple[int, int]) -> None:
        if self.live.pop(key, None) is not None:
            self.current -= key[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.add(t)
        return out


def random_model(shape: ModelShape, device: torch.device, *, attention: str = "sdpa") -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tie_embeddings, max_position_embeddings=max(shape.max_positions, 4096),
        use_sliding_window=False,
    )  # fmt: skip
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).to(device)


def _samples(shape: ModelShape, n: int, row: int, generated: float, seed: int = 0) -> list[Any]:
    from asearch.rl.trainer import Sample

    g = torch.Generator().manual_seed(seed)
    n_gen = max(1, int(row * generated))
    out = []
    for _ in range(n):
        ids = torch.randint(0, shape.vocab, (row,), generator=g).tolist()
        mask = [0] * (row - n_gen) + [1] * n_gen
        out.append(Sample(ids, mask, [-1.0] * row, [0] * row, advantage=float(torch.randn((), generator=g))))
    return out


def _peak_of(fn: Any, device: torch.device, tensors: Any) -> int:
    """Peak bytes while fn() runs: max_memory_allocated on CUDA; on a CPU live storages, counting from those
    of `tensors()` (a callable, so that no reference here keeps one alive once the step frees it)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    tracker = LiveTensorBytes()
    for t in tensors():
        tracker.add(t)
    with tracker:
        fn()
    return tracker.peak


def measure_train_step(shape: ModelShape, rows: int, row: int, *, device: str = "cpu", generated: float = 0.3,
                       checkpointing: bool = False, dtype: str = "auto", lora_r: int = 0,
                       kl_coef: float = 0.0, attention: str = "sdpa") -> dict[str, Any]:  # fmt: skip
    """Predicted and measured peak bytes of one train step (two micro-batches of `rows` x `row` tokens)."""
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig

    dev = torch.device(device)
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in TrainerConfig.model_fields else "gradient_checkpointing"
    cfg = TrainerConfig(device=device, dtype=dtype, token_budget=rows * row, lora={"r": lora_r}, loss={"kl_coef": kl_coef},
                        **{ckpt_key: checkpointing})  # fmt: skip
    trainer = PolicyTrainer(random_model(shape, dev, attention=attention), cfg, temperature=0.7)
    samples = _samples(shape, 2 * rows, row, generated)
    trainer.train_step(samples, policy_version=0)  # AdamW's moments exist from here on

    def state() -> list[Any]:  # parameters, the last step's gradients (zero_grad frees them) and AdamW's moments
        out = [*trainer.model.parameters(), *(p.grad for p in trainer.model.parameters() if p.grad is not None)]
        out += list(trainer.reference.parameters()) if trainer.reference is not None else []
        return out + [t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]

    measured = _peak_of(lambda: trainer.train_step(samples, policy_version=1), dev, state)
    compute = 2 if trainer.compute_dtype != torch.float32 else 4
    settings = TrainerSettings(
        compute_bytes=compute, checkpointing=checkpointing, token_budget=rows * row, row_tokens=row,
        generated_tokens=rows * max(1, int(row * generated)), cuda=dev.type == "cuda",
        logprob_chunk=getattr(cfg, "logprob_chunk", None), lora_r=lora_r, kl_reference=kl_coef > 0 and not lora_r,
        eager_rows=row if attention == "eager" and row < cfg.attention_switch_tokens else 0,
    )  # fmt: skip
    comps = trainer_components(shape, settings)
    predicted = sum(b for _, b in comps) + max(0, optimizer_step_bytes(shape, settings) - sum(
        b for n, b in comps if n in ("activations", "log-prob head")))  # fmt: skip
    what = "train step" + (f", LoRA r={lora_r}" if lora_r else "") + (", KL reference" if kl_coef else "")
    what += ", eager attention" if attention == "eager" else ""
    return {"what": what, "shape": shape.name, "params": shape.params, "tokens": rows * row,
            "checkpointing": checkpointing, "predicted": predicted, "measured": measured,
            "components": dict(comps)}  # fmt: skip


def measure_engine_step(shape: ModelShape, max_batch: int, max_seq_len: int, *, device: str = "cpu",
                        prefill_tokens: int = 2048) -> dict[str, Any]:  # fmt: skip
    """Predicted and measured peak bytes of the in-process decoder at a full KV rectangle: one prefill
    forward of `prefill_tokens` (rows of up to 512) and one decode step of every slot."""
    from asearch.engine.local.decoder import DecoderSpec, DecoderWeights, RoPE, SlotKVCache, forward

    dev = torch.device(device)
    model = random_model(shape, dev)
    spec = DecoderSpec.from_config(model.config)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    weights = DecoderWeights.from_state_dict(spec, model.state_dict(), dtype, dev)
    del model
    rotary = torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim
    rope = RoPE(1.0 / (1e6**rotary), 1.0, max_seq_len, dtype, dev)
    chunk = min(512, prefill_tokens)
    prefill_rows = max(1, min(max_batch, prefill_tokens // chunk))

    def step() -> None:
        cache = SlotKVCache(spec, dtype, max_batch, max_seq_len, dev)
        cache.ensure(max_batch, max_seq_len)
        tokens = torch.randint(0, shape.vocab, (prefill_rows, chunk), device=dev)
        starts = torch.full((prefill_rows,), max_seq_len - chunk - 1, device=dev)
        forward(spec, weights, rope, cache, 0, tokens, starts, torch.full((prefill_rows,), chunk, device=dev))
        tokens = torch.randint(0, shape.vocab, (max_batch, 1), device=dev)
        logits = forward(spec, weights, rope, cache, 0, tokens, torch.full((max_batch,), max_seq_len - 1, device=dev),
                         torch.ones(max_batch, dtype=torch.long, device=dev))  # fmt: skip
        torch.softmax(logits, -1).multinomial(1)

    def tensors() -> list[Any]:
        layers = [getattr(lw, f) for lw in weights.layers for f in lw.__slots__]
        return [weights.embed, weights.final_norm, weights.lm_head, *(t for t in layers if isinstance(t, torch.Tensor))]

    measured = _peak_of(step, dev, tensors)
    settings = ServerSettings(dtype_bytes=dtype.itemsize, max_batch=max_batch, max_seq_len=max_seq_len,
                              max_prefill_tokens=prefill_rows * chunk, prefix_cache_bytes=0)  # fmt: skip
    comps = server_components(replace(shape, max_positions=max_seq_len), settings, None)
    return {"what": "engine step", "shape": shape.name, "params": shape.params, "tokens": max_batch * max_seq_len,
            "checkpointing": False, "predicted": sum(b for _, b in comps), "measured": measured,
            "components": dict(comps)}  # fmt: skip


def calibration_rows(shapes: list[str], device: str = "cpu") -> list[dict[str, Any]]:
    """Predicted against measured at each shape: a train step without and with checkpointing, with LoRA (r=16),
    with the KL reference and (short rows) with eager attention, and an engine step."""
    rows = []
    for name in shapes:
        shape, n_rows, row = SHAPES[name]
        rows.append(measure_train_step(shape, n_rows, row, device=device))
        rows.append(measure_train_step(shape, n_rows, row, device=device, checkpointing=True))
        rows.append(measure_train_step(shape, n_rows, row, device=device, lora_r=16))
        rows.append(measure_train_step(shape, n_rows, row, device=device, kl_coef=0.01))
        if row < 384:  # trainer.attention auto keeps a model's own eager attention on rows this short
            rows.append(measure_train_step(shape, n_rows, row, device=device, attention="eager"))
        rows.append(measure_engine_step(shape, max_batch=16, max_seq_len=2 * row, device=device))
    for r in rows:
        r["error"] = r["predicted"] / r["measured"] - 1
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| what | shape | params | tokens | checkpointing | predicted MiB | measured MiB | error |", "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['shape']} | {r['params'] / 1e6:.1f}M | {r['tokens']:,} | {'on' if r['checkpointing'] else 'off'} "
            f"| {r['predicted'] / 2**20:,.1f} | {r['measured'] / 2**20:,.1f} | {r['error']:+.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="small,medium,large", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    rows = calibration_rows(args.shapes.split(","), args.device)
    print(f"device {args.device}, torch {torch.__version__}\n" + table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
