"""The memory plan of a training config, before anything is allocated (`asearch plan`, and `asearch train`'s
refusal of a config that does not fit).

    shape = model_shape("Qwen/Qwen2.5-7B-Instruct")           # config.json of a directory, the HF cache, or built in
    plan = plan_training(cfg, shape, device_bytes=80e9)       # per trainer rank and per rollout server
    print(plan.render()); plan.fits; plan.fixes               # the knobs that would make it fit

Each pool (a trainer rank, a rollout server, or this process when the engine runs in it) is a list of
components in bytes, from the architecture numbers alone: parameters, gradients and AdamW moments (sharded by
FSDP over the trainer ranks; with LoRA only the adapters train), the frozen KL reference, the activations the
backward keeps for one micro-batch (`trainer.token_budget` tokens; per decoder layer, or only the layer inputs
plus one layer with activation checkpointing), the log-prob head (tokens x vocabulary float32 temporaries, or a
chunk of them), the optimizer step's temporaries; a server's weights, its KV cache (the in-process engine's
max_batch x max_seq_len rectangle) and its step workspace. The per-token counts follow the tensors the
transformers Qwen2/Llama layer saves for backward; bench/plan_calibration.py measures them (docs/plan.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from asearch.errors import ConfigError

# A TrainConfig (asearch.launch.train, which calls this module: typed loosely here to keep the two acyclic)
TrainConfig = Any

GiB = 1 << 30


# ---------------------------------------------------------------------------- model shapes


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers a memory plan needs (a Llama-family decoder: Llama, Qwen2, Qwen3)."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 0  # 0: hidden // heads
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has q/k/v biases
    max_positions: int = 32768
    attention: str = "sdpa"  # the kernel the model was loaded with (the demo trains its tiny model with eager)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim

    @property
    def layer_params(self) -> int:
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * h * i + 2 * h

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Adapter parameters: r x (in + out) per targeted linear of every layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
        return self.layers * sum(r * (a + b) for name, (a, b) in shapes.items() if any(name.endswith(t) for t in targets))


def _qwen25(name: str, vocab: int, hidden: int, layers: int, heads: int, kv: int, inter: int, tie: bool) -> ModelShape:
    return ModelShape(name, vocab, hidden, layers, heads, kv, inter, tie_embeddings=tie, qkv_bias=True)


def _qwen3(name: str, hidden: int, layers: int, heads: int, inter: int, tie: bool) -> ModelShape:
    return ModelShape(name, 151936, hidden, layers, heads, 8, inter, head_dim=128, tie_embeddings=tie, max_positions=40960)


# The published config.json numbers of common policies (no hub here); a directory or a cached name wins.
KNOWN_SHAPES: dict[str, ModelShape] = {
    s.name.lower(): s
    for s in (
        _qwen25("Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 4864, True),
        _qwen25("Qwen2.5-1.5B", 151936, 1536, 28, 12, 2, 8960, True),
        _qwen25("Qwen2.5-3B", 151936, 2048, 36, 16, 2, 11008, True),
        _qwen25("Qwen2.5-7B", 152064, 3584, 28, 28, 4, 18944, False),
        _qwen25("Qwen2.5-14B", 152064, 5120, 48, 40, 8, 13824, False),
        _qwen25("Qwen2.5-32B", 152064, 5120, 64, 40, 8, 27648, False),
        _qwen3("Qwen3-0.6B", 1024, 28, 16, 3072, True),
        _qwen3("Qwen3-1.7B", 2048, 28, 16, 6144, True),
        _qwen3("Qwen3-4B", 2560, 36, 32, 9728, True),
        _qwen3("Qwen3-8B", 4096, 36, 32, 12288, False),
        _qwen3("Qwen3-14B", 5120, 40, 40, 17408, False),
        _qwen3("Qwen3-32B", 5120, 64, 64, 25600, False),
        ModelShape("Llama-3-8B", 128256, 4096, 32, 32, 8, 14336, max_positions=8192),
        ModelShape("SmolLM2-135M", 49152, 576, 30, 9, 3, 1536, tie_embeddings=True, max_positions=8192),
        # `asearch demo`'s tiny Qwen2 (DemoConfig's hidden/layers/heads/vocab_size/max_positions; a test compares)
        ModelShape("asearch-demo-tiny", 2000, 128, 4, 4, 2, 384, tie_embeddings=True, qkv_bias=True, max_positions=1024),
    )
}
_SUFFIXES = ("-instruct", "-chat", "-base", "-hf")
# what `asearch demo` writes: its tiny model, or with --preset smollm2 the SmolLM2 it fine-tunes
_DEMO_MODEL = re.compile(r"(?:^|/)runs/demo-(smollm2-)?seed\d+/model-sft/?$")


def shape_from_config(config: Any, name: str = "model") -> ModelShape:
    """A `ModelShape` from a transformers config object or a config.json dict."""
    get: Callable[..., Any] = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    try:
        heads = int(get("num_attention_heads"))
        return ModelShape(
            name=name, vocab=int(get("vocab_size")), hidden=int(get("hidden_size")), layers=int(get("num_hidden_layers")),
            heads=heads, kv_heads=int(get("num_key_value_heads") or heads), intermediate=int(get("intermediate_size")),
            head_dim=int(get("head_dim") or 0), tie_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=bool(get("attention_bias", get("model_type") == "qwen2")),
            max_positions=int(get("max_position_embeddings") or 32768),
            attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}: its config lacks a decoder's numbers (hidden_size, num_hidden_layers, ...): {e}") from e


def model_shape(name_or_path: str) -> ModelShape:
    """The shape of `name_or_path`: a directory's config.json, a built-in alias's or a cached hub config
    (offline: no download), a known name (`Qwen/Qwen2.5-7B-Instruct`: `KNOWN_SHAPES`), or, for the demo's
    `runs/demo-seedN/model-sft` before the demo has written it, the demo's tiny model."""
    from asearch.models.loading import BUILTIN_MODELS, resolve_model_path

    name = str(name_or_path)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return shape_from_config(json.loads((path / "config.json").read_text(encoding="utf-8")), name)
    known = _known_shape(name)
    if known is not None:
        return known
    if name.lower() in BUILTIN_MODELS:  # converted on first use
        return model_shape(resolve_model_path(name))
    if demo := _DEMO_MODEL.search(name):
        return KNOWN_SHAPES["smollm2-135m" if demo.group(1) else "asearch-demo-tiny"]
    cached = _cached_config(name)
    if cached is not None:
        return shape_from_config(cached, name)
    raise ConfigError(
        f"model {name!r}: no config.json there, not in the Hugging Face cache, and not a known shape "
        f"({', '.join(s.name for s in KNOWN_SHAPES.values())}); give a directory with its config.json"
    )


