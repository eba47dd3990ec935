"""Attention over packed rows: one causal SDPA call per sample instead of the row's block-diagonal mask.

A packed row holds several samples end to end, positions restarting at each. Given only the positions,
transformers builds a dense (width x width) block-diagonal mask, and SDPA under a mask computes every cell of
it: a row costs width^2 whatever its samples. Told the samples' lengths (the `packed_lengths` keyword of the
model call, which reaches every attention layer, activation checkpointing's recomputation included), the
function registered here as `PACKED_ATTENTION` runs each sample as its own causal block: sum(length^2) / 2.
Without that keyword, or where a layer needs more than a causal block (a sliding window, soft-capping, a
position bias, a cache), it is transformers' SDPA with the mask it was given, so a model switched to it
computes what SDPA would in every case. Measurements: docs/rl.md ("Trainer speed").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

PACKED_ATTENTION = "asearch_packed_sdpa"

# Per row, the lengths of the samples laid end to end from its start (the rest of the row is padding).
PackedLengths = Sequence[Sequence[int]]


def packed_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    packed_lengths: PackedLengths | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function signature: query (batch, heads, length, dim), key and value (batch,
    kv heads, length, dim); returns (batch, length, heads, dim) and no attention weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = all(kwargs.get(k) is None for k in ("sliding_window", "softcap", "position_bias", "s_aux"))
    plain = plain and kwargs.get("is_causal", getattr(module, "is_causal", True)) is not False  # a causal decoder
    if packed_lengths is None or not plain or key.shape[2] != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != len(packed_lengths):
        raise ValueError(f"packed_lengths has {len(packed_lengths)} rows for a batch of {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    width = query.shape[2]
    rows = []
    for r, lengths in enumerate(packed_lengths):
        pieces, start = [], 0
        for n in lengths:
            end = start + n
            pieces.append(torch.nn.functional.scaled_dot_product_attention(
                query[r : r + 1, :, start:end], key[r : r + 1, :, start:end], value[r : r + 1, :, start:end],
                dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa,
            ))  # fmt: skip
            start = end
        if start > width:
            raise ValueError(f"row {r}: samples of {start} tokens in a row of {width}")
        if start < width:  # padding: zeros, so that nothing it feeds can turn into NaN in backward
            pieces.append(value.new_zeros(1, query.shape[1], width - start, value.shape[-1]))
        rows.append(torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0])
    return torch.cat(rows).transpose(1, 2).contiguous(), None


def register_packed_attention() -> None:
    """Make `PACKED_ATTENTION` a name `model.set_attn_implementation` accepts (idempotent). Its mask is SDPA's,
    for the calls that fall back to SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
    if PACKED_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)


def use_packed_attention(model: Any) -> bool:
    """Switch `model` from SDPA to `PACKED_ATTENTION` (kept afterwards, so that a recomputing backward uses it
    too; `asearch.models.device.restore_attention` gives the model its own back). True when the model now runs
    it: a model on another kernel (eager, flash, flex) or that cannot switch is left as it is."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == PACKED_ATTENTION:
        return True
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    register_packed_attention()
    model.__dict__.setdefault("_asearch_own_attention", current)
    try:
        model.set_attn_implementation(PACKED_ATTENTION)
    except (ValueError, ImportError, KeyError):
        return False
    return config._attn_implementation == PACKED_ATTENTION
