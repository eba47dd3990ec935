"""LoRA adapters through `peft`: train a few small matrices per layer instead of every weight.

A layer's weight becomes W + (alpha / r) B A with A (r x in) and B (out x r); B starts at zero, so the adapted
model starts as the base model. Checkpoints hold A and B only (megabytes); engines get the merged weights
W + (alpha / r) B A under the base model's own names, so any engine serves a LoRA-trained policy unchanged.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from pydantic import Field

from asearch.config import Config
from asearch.errors import ConfigError

if TYPE_CHECKING:
    import torch

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Config):
    """LoRA settings; r = 0 trains every weight (full fine-tuning)."""

    r: int = Field(0, ge=0, description="Rank of each adapter; 0 = off (full fine-tuning).")
    alpha: float = Field(32.0, gt=0, description="Scale numerator: the update is (alpha / r) B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(ALL_LINEAR),
        description="Module names (suffixes) that get adapters; default every linear layer of a Llama/Qwen block.",
    )

    @property
    def enabled(self) -> bool:
        return self.r > 0


def is_lora(model: Any) -> bool:
    """Whether `model` is a peft model (duck-typed: peft is only imported where adapters are made)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_lora(model) else model


def add_lora(model: Any, cfg: LoraConfig, *, seed: int = 0) -> Any:
    """`model` with fresh adapters on `cfg.target_modules` (only they train); unchanged if LoRA is off or the
    model already has adapters (a resumed run loads their saved values)."""
    if not cfg.enabled or is_lora(model):
        return model
    try:
        import peft
    except ImportError as e:
        raise ConfigError("lora.r > 0 needs peft: pip install 'asearch[cpu]' (or pip install peft)") from e
    import torch

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if missing := [m for m in cfg.target_modules if m not in names]:
        raise ConfigError(f"lora.target_modules: {missing} not in the model (its modules include {sorted(names)[:12]})")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # adapter init keeps the caller's stream
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft calls a deprecated name
        torch.manual_seed(seed)
        config = peft.LoraConfig(
            r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
            bias="none", task_type="CAUSAL_LM",
        )  # fmt: skip
        return peft.get_peft_model(model, config)


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under the base model's names, each adapted layer merged: W + (alpha / r) B A.

    The model itself is left as it is (no merge in place), so training continues on the same adapters. A
    model whose modules carry adapters without the peft wrapper (the base model a trainer wrapped) counts too.
    """
    state = model.state_dict()
    if not any(".lora_" in name for name in state):
        return state
    from peft.tuners.lora import LoraLayer

    base = base_model(model)
    out = {
        name.replace(".base_layer.", "."): t
        for name, t in base.state_dict().items()
        if ".lora_" not in name
    }
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        adapters = [a for a in module.active_adapters if a in module.lora_A]
        if adapters:
            weight = module.base_layer.weight
            out[f"{name}.weight"] = (weight + sum(module.get_delta_weight(a) for a in adapters)).detach()
    return out


def adapter_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors only (what a LoRA checkpoint holds)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state_dict(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter tensors back; a name that does not fit is an error, not a silent skip."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ConfigError(f"LoRA checkpoint does not fit the model: unexpected {unexpected[:6]}")
