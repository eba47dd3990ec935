"""Where a model runs and in which precision: one reading of `device` and `dtype` for every component.

`device`: "auto" (the first CUDA GPU if torch sees one, else the CPU), "cpu", "cuda" or "cuda:N".
`dtype`: "auto" (bfloat16 on a GPU, float32 on a CPU: CPUs without bf16 units run float32 fastest),
"float32", "bfloat16" or "float16". The engine stores weights and KV cache in it; the trainer keeps
float32 weights and optimiser state and computes forward and backward under autocast to it.
`attention` (trainers only): which attention kernel a micro-batch's forward and backward use, by its length.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.errors import ConfigError

if TYPE_CHECKING:
    import torch

DTypeName = Literal["auto", "float32", "bfloat16", "float16"]
AttentionName = Literal["auto", "model", "eager", "sdpa"]

DEVICE_HELP = "auto (a CUDA GPU when torch sees one, else the CPU) | cpu | cuda | cuda:N"
DTYPE_HELP = "auto (bfloat16 on a GPU, float32 on a CPU) | float32 | bfloat16 | float16"


class TrainingPlacement(Config):
    """Where a trainer (RL or SFT) runs and its compute precision; its config classes inherit these keys."""

    device: str = Field("auto", description=f"Where the model trains (it is moved there): {DEVICE_HELP}.")
    dtype: DTypeName = Field(
        "auto",
        description=f"Forward and backward precision under autocast: {DTYPE_HELP}. Weights, gradients and "
        "optimiser state stay float32; bfloat16 is also faster on CPUs with AVX512-BF16 (docs/demo.md).",
    )
    attention: AttentionName = Field(
        "auto",
        description="Attention of the forward and backward passes. auto: SDPA for a micro-batch whose longest row "
        "has at least attention_switch_tokens tokens when the model's own is plain matmul ('eager', the tiny "
        "model's), the model's own otherwise (on a CPU the two train the demo's ~150-token episodes equally fast "
        "and SDPA trains 2,500-token ones 4.2x faster: bench/train_speed.py); model: always the model's own; "
        "eager or sdpa: always that one.",
    )
    attention_switch_tokens: int = Field(384, ge=1, description="attention=auto: the row length from which SDPA is used.")


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch device `spec` names; a GPU asked for but absent is a ConfigError, not a CUDA trace."""
    import torch

    name = spec.strip().lower()
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device {spec!r}: not a device ({DEVICE_HELP})") from e
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {spec!r}: only cpu and cuda are supported ({DEVICE_HELP})")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r}: torch sees no CUDA GPU (torch {torch.__version__}); use device=cpu")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        device = torch.device("cuda", index)
    return device


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """The torch dtype `spec` names on `device` ("auto": bfloat16 on CUDA, float32 elsewhere)."""
    import torch

    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec)
    if dtype is None:
        raise ConfigError(f"dtype {spec!r}: not a dtype ({DTYPE_HELP})")
    return dtype


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed-precision compute in `dtype` on `device`; a no-op for float32."""
    import torch

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def use_attention(model: Any, longest: int, placement: TrainingPlacement) -> None:
    """Set `model`'s attention for a micro-batch whose longest row is `longest` tokens (`placement.attention`).

    auto only replaces eager (a model loaded with another kernel keeps it). A model without a switchable
    attention (no `set_attn_implementation`, or one that refuses or raises) keeps its own from then on.
    """
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current is None or not hasattr(model, "set_attn_implementation") or model.__dict__.get("_asearch_fixed_attention"):
        return
    own = model.__dict__.setdefault("_asearch_own_attention", current)
    choice = placement.attention
    if choice == "model" or (choice == "auto" and (longest < placement.attention_switch_tokens or own != "eager")):
        choice = own
    elif choice == "auto":
        choice = "sdpa"
    if current == choice:
        return
    try:
        model.set_attn_implementation(choice)
    except (ValueError, ImportError):  # this architecture cannot run `choice`
        pass
    if config._attn_implementation != choice:  # refused: stop asking
        model.__dict__["_asearch_fixed_attention"] = True


def restore_attention(model: Any) -> None:
    """Give `model` back the attention it had before `use_attention` first switched it (a no-op otherwise)."""
    own = model.__dict__.get("_asearch_own_attention")
    if own is not None and model.config._attn_implementation != own:
        model.set_attn_implementation(own)


# Dense bf16 peak FLOP/s (no sparsity) by device-name fragment, most specific first: the MFU denominator.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak (PEAK_BF16_FLOPS), or None where unknown: every CPU."""
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (timings of CUDA code are meaningless without it); nothing on a CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
