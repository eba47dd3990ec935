"""Supervised warm start: maximise the log-likelihood of the generated tokens of expert trajectories."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from asearch.models.device import (
    TrainingPlacement,
    autocast,
    resolve_device,
    resolve_dtype,
    restore_attention,
    use_attention,
)
from asearch.models.lora import LoraConfig, add_lora, is_lora
from asearch.rl.optim import OptimConfig, clip_or_raise, lr_factor, make_optimizer
from asearch.rl.trainer import Sample, micro_batches, sequence_logprobs


def _sft_optim() -> OptimConfig:
    return OptimConfig(lr=2e-3, weight_decay=0.01, warmup_steps=20, schedule="cosine", min_lr_ratio=0.1)


class SFTConfig(TrainingPlacement):
    steps: int = Field(400, ge=1, description="Optimizer steps (the cosine schedule ends at the last one).")
    batch_size: int = Field(32, ge=1, description="Sequences per optimizer step.")
    optim: OptimConfig = Field(
        default_factory=_sft_optim,
        description="AdamW and its schedule, as in RL; here lr 2e-3, weight decay 0.01, 20 warmup steps, cosine "
        "to lr * 0.1 over `steps`. A partial mapping in YAML or `sft.optim.lr=...` keeps the other values.",
    )
    token_budget: int = Field(16384, ge=64, description="Padded tokens per forward micro-batch.")
    context_loss_weight: float = Field(
        0.0,
        ge=0,
        description="Weight of a language-modelling loss on the tokens the model read (question, tool results); "
        "0 = loss on generated tokens only. Tool results repeat names (query, url, title, text), so predicting "
        "them teaches a small model to copy, which it must do to search and answer.",
    )
    context_tokens: Literal["all", "repeated"] = Field(
        "all",
        description="Which read tokens the context loss covers. 'repeated': only those whose bigram (previous token, "
        "token) already occurred in the episode, i.e. what copying can predict. A fact's first mention is "
        "unpredictable; fitting it teaches priors over names (which suffix follows a name word) that then "
        "compete with copying when the model writes the name.",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (lora.r > 0): only they train, merged into the model when SFT ends.",
    )
    seed: int = Field(0, description="Seeds the order in which samples are drawn.")

    @model_validator(mode="before")
    @classmethod
    def _optimiser_keys_moved(cls, data: Any) -> Any:
        """The optimiser's keys used to sit beside `steps`: say where they went."""
        if not isinstance(data, dict):
            return data
        if "bf16" in data:  # the old switch, kept working: bf16 autocast on or off
            data = {k: v for k, v in data.items() if k != "bf16"} | {
                "dtype": data.get("dtype", "bfloat16" if str(data["bf16"]).lower() in {"true", "1"} else "float32")
            }
        moved = sorted({"lr", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip"} & set(data))
        if moved:
            raise ValueError(
                f"{', '.join(moved)}: the SFT optimiser is now `optim`, the OptimConfig RL uses too "
                f"({', '.join(f'sft.{k} -> sft.optim.{k}' for k in moved)})"
            )
        return data


def sft(model: Any, samples: Sequence[Sample], cfg: SFTConfig, *, on_step: Callable[[int, float], None] | None = None):
    """Train `model` in place on `samples` (loss only where loss_mask is 1). Returns per-step losses.
    With LoRA the adapters train and are merged into `model`'s own weights at the end."""
    rng = random.Random(cfg.seed)
    device = resolve_device(cfg.device)
    base = model.to(device)
    model = add_lora(base, cfg.lora, seed=cfg.seed)  # adapters wrap `base`'s own modules
    compute_dtype = resolve_dtype(cfg.dtype, device)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim)
    model.train()
    context = None  # per sample: 1 on the read tokens the context loss covers (None: every read token)
    if cfg.context_tokens == "repeated":
        context = [[r * (1 - m) for r, m in zip(repeated_bigrams(s.token_ids), s.loss_mask, strict=True)] for s in samples]
    losses = []
    order: list[int] = []
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(samples)), len(samples))
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = [samples[i] for i in picked]
        w_ctx = cfg.context_loss_weight
        ctx = [context[i] if context is not None else [1 - m for m in samples[i].loss_mask] for i in picked]
        n_tokens = sum(s.n_generated + w_ctx * sum(c[1:]) for s, c in zip(batch, ctx, strict=True))  # 0 has no prediction
        for g in opt.param_groups:
            g["lr"] = cfg.optim.lr * lr_factor(cfg.optim, step, cfg.steps)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for micro in micro_batches(batch, cfg.token_budget):
            rows = [batch[i] for i in micro]
            # per row: the weight of each position's loss (1 generated, w_ctx on the covered read tokens)
            weights = [[m + w_ctx * c for m, c in zip(s.loss_mask, ctx[i], strict=True)] for s, i in zip(rows, micro, strict=True)]
            use_attention(model, max(len(s.token_ids) for s in rows), cfg)
            with autocast(device, compute_dtype):
                lp = sequence_logprobs(model, rows, temperature=1.0, generated_only=not w_ctx).float()
            mask = torch.zeros_like(lp)
            for r, ws in enumerate(weights):
                mask[r, : len(ws)] = torch.tensor(ws, dtype=lp.dtype)
            mask[:, 0] = 0  # the first token has no prediction
            loss = -(lp * mask).sum() / max(n_tokens, 1)
            loss.backward()
            total += loss.item()
        clip_or_raise(model.parameters(), cfg.optim, where="sft", step=step, loss=total)
        opt.step()
        losses.append(total)
        if on_step:
            on_step(step, total)
    restore_attention(model)
    if is_lora(model):
        model.merge_and_unload()  # W += (alpha / r) B A in `base`'s modules, the adapters removed
    base.eval()
    return losses


def repeated_bigrams(token_ids: Sequence[int]) -> list[int]:
    """1 where (previous token, token) already occurred earlier in the sequence: a copy could predict it."""
    seen: set[tuple[int, int]] = set()
    out = [0] * len(token_ids)
    for t in range(1, len(token_ids)):
        pair = (token_ids[t - 1], token_ids[t])
        out[t] = int(pair in seen)
        seen.add(pair)
    return out


def trajectories_to_samples(trajectories: Sequence[Any]) -> list[Sample]:
    """Every segment with generated tokens becomes a sample (advantage unused by SFT)."""
    return [
        Sample(seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions, 0.0)
        for t in trajectories
        for seg in t.segments
        if seg.n_generated
    ]


__all__ = ["SFTConfig", "sft", "trajectories_to_samples"]