def _known_shape(name: str) -> ModelShape | None:
    key = name.rsplit("/", 1)[-1].lower()
    for suffix in _SUFFIXES:
        key = key.removesuffix(suffix)
    key = {"meta-llama-3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b", "meta-llama-3.1-8b": "llama-3-8b"}.get(key, key)
    return KNOWN_SHAPES.get(key)


def _cached_config(name: str) -> Any:
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------- what a trainer rank holds


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer knobs memory depends on, resolved (dtypes in bytes, checkpointing on or off)."""

    ranks: int = 1  # FSDP ranks the state is sharded over
    param_bytes: int = 4  # trainer.param_dtype
    compute_bytes: int = 4  # trainer.dtype under autocast (the param dtype without autocast)
    checkpointing: bool = False
    token_budget: int = 16384  # trainer.token_budget
    row_tokens: int = 2048  # the longest sample (the context limit): a longer one than the budget trains alone
    lora_r: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    kl_reference: bool = False
    logprob_chunk: int | None = None  # tokens per head chunk; None: the whole micro-batch at once
    full_logits: bool = False  # every position's logits (a sharded or non-Qwen/Llama model), not generated tokens only
    generated_tokens: int | None = None  # loss-mask tokens of the micro-batch; None: every token (the worst case)
    eager_rows: int = 0  # longest row trained with plain-matmul attention, whose (heads, T, T) softmax is kept per layer
    cuda: bool = False  # foreach AdamW's temporaries (CUDA); one parameter's on a CPU
    temperature_copy: bool = True  # logits / temperature is one more vocabulary-wide tensor

    @property
    def tokens(self) -> int:
        """Tokens of the largest micro-batch."""
        return max(self.token_budget, self.row_tokens)


def layer_activation_bytes(shape: ModelShape, s: TrainerSettings) -> int:
    """Bytes the backward keeps per token of one decoder layer (transformers' Qwen2/Llama layer).

    float32: residual x and x2, each RMSNorm's normalised y and weighted n, q/k/v after RoPE, the attention
    output and its contiguous copy, MLP gate, act(gate), up and their product. bfloat16 autocast over float32
    weights: the residual stays float32, each linear keeps its own bfloat16 cast of its input. bfloat16
    weights: the norms' float32 upcasts and bfloat16 casts. LoRA: a frozen norm weight needs no copy of what
    it multiplies (y, or its cast)."""
    h, q, kv, i, c = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate, s.compute_bytes
    attention = (3 * q + 2 * kv) * c
    mlp = 4 * i * c
    y = 0 if s.lora_r else 1  # the norms' weights train
    if s.param_bytes == 4 and c == 4:
        norms = 2 * h * 4 + 2 * (1 + y) * h * 4  # residuals, then y and n of both norms
    elif s.param_bytes == 4:
        norms = 2 * h * 4 + 2 * y * h * 4 + (3 + 2) * h * c  # residuals, y of both norms, one input cast per linear
    else:
        norms = 2 * h * s.param_bytes + 2 * h * (4 + (1 + y) * s.param_bytes)  # residuals, float32 upcast, cast, n
    return norms + attention + mlp


def head_bytes(shape: ModelShape, s: TrainerSettings) -> int:
    """The log-prob head's peak in the backward.

    Chunked (`trainer.logprob_chunk`): one chunk's logits in the compute dtype and float32, and the head
    weight's float32 gradient buffer plus one chunk's product (and the weight's cast under autocast). Whole:
    tokens x vocabulary of float32 log-softmax, its gradient and the gradient's input (and the compute-dtype
    logits, and the temperature's copy)."""
    tokens = s.tokens if s.full_logits or s.generated_tokens is None else s.generated_tokens
    v, h, c = shape.vocab, shape.hidden, s.compute_bytes
    gathered = tokens * h * 4  # the hidden states the head reads, saved for its backward
    if not s.logprob_chunk:
        per_entry = 12 + (4 if s.temperature_copy else 0) + (c if c != 4 else 0)
        return tokens * v * per_entry + gathered
    chunk = min(s.logprob_chunk, tokens)
    logits = chunk * v * (4 + (2 * c if c != 4 else 0))
    cast = v * h * c if c != s.param_bytes else 0  # weight.to(dtype), alive through the backward
    weight_grad = 0 if s.lora_r else v * h * (8 if c == 4 else 8 + c)  # float32 buffer + one chunk's product
    return logits + cast + weight_grad + gathered


def trainer_components(shape: ModelShape, s: TrainerSettings) -> list[tuple[str, int]]:
    """(component, bytes) of one trainer rank at its peak: the start of a micro-batch's backward.

    FSDP (ranks > 1) shards float32 parameters, gradients and moments (bfloat16 params are a gather dtype there);
    one process with bfloat16 params keeps float32 master copies for AdamW; with LoRA the base weights stay
    whole on every rank and only the float32 adapters have gradients and moments."""
    n = s.ranks
    if s.lora_r:
        adapters = shape.lora_params(s.lora_r, list(s.lora_targets))
        out = [("parameters", shape.params * s.param_bytes + adapters * 4), ("gradients", adapters * 4),
               ("AdamW moments", adapters * 8)]  # fmt: skip
    else:
        stored = 4 if n > 1 else s.param_bytes
        out = [("parameters", shape.params * stored // n), ("gradients", shape.params * stored // n)]
        if stored != 4:
            out.append(("float32 master copies", shape.params * 4))
        out.append(("AdamW moments", shape.params * 8 // n))
    if s.kl_reference:
        out.append(("KL reference (frozen)", shape.params * (4 if n > 1 else s.param_bytes) // n))
    if n > 1:  # FSDP gathers a layer (and the root's embedding and head) in the compute dtype, one ahead
        root = shape.vocab * shape.hidden * (1 if shape.tie_embeddings else 2)
        out.append(("FSDP unsharded layers", (2 * shape.layer_params + root) * s.compute_bytes))
    out.append(("activations", _activations(shape, s)))
    out.append(("log-prob head", head_bytes(shape, s)))
    return out


def _activations(shape: ModelShape, s: TrainerSettings) -> int:
    per_layer = layer_activation_bytes(shape, s) * s.tokens
    if s.eager_rows:  # float32 softmax probabilities (and their cast under autocast), per query and key
        per_layer += s.tokens * shape.heads * s.eager_rows * (4 if s.compute_bytes == 4 else 4 + s.compute_bytes)
    residual = 4 if s.param_bytes == 4 else s.param_bytes
    final = s.tokens * shape.hidden * 3 * residual  # the last layer's output, the final norm's
    if s.checkpointing:  # each layer's input; one layer's recompute comes after the head's backward has freed its own
        return shape.layers * s.tokens * shape.hidden * residual + final + max(0, per_layer - head_bytes(shape, s))
    return shape.layers * per_layer + final


def optimizer_step_bytes(shape: ModelShape, s: TrainerSettings) -> int:
    """What the optimizer step adds over the fwd/bwd state: fused AdamW makes no temporaries; with float32
    masters the gradients become float32 before it (the bfloat16 ones already counted)."""
    if s.lora_r or s.ranks > 1 or s.param_bytes == 4:
        return 0
    return shape.params * (4 - s.param_bytes)


# ---------------------------------------------------------------------------- what a rollout server holds


@dataclass(frozen=True)
class ServerSettings:
    """A rollout engine's memory knobs: the in-process engine (also behind `asearch engine serve`) or vLLM."""

    kind: str = "inprocess"  # inprocess | vllm
    dtype_bytes: int = 4
    max_batch: int = 64
    max_seq_len: int = 2048
    max_prefill_tokens: int = 8192
    prefix_cache_bytes: int = 256 << 20
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9  # vllm: the share of the device it takes


def server_components(shape: ModelShape, s: ServerSettings, device_bytes: int | None) -> list[tuple[str, int]]:
    """(component, bytes) of one rollout server; vLLM takes its fixed share of the device and pages its KV."""
    weights = shape.params * s.dtype_bytes // s.tensor_parallel
    if s.kind == "vllm":
        if device_bytes is None:
            return [("weights", weights), ("vLLM share (unknown device)", 0)]
        share = int(device_bytes * s.gpu_memory_utilization)
        workspace = 2 * GiB  # CUDA graphs, sampler and activation workspace vLLM reserves before the KV cache
        kv = max(share - weights - workspace, 0)
        tokens = kv // (shape.kv_bytes_per_token(s.dtype_bytes) // s.tensor_parallel)
        return [("weights", weights), ("CUDA graphs + workspace", workspace),
                (f"KV cache (paged: {tokens / 1e6:.2f}M tokens, {tokens // s.max_seq_len} full contexts)", kv)]  # fmt: skip
    length = min(s.max_seq_len, shape.max_positions)
    kv = s.max_batch * length * shape.kv_bytes_per_token(s.dtype_bytes)
    return [
        ("weights", weights),
        (f"KV cache ({s.max_batch} x {length:,} tokens)", kv),
        ("prefix cache", s.prefix_cache_bytes),
        ("step workspace", _engine_workspace(shape, s, length)),
    ]


def _engine_workspace(shape: ModelShape, s: ServerSettings, length: int) -> int:
    """One prefill forward's layer temporaries (two layers' gate|up: the last one's is freed only when the next
    replaces it) and its boolean mask, or a decode step's float32 logits and sampling copies, whichever is larger."""
    tokens = min(s.max_prefill_tokens, s.max_batch * length)
    per_token = 3 * shape.hidden + 2 * shape.q_dim + 2 * shape.kv_dim + 5 * shape.intermediate
    prefill = tokens * (per_token * s.dtype_bytes + length)
    decode = s.max_batch * shape.vocab * 4 * 3
    return max(prefill, decode)


# ---------------------------------------------------------------------------- the plan


@dataclass
class Pool:
    """One memory space: a trainer rank, a rollout server, or this process (trainer and in-process engine)."""

    name: str
    count: int  # how many such (8 trainer ranks)
    components: list[tuple[str, int]]
    extra: int = 0  # a peak outside the components' sum (the optimizer step), when larger
    device_bytes: int | None = None

    @property
    def total(self) -> int:
        return sum(b for _, b in self.components) + self.extra

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.total <= self.device_bytes


@dataclass
class MemoryPlan:
    model: ModelShape
    pools: list[Pool]
    device: str  # what the device memory is (e.g. "80.0 GiB (--device-memory-gb)")
    notes: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)  # knobs that would make it fit (set by `plan_training`)

    @property
    def fits(self) -> bool | None:
        verdicts = [p.fits for p in self.pools]
        return None if None in verdicts else all(verdicts)

    def render(self) -> str:
        """The plan as a fixed-width table: per component, per pool, total, device, fits."""
        m = self.model
        lines = [
            f"model {m.name}: {_count(m.params)} params, {m.layers} layers, hidden {m.hidden}, heads {m.heads}/{m.kv_heads}, "
            f"vocab {m.vocab:,}; device memory {self.device}"
        ]
        width = max(len(name) for pool in self.pools for name, _ in pool.components) + 2
        for pool in self.pools:
            lines.append(f"{pool.name}{f' (x{pool.count})' if pool.count > 1 else ''}:")
            rows = list(pool.components) + ([("optimizer step (peak when larger)", pool.extra)] if pool.extra else [])
            lines += [f"  {name:<{width}} {_gib(b):>10}" for name, b in rows]
            verdict = {None: "no device memory to compare", True: "fits", False: "DOES NOT FIT"}[pool.fits]
            device = f" of {_gib(pool.device_bytes)}" if pool.device_bytes is not None else ""
            lines.append(f"  {'total':<{width}} {_gib(pool.total):>10}{device}: {verdict}")
        lines += [f"note: {n}" for n in self.notes]
        if self.fits is False:
            lines.append("would fit with: " + ("; or ".join(self.fixes) if self.fixes else "no single knob found"))
        return "\n".join(lines)


def _gib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / (1 << 20):,.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def trainer_settings(cfg: TrainConfig, shape: ModelShape, *, cuda: bool) -> TrainerSettings:
    """The trainer knobs of `cfg`, resolved for a CUDA or CPU trainer. Reads trainer.param_dtype,
    trainer.activation_checkpointing and trainer.logprob_chunk when the trainer has them."""
    t = cfg.trainer
    compute = 2 if (t.dtype == "auto" and cuda) else _DTYPE_BYTES.get(t.dtype, 4)
    param_name = getattr(t, "param_dtype", "float32")
    param = 2 if (param_name == "auto" and cuda) else _DTYPE_BYTES.get(param_name, 4)
    ckpt = getattr(t, "activation_checkpointing", None)
    checkpointing = (cuda if ckpt == "auto" else bool(ckpt)) if ckpt is not None else t.gradient_checkpointing
    ranks = cfg.allocation.trainer_ranks if cfg.launcher != "none" else 1
    row = _context_tokens(cfg, shape)
    # trainer.attention auto keeps a model's own eager attention below attention_switch_tokens (use_attention)
    eager_rows = row if t.attention == "eager" or (t.attention == "model" and shape.attention == "eager") else 0
    if t.attention == "auto" and shape.attention == "eager":
        eager_rows = min(row, t.attention_switch_tokens - 1)
    return TrainerSettings(
        ranks=ranks, param_bytes=param, compute_bytes=min(compute, param), checkpointing=checkpointing,
        token_budget=t.token_budget, row_tokens=row, lora_r=t.lora.r, lora_targets=tuple(t.lora.target_modules),
        kl_reference=t.loss.kl_coef > 0 and not t.lora.enabled, logprob_chunk=getattr(t, "logprob_chunk", None) or None,
        full_logits=ranks > 1 and getattr(t, "logprob_chunk", None) is None, eager_rows=eager_rows, cuda=cuda,
        temperature_copy=cfg.agent.temperature > 0,
    )  # fmt: skip


def _context_tokens(cfg: TrainConfig, shape: ModelShape) -> int:
    return min(cfg.agent.max_context_tokens, cfg.engine.options.max_seq_len, shape.max_positions)


def server_settings(cfg: TrainConfig, *, cuda: bool) -> ServerSettings:
    e = cfg.engine.options
    servers = cfg.servers
    dtype = 2 if (e.dtype == "auto" and cuda) else _DTYPE_BYTES.get(e.dtype, 4)
    common = dict(
        dtype_bytes=dtype, max_batch=e.max_batch, max_seq_len=e.max_seq_len, max_prefill_tokens=e.max_prefill_tokens,
        prefix_cache_bytes=int(e.prefix_cache_mb * (1 << 20)),
    )
    if servers is not None and servers.kind == "vllm":
        v: Any = servers.server_options("vllm")  # VLLMServerConfig: rollout_servers.vllm
        return ServerSettings(kind="vllm", tensor_parallel=v.tensor_parallel_size, gpu_memory_utilization=v.gpu_memory_utilization,
                              **{**common, "dtype_bytes": _DTYPE_BYTES.get(v.dtype, 2 if cuda else 4)})  # fmt: skip
    return ServerSettings(**common)


@dataclass(frozen=True)
class Layout:
    """Where the parts run: FSDP ranks, launched servers, the engine in the trainer's process, one shared memory."""

    in_process_engine: bool = True
    servers: int = 0  # rollout servers a launcher starts (0: in-process engine, or servers given by URL)
    shared_memory: bool = False  # a CPU machine: the trainer and its local servers share its RAM
    places_trainer: bool = False  # the launcher places FSDP ranks (allocation.trainer_ranks may grow)


def plan_pools(
    shape: ModelShape, ts: TrainerSettings, ss: ServerSettings, layout: Layout, device_bytes: int | None
) -> list[Pool]:
    """The pools of one layout: a trainer rank (with the in-process engine beside it), the rollout servers."""
    trainer = trainer_components(shape, ts)
    extra = max(0, optimizer_step_bytes(shape, ts) - sum(b for n, b in trainer if n in ("activations", "log-prob head")))
    server = server_components(shape, ss, device_bytes)
    if layout.in_process_engine:
        comps = trainer + [(f"engine: {n}", b) for n, b in server]
        return [Pool("this process: trainer + in-process engine", 1, comps, extra, device_bytes)]
    if layout.shared_memory and layout.servers:
        comps = trainer + [(f"{layout.servers} servers: {n}", b * layout.servers) for n, b in server]
        return [Pool(f"this machine: trainer + {layout.servers} rollout servers", 1, comps, extra, device_bytes)]
    pools = [Pool("trainer rank", ts.ranks, trainer, extra, device_bytes)]
    if layout.servers:
        pools.append(Pool("rollout server", layout.servers, server, 0, device_bytes))
    return pools


def plan_training(cfg: TrainConfig, shape: ModelShape, *, device_bytes: int | None, device: str, cuda: bool) -> MemoryPlan:
    """The memory plan of `cfg` on devices of `device_bytes` each (None: unknown, no verdict), with the knobs
    that would make it fit when it does not."""
    ts, ss = trainer_settings(cfg, shape, cuda=cuda), server_settings(cfg, cuda=cuda)
    servers = cfg.servers
    launched = cfg.allocation.rollout_servers if cfg.launcher != "none" else 0
    from asearch.launch.registry import launcher_type

    layout = Layout(
        in_process_engine=servers is None, servers=launched, shared_memory=not cuda and cfg.launcher == "local",
        places_trainer=cfg.launcher != "none" and launcher_type(cfg.launcher).places_trainer,
    )  # fmt: skip
    plan = MemoryPlan(shape, plan_pools(shape, ts, ss, layout, device_bytes), device)
    if servers is not None and not launched:
        plan.notes.append(f"{len(servers.urls)} rollout server(s) given by URL: their memory is theirs, not planned here")
    if not ts.full_logits and ts.generated_tokens is None:
        plan.notes.append("log-prob head: every token of a micro-batch counted as generated (the worst case)")
    if ts.full_logits:
        plan.notes.append("log-prob head: FSDP ranks compute logits at every position (no trainer.logprob_chunk)")
    if plan.fits is False:
        plan.fixes = fixes(cfg, shape, ts, ss, layout, device_bytes)
    return plan


def fixes(
    cfg: TrainConfig, shape: ModelShape, ts: TrainerSettings, ss: ServerSettings, layout: Layout, device_bytes: int | None
) -> list[str]:
    """Knob settings that make the plan fit, each alone; else one combination, each knob found on top of the
    ones before it (switches first, then the smallest rank count, the largest budget, batch, context)."""

    def fits(t: TrainerSettings, s: ServerSettings) -> bool:
        return all(p.fits for p in plan_pools(shape, t, s, layout, device_bytes))

    trainer_fields = type(cfg.trainer).model_fields
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in trainer_fields else "gradient_checkpointing"
    Change = tuple[str, TrainerSettings, ServerSettings] | None

    def checkpointing(t: TrainerSettings, s: ServerSettings) -> Change:
        return None if t.checkpointing else (f"trainer.{ckpt_key}=true", replace(t, checkpointing=True), s)

    def chunk(t: TrainerSettings, s: ServerSettings) -> Change:
        if "logprob_chunk" not in trainer_fields or (t.logprob_chunk or 1 << 30) <= 4096:
            return None
        return "trainer.logprob_chunk=4096", replace(t, logprob_chunk=4096, full_logits=False), s

    def ranks(t: TrainerSettings, s: ServerSettings) -> Change:
        n = next((r for r in (2**k for k in range(1, 8)) if r > t.ranks and fits(replace(t, ranks=r), s)), None)
        return (f"allocation.trainer_ranks >= {n}", replace(t, ranks=n), s) if layout.places_trainer and n else None

    def budget(t: TrainerSettings, s: ServerSettings) -> Change:
        b = _largest(lambda b: fits(replace(t, token_budget=b), s), 64, t.token_budget)
        return (f"trainer.token_budget <= {b}", replace(t, token_budget=b), s) if b else None

    def batch(t: TrainerSettings, s: ServerSettings) -> Change:
        if s.kind != "inprocess" or not (layout.in_process_engine or layout.servers):
            return None
        b = _largest(lambda b: fits(t, replace(s, max_batch=b)), 1, s.max_batch)
        return (f"engine.max_batch <= {b}", t, replace(s, max_batch=b)) if b else None

    def context(t: TrainerSettings, s: ServerSettings) -> Change:
        n = _largest(lambda n: fits(replace(t, row_tokens=n), replace(s, max_seq_len=n)), 256, t.row_tokens)
        # launched servers take their context from the agent's budget, which may not exceed it
        knob = "engine.max_seq_len" if layout.in_process_engine else "engine.max_seq_len and agent.max_context_tokens"
        return (f"{knob} <= {n}", replace(t, row_tokens=n), replace(s, max_seq_len=n)) if n else None

    knobs = (checkpointing, chunk, ranks, budget, batch, context)
    alone = [c[0] for knob in knobs if (c := knob(ts, ss)) is not None and fits(c[1], c[2])]
    if alone:
        return alone
    labels: list[str] = []
    for knob in knobs:
        change = knob(ts, ss)
        if change is not None:
            label, ts, ss = change
            labels.append(label)
            if fits(ts, ss):
                return [" and ".join(labels)]
    return []


def _largest(ok: Any, low: int, high: int) -> int | None:
    """The largest n in [low, high) with ok(n) (ok is monotone: smaller fits more), rounded down to a
    multiple of 1,024 above 4,096 and of 64 above 256; None when not even `low` fits."""
    if high <= low or not ok(low):
        return None
    lo, hi = low, high - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    step = 1024 if lo >= 4096 else 64 if lo >= 256 else 1
    return max(low, lo // step * step)


# ---------------------------------------------------------------------------- the device, and the refusal


def uses_cuda(cfg: TrainConfig) -> bool:
    """Whether the trainer runs on CUDA GPUs: trainer.device says so, ranks reserve GPUs, or auto finds one."""
    device = cfg.trainer.device.strip().lower()
    if device.startswith("cuda") or (cfg.launcher != "none" and (getattr(cfg.allocation, "rank_gpus", None) or 0) > 0):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def device_memory(cfg: TrainConfig, *, cuda: bool, override_gb: float | None = None) -> tuple[int | None, str]:
    """(bytes of one device, where that number came from): `override_gb` or device_memory_gb, the visible
    GPU's memory, this machine's RAM on a CPU; None when the trainer wants GPUs this machine does not have,
    or a launcher places it on a cluster's nodes (launcher=ray: their memory is not this machine's)."""
    gb = override_gb if override_gb is not None else getattr(cfg, "device_memory_gb", None)
    if gb is not None:
        return int(gb * GiB), f"{gb:g} GiB (given)"
    from asearch.launch.registry import launcher_type

    if cfg.launcher != "none" and launcher_type(cfg.launcher).places_trainer:
        return None, f"unknown (launcher={cfg.launcher} places the trainer on the cluster: give --device-memory-gb)"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            return None, "unknown (CUDA trainer, no GPU here: give --device-memory-gb)"
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(props.total_memory), f"{props.total_memory / GiB:.1f} GiB ({props.name})"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram, f"{ram / GiB:.1f} GiB (this machine's RAM)"


def plan_for(cfg: TrainConfig, *, model: Any = None, override_gb: float | None = None) -> MemoryPlan:
    """`cfg`'s plan on its devices; `model`: the policy already in memory (its config is read, not the path's)."""
    config = getattr(model, "config", None)
    shape = shape_from_config(config, cfg.model) if config is not None else model_shape(cfg.model)
    cuda = uses_cuda(cfg)
    device_bytes, device = device_memory(cfg, cuda=cuda, override_gb=override_gb)
    return plan_training(cfg, shape, device_bytes=device_bytes, device=device, cuda=cuda)


def refuse_if_too_big(cfg: TrainConfig, *, model: Any = None) -> MemoryPlan | None:
    """Raise a ConfigError naming the knobs that would make `cfg` fit when its plan exceeds the device;
    the plan otherwise (None when the model's shape is not known here: nothing to check)."""
    try:
        plan = plan_for(cfg, model=model)
    except ConfigError:
        return None  # a model this machine cannot describe yet: the loader reports it properly
    if plan.fits is False:
        knobs = "; or ".join(plan.fixes) if plan.fixes else "a smaller model, more devices, or a smaller token budget"
        raise ConfigError(
            f"this config does not fit in memory (nothing was started): {knobs}\n{plan.render()}\n"
            "(the plan: docs/plan.md; device_memory_gb=N sets the device's size if it is read wrong)"
        )
    return plan
