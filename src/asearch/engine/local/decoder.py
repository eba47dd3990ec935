"""A lean forward pass for Llama-family decoders (Llama, Qwen2, Qwen3) over a slot-addressed KV cache.

The in-process engine runs this instead of the transformers module: on CPU with small models the
per-op Python overhead of the generic path dominates, and the engine needs ragged per-row positions
(every row of a batch at its own length) which this code expresses with one mask. The weights are the
engine's own snapshot, built from a state dict (the HF model's, a trainer's, or a safetensors directory)
with q/k/v and gate/up fused into single matmuls. Tests check it against the transformers forward.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from asearch.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# (dst, src) -> whether it wrote dst = src transposed (False: the layout is not one it handles)
TransposeInto = Callable[[Tensor, Tensor], bool]


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """The architecture numbers the forward pass needs, read once from a transformers config."""

    model_type: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    tie_embeddings: bool
    qk_norm: bool  # Qwen3 normalises each head of q and k before RoPE
    max_positions: int

    @classmethod
    def from_config(cls, config: Any) -> DecoderSpec:
        mt = getattr(config, "model_type", None)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"in-process engine supports model types {SUPPORTED_MODEL_TYPES}, got {mt!r} "
                "(serve other architectures with the vLLM or SGLang engine)"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"in-process engine supports hidden_act 'silu', got {act!r}")
        layer_types = getattr(config, "layer_types", None) or []
        if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
            raise ConfigError(
                "in-process engine does not implement sliding-window attention (set use_sliding_window=False)"
            )
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type", "default")) == "dynamic":
            raise ConfigError("in-process engine does not implement dynamic RoPE scaling")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            model_type=mt,
            vocab_size=config.vocab_size,
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            rms_eps=float(config.rms_norm_eps),
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qk_norm=mt == "qwen3",
            max_positions=int(getattr(config, "max_position_embeddings", 1 << 20)),
        )


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer; projection matrices are stored transposed, (in, out), for plain `mm`."""

    in_norm: Tensor
    qkv_wt: Tensor  # hidden, (heads + 2 kv_heads) * head_dim
    qkv_b: Tensor | None
    o_wt: Tensor
    o_b: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    post_norm: Tensor
    gate_up_wt: Tensor  # hidden, 2 * intermediate
    gate_up_b: Tensor | None
    down_wt: Tensor
    down_b: Tensor | None


@dataclass(slots=True)
class DecoderWeights:
    embed: Tensor
    layers: list[LayerWeights]
    final_norm: Tensor
    lm_head: Tensor

    @classmethod
    def from_state_dict(
        cls, spec: DecoderSpec, sd: Mapping[str, Tensor], dtype: torch.dtype, device: torch.device | str = "cpu",
        *, reuse: DecoderWeights | None = None, transpose: TransposeInto | None = None,
    ) -> DecoderWeights:  # fmt: skip
        """Copy (never alias) the tensors of an HF-named state dict into the fused layout (into `reuse`'s
        tensors where they fit, transposing with `transpose`: see `DecoderWeightsBuilder`).

        Validates every name and shape first, so a bad state dict raises ConfigError and leaves the
        caller's current weights untouched.
        """
        builder = DecoderWeightsBuilder(spec, dtype, device, reuse=reuse, transpose=transpose)
        builder.check({k: tuple(v.shape) for k, v in sd.items()}, complete=True)
        for name, tensor in sd.items():
            builder.put(name, tensor)
        return builder.finish()

    def by_field(self) -> dict[tuple[int, str], Tensor]:
        """Every tensor by (layer, field) ((-1, name) outside the layers); a tied LM head is the embedding's."""
        out = {(-1, "embed"): self.embed, (-1, "final_norm"): self.final_norm}
        if self.lm_head is not self.embed:
            out[(-1, "lm_head")] = self.lm_head
        for i, layer in enumerate(self.layers):
            out |= {(i, f): t for f in LayerWeights.__slots__ if (t := getattr(layer, f)) is not None}
        return out

    def copy_(self, other: DecoderWeights) -> bool:
        """Copy `other`'s values into these tensors (addresses kept, as captured CUDA graphs need); False,
        copying nothing, when the two differ in layout (a bias present in one only, tied against untied)."""
        pairs = [(self.embed, other.embed), (self.final_norm, other.final_norm)]
        if (self.lm_head is self.embed) != (other.lm_head is other.embed):
            return False
        if self.lm_head is not self.embed:
            pairs.append((self.lm_head, other.lm_head))
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            for name in LayerWeights.__slots__:
                a, b = getattr(mine, name), getattr(theirs, name)
                if (a is None) != (b is None):
                    return False
                if a is not None:
                    pairs.append((a, b))
        for a, b in pairs:
            a.copy_(b)
        return True


def expected_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Every parameter name a checkpoint of `spec` may carry, with its shape (all biases are optional)."""
    h, d, q, kv = spec.hidden, spec.head_dim, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (spec.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (spec.vocab_size, h),
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            out[p + f"self_attn.{name}_proj.weight"] = (rows, h)
            out[p + f"self_attn.{name}_proj.bias"] = (rows,)
        out[p + "self_attn.o_proj.weight"] = (h, q)
        out[p + "self_attn.o_proj.bias"] = (h,)
        if spec.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        for name in ("gate", "up"):
            out[p + f"mlp.{name}_proj.weight"] = (spec.intermediate, h)
            out[p + f"mlp.{name}_proj.bias"] = (spec.intermediate,)
        out[p + "mlp.down_proj.weight"] = (h, spec.intermediate)
        out[p + "mlp.down_proj.bias"] = (h,)
    return out


class DecoderWeightsBuilder:
    """`DecoderWeights` filled one HF-named tensor at a time: each is copied (cast, and transposed into its
    fused (in, out) matrix) as it arrives, so a weight broadcast converts one tensor while the next is on
    the wire. `finish` checks that nothing required is missing and returns the weights."""

    def __init__(
        self, spec: DecoderSpec, dtype: torch.dtype, device: torch.device | str = "cpu", *,
        reuse: DecoderWeights | None = None, transpose: TransposeInto | None = None,
    ):  # fmt: skip
        """`reuse`: weights nothing reads any more, whose tensors are filled instead of new ones (on a CPU a
        new tensor costs a page fault per 4 KiB: a third of the time of a 0.5B model's build). `transpose`:
        copies a matrix transposed (`cpu_kernels.CpuKernels.transpose_into`), else torch's strided copy."""
        self.spec, self.dtype, self.device, self.transpose = spec, dtype, device, transpose
        self.expected = expected_shapes(spec)
        h, q, kv, inter = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.intermediate
        # layer-relative name -> (field, first column or element, transposed into an (in, out) matrix)
        self._places: dict[str, tuple[str, int, bool]] = {
            "input_layernorm.weight": ("in_norm", 0, False),
            "post_attention_layernorm.weight": ("post_norm", 0, False),
            "self_attn.o_proj.weight": ("o_wt", 0, True),
            "self_attn.o_proj.bias": ("o_b", 0, False),
            "self_attn.q_norm.weight": ("q_norm", 0, False),
            "self_attn.k_norm.weight": ("k_norm", 0, False),
            "mlp.down_proj.weight": ("down_wt", 0, True),
            "mlp.down_proj.bias": ("down_b", 0, False),
        }
        for fused, names in (("qkv", (("q", 0), ("k", q), ("v", q + kv))), ("gate_up", (("gate", 0), ("up", inter)))):
            part = "self_attn" if fused == "qkv" else "mlp"
            for name, start in names:
                self._places[f"{part}.{name}_proj.weight"] = (f"{fused}_wt", start, True)
                self._places[f"{part}.{name}_proj.bias"] = (f"{fused}_b", start, False)
        self._fused_shapes = {"qkv_wt": (h, q + 2 * kv), "qkv_b": (q + 2 * kv,), "gate_up_wt": (h, 2 * inter), "gate_up_b": (2 * inter,)}
        self._tensors: dict[tuple[int, str], Tensor] = {}  # (layer or -1, field) -> the tensor being filled
        self._seen: set[str] = set()
        self._spare: dict[tuple[int, str], Tensor] = {} if reuse is None else reuse.by_field()

    def check(self, shapes: Mapping[str, tuple[int, ...]], *, complete: bool = False) -> None:
        """ConfigError for a name this model has no place for or a wrong shape (and, `complete`, a missing one)."""
        ignorable = {"lm_head.weight"} if self.spec.tie_embeddings else set()
        required = {k for k in self.expected if not k.endswith(".bias")} - ignorable
        missing = sorted(k for k in required if k not in shapes) if complete else []
        unexpected = sorted(k for k in shapes if k not in self.expected and not k.endswith("rotary_emb.inv_freq"))
        bad = [f"{k}: {tuple(s)} != {self.expected[k]}" for k, s in shapes.items() if k in self.expected and tuple(s) != self.expected[k]]
        if missing or unexpected or bad:
            raise ConfigError(
                f"state dict does not fit this {self.spec.model_type} model: "
                f"missing {missing[:6]}{'...' if len(missing) > 6 else ''}, "
                f"unexpected {unexpected[:6]}{'...' if len(unexpected) > 6 else ''}, "
                f"wrong shapes {bad[:6]}"
            )

    def put(self, name: str, tensor: Tensor) -> None:
        """Copy `tensor` into its place (names `check` accepts; a tied model's lm_head and RoPE buffers are skipped)."""
        if name not in self.expected or (name == "lm_head.weight" and self.spec.tie_embeddings):
            return
        if tuple(tensor.shape) != self.expected[name]:
            self.check({name: tuple(tensor.shape)})  # raises, naming it
        src = tensor.detach()
        layer, field, start, transposed = self._place(name)
        shape = tuple(src.shape[::-1]) if transposed else tuple(src.shape)
        width = shape[-1]
        with torch.inference_mode():  # the engine's weights are inference tensors (reused ones too)
            dest = self._dest(layer, field, shape)
            part = dest[:, start : start + width] if dest.dim() == 2 else dest[start : start + width]
            if not transposed:
                part.copy_(src)
            elif self.transpose is None or not self.transpose(part, src):
                part.copy_(src.t())
        self._seen.add(name)

    def _place(self, name: str) -> tuple[int, str, int, bool]:
        if not name.startswith("model.layers."):
            return -1, {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm"}.get(name, "lm_head"), 0, False
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        return (int(layer), *self._places[rest])

    def _dest(self, layer: int, field: str, shape: tuple[int, ...]) -> Tensor:
        key = (layer, field)
        if key not in self._tensors:
            full = self._fused_shapes.get(field, shape)
            spare = self._spare.pop(key, None)
            fits = spare is not None and tuple(spare.shape) == full and spare.dtype == self.dtype
            self._tensors[key] = spare if fits and spare is not None else torch.empty(full, dtype=self.dtype, device=self.device)
        return self._tensors[key]

    def finish(self) -> DecoderWeights:
        """The weights, once every required tensor has arrived (ConfigError naming what is missing)."""
        self.check({k: self.expected[k] for k in self._seen}, complete=True)
        for i in range(self.spec.layers):
            p = f"model.layers.{i}."
            for names in (("q", "k", "v"), ("gate", "up")):
                part = "self_attn" if names[0] == "q" else "mlp"
                present = [f"{p}{part}.{n}_proj.bias" in self._seen for n in names]
                if any(present) and not all(present):  # Qwen2-style: biases on q/k/v together or none
                    raise ConfigError(f"state dict has only some of the {'/'.join(names)} biases of layer {i}")
        t = self._tensors
        layers = [
            LayerWeights(**{f: t.get((i, f)) for f in LayerWeights.__slots__})  # type: ignore[arg-type]
            for i in range(self.spec.layers)
        ]
        embed = t[(-1, "embed")]
        return DecoderWeights(embed=embed, layers=layers, final_norm=t[(-1, "final_norm")], lm_head=t.get((-1, "lm_head"), embed))


def load_safetensors_dir(directory: str | Path) -> dict[str, Tensor]:
    """Every tensor of an HF safetensors checkpoint directory (single file or sharded with an index)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / s for s in shards]
    elif (directory / "model.safetensors").is_file():
        files = [directory / "model.safetensors"]
    else:
        raise ConfigError(
            f"{directory}: no model.safetensors or model.safetensors.index.json "
            "(weights must be saved with save_pretrained(safe_serialization=True))"
        )
    sd: dict[str, Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


class RoPE:
    """cos/sin tables for every position up to `max_len`, matching transformers' rotary embedding.

    Stored as one (L, 2, d) table so a step gathers cos and sin with one index op, with the sign of
    rotate_half folded into sin: rotate_half(x) * sin == roll(x, d/2) * signed_sin.
    """

    def __init__(
        self, inv_freq: Tensor, attention_scaling: float, max_len: int, dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):  # fmt: skip
        pos = torch.arange(max_len, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq.float().cpu()[None, :]  # (L, d/2), computed as transformers does
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * attention_scaling, emb.sin() * attention_scaling
        half = cos.shape[-1] // 2
        signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.table = torch.stack((cos, signed_sin), dim=1).to(device=device, dtype=dtype)  # (L, 2, d)
        self.half = half

    def apply_(self, x: Tensor, cos_sin: Tensor) -> None:
        """Rotate x (B, T, heads, d) in place; cos_sin (B, T, 2, d) from `table[pos]`."""
        cos, sin = cos_sin[:, :, 0:1], cos_sin[:, :, 1:2]  # (B, T, 1, d): broadcast over heads
        torch.addcmul(x * cos, x.roll(self.half, dims=-1), sin, out=x)


class SlotKVCache:
    """Per-layer K/V buffers of shape (slots, 2, kv_heads, length, head_dim), grown on demand.

    Rows of a batch are slots; an active request owns one slot for its lifetime and keeps its tokens at
    positions 0..n-1 of it. K and V share a buffer so one indexed write stores both. Both dimensions
    start small and double up to the configured maximum, so a 64-slot engine with short episodes never
    allocates the full max_batch x max_seq_len rectangle.
    """

    def __init__(
        self, spec: DecoderSpec, dtype: torch.dtype, max_slots: int, max_len: int, device: torch.device | str = "cpu",
        *, spare_slot: bool = False,
    ):  # fmt: skip
        self.spec, self.dtype, self.device = spec, dtype, torch.device(device)
        self.max_slots, self.max_len = max_slots, max_len
        self.slots, self.length = 0, 0
        # One more slot past the last (index `slots`): padding rows of a CUDA graph write their K/V there.
        self.extra = int(spare_slot)
        self.generation = 0  # bumped whenever the buffers are reallocated (captured graphs hold their addresses)
        self.kv: list[Tensor] = []
        self.ensure(min(4, max_slots), min(128, max_len))

    def ensure(self, slots: int, length: int) -> None:
        """Make room for `slots` rows and `length` positions (doubling, capped at the maxima)."""
        if slots <= self.slots and length <= self.length:
            return
        if slots > self.max_slots or length > self.max_len:
            raise ValueError(f"KV cache request {slots}x{length} exceeds {self.max_slots}x{self.max_len}")
        new_slots = self.slots or 1
        while new_slots < slots:
            new_slots *= 2
        new_len = self.length or 1
        while new_len < length:
            new_len *= 2
        new_slots = min(max(new_slots, self.slots), self.max_slots)
        new_len = min(max(new_len, self.length), self.max_len)
        shape = (new_slots + self.extra, 2, self.spec.kv_heads, new_len, self.spec.head_dim)
        for i in range(self.spec.layers):
            fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if i < len(self.kv):
                fresh[: self.slots, :, :, : self.length] = self.kv[i][: self.slots]
                self.kv[i] = fresh
            else:
                self.kv.append(fresh)
        self.slots, self.length = new_slots, new_len
        self.generation += 1

    def move(self, src: int, dst: int, n_tokens: int) -> None:
        """Copy the first `n_tokens` positions of slot `src` into slot `dst` (compaction on finish)."""
        if n_tokens > 0:
            for buf in self.kv:
                buf[dst, :, :, :n_tokens] = buf[src, :, :, :n_tokens]

    def swap(self, a: int, b: int, n_a: int, n_b: int) -> None:
        """Exchange the first n_a positions of slot a with the first n_b of slot b."""
        n = max(n_a, n_b)
        if n > 0:
            for buf in self.kv:
                held = buf[a, :, :, :n].clone()
                buf[a, :, :, :n] = buf[b, :, :, :n]
                buf[b, :, :, :n] = held

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv)


def forward(
    spec: DecoderSpec,
    w: DecoderWeights,
    rope: RoPE,
    cache: SlotKVCache,
    first_slot: int,
    tokens: Tensor,
    starts: Tensor,
    n_real: Tensor | None,
    *,
    n_keys: int | None = None,
    write_slots: Tensor | None = None,
    decode_attention: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None,
    rms_norm: Callable[[Tensor, Tensor, float], Tensor] | None = None,
) -> Tensor:
    """Run `tokens` for the contiguous slots first_slot .. first_slot+B-1 and return next-token logits.

    tokens: (B, T) ids; row b holds its tokens at positions starts[b] .. starts[b]+T-1, of which the
    first n_real[b] are real and the rest padding (None: all T are real). Keys/values of all T positions
    are written into the cache (padding lands beyond a row's length, where the mask hides it until real
    tokens overwrite it), into slot write_slots[b] if given (a CUDA graph's padding rows write to the spare
    slot). Each query attends to cached positions <= its own among the first `n_keys` (default: max(starts)
    + T, read from the device; a caller that knows it saves the sync). `decode_attention` (T == 1 only; a
    `cpu_kernels.DecodeAttention`) replaces RoPE, the K/V write and torch's attention kernel, `rms_norm`
    (`cpu_kernels.CpuKernels.rms_norm`) the layers' and the final norms. Returns float32 logits (B, vocab) at
    each row's last real token. All tensors live on the weights' device.
    """
    B, T = tokens.shape
    dev = tokens.device
    N = B * T  # position-wise work runs on (N, H) rows; only attention needs the (B, T) structure
    H, nh, nkv, d = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    pos = starts[:, None] + torch.arange(T, device=dev)  # (B, T)
    if n_keys is None:
        n_keys = int(starts.max()) + T
    cache.ensure(first_slot + B, n_keys)
    native = decode_attention is not None and T == 1
    if native and write_slots is not None:
        raise ValueError("decode_attention writes each row's K/V into its own slot: no write_slots")
    # (B, 1), broadcasts against pos
    rows = write_slots[:, None] if write_slots is not None else torch.arange(first_slot, first_slot + B, device=dev)[:, None]
    cos_sin = None if native else rope.table[pos]  # (B, T, 2, d)
    # Boolean mask, True = attend: key position j is visible to the query at position p iff j <= p.
    mask = None if native else (torch.arange(n_keys, device=dev)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
    norm = rms_norm if rms_norm is not None else _rms_norm
    x = F.embedding(tokens.reshape(N), w.embed)  # (N, H)
    q_end, k_end = nh * d, (nh + nkv) * d
    for i, lw in enumerate(w.layers):
        h = norm(x, lw.in_norm, spec.rms_eps)
        qkv = _proj(h, lw.qkv_wt, lw.qkv_b).view(B, T, -1)  # (B, T, (nh + 2 nkv) d): q | k | v
        if lw.q_norm is not None:
            qkv[..., :q_end] = F.rms_norm(
                qkv[..., :q_end].view(B, T, nh, d), (d,), lw.q_norm, spec.rms_eps
            ).view(B, T, -1)
            qkv[..., q_end:k_end] = F.rms_norm(
                qkv[..., q_end:k_end].view(B, T, nkv, d), (d,), lw.k_norm, spec.rms_eps
            ).view(B, T, -1)
        kvbuf = cache.kv[i]
        if native:  # RoPE, the K/V write and attention in one C call
            assert decode_attention is not None
            attn = decode_attention(qkv.view(B, -1), rope.table, kvbuf[first_slot : first_slot + B], pos.view(B))
        else:
            assert cos_sin is not None and mask is not None
            rope.apply_(qkv[..., :k_end].view(B, T, nh + nkv, d), cos_sin)  # q and k rotated together, in place
            # Advanced indices (rows, pos) around two slices: the indexed view is (B, T, 2, nkv, d), exactly
            # the k | v part of qkv, so one write stores both.
            kvbuf[rows, :, :, pos] = qkv[..., q_end:].view(B, T, 2, nkv, d)
            attn = _sdpa(spec, qkv, kvbuf[first_slot : first_slot + B, :, :, :n_keys], mask)
        x = _proj(attn, lw.o_wt, lw.o_b, residual=x)
        h = norm(x, lw.post_norm, spec.rms_eps)
        gate_up = _proj(h, lw.gate_up_wt, lw.gate_up_b)
        inter = gate_up.shape[-1] // 2
        act = F.silu(gate_up[:, :inter]).mul_(gate_up[:, inter:])
        x = _proj(act, lw.down_wt, lw.down_b, residual=x)
    if n_real is None:
        last = x.view(B, T, H)[:, -1]
    else:  # (B, H): only the rows' last real tokens need logits
        last = x.view(B, T, H)[torch.arange(B, device=dev), n_real - 1]
    last = norm(last, w.final_norm, spec.rms_eps)
    return F.linear(last, w.lm_head).float()


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _sdpa(spec: DecoderSpec, qkv: Tensor, kv: Tensor, mask: Tensor) -> Tensor:
    """torch's attention of qkv's query heads (B, T, ...) over kv (B, 2, nkv, n_keys, d) under mask: (B * T, nh * d)."""
    B, T = qkv.shape[:2]
    nh, nkv, d = spec.heads, spec.kv_heads, spec.head_dim
    keys, values = kv[:, 0], kv[:, 1]  # (B, nkv, n_keys, d), views
    if T == 1:
        # Decode: the nh / nkv query heads sharing a kv head become that head's "query positions"
        # (same mask row for all), so each K/V block is read once per kv head rather than per q head.
        q = qkv[..., : nh * d].view(B, nkv, nh // nkv, d)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask).reshape(B, nh * d)
    q = qkv[..., : nh * d].view(B, T, nh, d).transpose(1, 2)  # (B, nh, T, d)
    attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=nkv != nh)
    return attn.transpose(1, 2).reshape(B * T, nh * d)


def _proj(x: Tensor, wt: Tensor, bias: Tensor | None, residual: Tensor | None = None) -> Tensor:
    """x @ wt (+ bias) (+ residual), with the residual add fused into the GEMM where possible."""
    if residual is not None:
        out = torch.addmm(residual, x, wt)
        return out.add_(bias) if bias is not None else out
    return torch.addmm(bias, x, wt) if bias is not None else torch.mm(x, wt)


def bucket(n: int, cap: int, floor: int = 1) -> int:
    """The power of two >= max(n, floor), capped at `cap` (which may itself not be a power of two)."""
    b = floor
    while b < n:
        b *= 2
    return min(b, cap)


class DecodeGraphs:
    """The decode forward captured as CUDA graphs, one per (batch bucket, key bucket), replayed each step.

    A step's n decode rows are slots 0..n-1 (the engine keeps decoding rows first). They run padded to the
    batch bucket B (a power of two up to max_batch); padding rows decode token 0 at position 0 and write
    their K/V into the cache's spare slot. Attention reads the first L keys of every row, L the key bucket
    (a power of two >= 64 covering the longest row), with the mask hiding each row's positions past its own.
    Inputs go through one static device buffer fed from pinned memory without blocking; every graph ends by
    copying its logits into one static (max_batch, vocab) float32 buffer, valid until the next replay (so
    graphs keep no vocabulary-wide output each). Graphs hold the addresses of the weights (the engine updates
    those in place) and of the KV buffers: a cache reallocation drops every graph, and they are captured
    again on use. `capture=False` runs the same padded forward eagerly (tests on the CPU).
    """

    MIN_KEYS = 64

    def __init__(
        self, spec: DecoderSpec, rope: RoPE, cache: SlotKVCache, max_batch: int, *,
        stream: Any = None, capture: bool = True,
    ):  # fmt: skip
        if not cache.extra:
            raise ValueError("DecodeGraphs needs a SlotKVCache with spare_slot=True")
        self.spec, self.rope, self.cache, self.max_batch = spec, rope, cache, max_batch
        self.stream, self.capture = stream, capture
        # per row: token, start, write slot; rows first, so a bucket's inputs are one contiguous copy
        self.inputs = torch.zeros(max_batch, 3, dtype=torch.long, device=cache.device)
        self.out = torch.zeros(max_batch, spec.vocab_size, dtype=torch.float32, device=cache.device)
        self._graphs: dict[tuple[int, int], Any] = {}
        self._generation = cache.generation
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()

    def logits(self, weights: DecoderWeights, tokens: list[int], starts: list[int]) -> Tensor:
        """Next-token logits (n, vocab) of rows 0..n-1, each decoding tokens[i] at position starts[i]."""
        n = len(tokens)
        B = bucket(n, self.max_batch)
        self.cache.ensure(B, max(starts) + 1)
        if self.cache.generation != self._generation:  # new KV buffers: every captured address is stale
            self._graphs.clear()
            self._generation = self.cache.generation
        L = bucket(max(starts) + 1, self.cache.length, self.MIN_KEYS)
        pad = B - n
        rows = [*zip(tokens, starts, range(n), strict=True), *[(0, 0, self.cache.slots)] * pad]
        staged = torch.tensor(rows, dtype=torch.long, pin_memory=self.cache.device.type == "cuda")
        self.inputs[:B].copy_(staged, non_blocking=True)
        if not self.capture:
            self._forward(weights, B, L)
        else:
            if (B, L) not in self._graphs:
                self._graphs[(B, L)] = self._capture(weights, B, L)
            self._graphs[(B, L)].replay()
        return self.out[:n]

    def _forward(self, weights: DecoderWeights, B: int, L: int) -> None:
        tokens, starts, slots = self.inputs[:B, 0:1], self.inputs[:B, 1], self.inputs[:B, 2]
        logits = forward(self.spec, weights, self.rope, self.cache, 0, tokens, starts, None, n_keys=L, write_slots=slots)
        self.out[:B].copy_(logits)

    def _capture(self, weights: DecoderWeights, B: int, L: int) -> Any:
        # Warm-up runs (kernel selection, workspace allocation) must precede capture; they run the real
        # step, so the K/V they write are the ones the replay writes again.
        for _ in range(2):
            self._forward(weights, B, L)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a trainer thread of the same process may use the GPU while this thread captures
        with torch.cuda.graph(graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
            self._forward(weights, B, L)
        self._pool = graph.pool()
        return graph
