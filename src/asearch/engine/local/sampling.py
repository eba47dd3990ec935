"""Batched token sampling with per-row temperature, top-k, top-p and seed, returning exact log-probs.

The log-prob of a sampled token is taken from the distribution it was actually drawn from:
log_softmax(filter(logits / temperature)), where filter keeps the top-k tokens, then the smallest set
of those whose renormalised mass reaches top-p, and sets the rest to -inf. At temperature 1 with no
filtering that is the model's log-softmax. Greedy rows (temperature 0) take the argmax and report the
model's log-softmax of it (temperature 1, unfiltered).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from asearch.engine.local.cpu_kernels import CpuKernels


@dataclass(slots=True)
class RowSampling:
    """One row's sampling settings plus its private random stream (a seed gives reproducible draws)."""

    temperature: float
    top_k: int
    top_p: float
    rng: random.Random


NUCLEUS_CANDIDATES = 256  # top-p first looks at this many tokens; a full sort only if they hold < p


def filter_logits(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set to -inf every token outside each row's top-k and then outside its top-p nucleus.

    scaled: (B, V) temperature-scaled logits; top_k: (B,) long, 0 = off; top_p: (B,) float, >= 1 = off.
    The nucleus is the highest-probability prefix whose mass (renormalised over the top-k) reaches
    top_p; the most likely token is always kept. Exact: a partial top-k of candidates replaces the full
    vocabulary sort only for rows whose candidates already hold mass >= top_p.
    """
    B, V = scaled.shape
    k = torch.where(top_k > 0, top_k.clamp(max=V), V)
    if bool((top_p < 1.0).any()):
        # Small vocabularies: a full sort is cheap and saves the second pass.
        first = (
            V if V <= 4 * NUCLEUS_CANDIDATES else max(NUCLEUS_CANDIDATES, int(torch.where(k < V, k, 0).max()))
        )
        out, covered = _filter_top(scaled, k, top_p, first)
        if bool(covered.all()) or first == V:
            return out
        redo = (~covered).nonzero()[:, 0]
        out[redo] = _filter_top(scaled[redo], k[redo], top_p[redo], V)[0]
        return out
    return _filter_top(scaled, k, top_p, int(k.max()))[0]


def _filter_top(scaled: Tensor, k: Tensor, top_p: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Filter using the n best tokens of each row (n >= every row's k); also return which rows the n
    candidates fully decide (the nucleus ends inside them, or the row has no top-p)."""
    V = scaled.shape[-1]
    values, order = scaled.topk(n, dim=-1) if n < V else scaled.sort(dim=-1, descending=True)
    values = values.masked_fill(torch.arange(n, device=scaled.device)[None, :] >= k[:, None], float("-inf"))
    # Normalise over the row's top-k set: the candidates when k <= n, else the whole vocabulary.
    log_norm = torch.where(k <= n, values.logsumexp(dim=-1), scaled.logsumexp(dim=-1))
    probs = (values - log_norm[:, None]).exp()
    mass = probs.cumsum(dim=-1)
    # p >= 1 is "off": compare against +inf so float rounding in the cumsum can never drop a tail token
    p = torch.where(top_p >= 1.0, float("inf"), top_p)[:, None]
    values = values.masked_fill(mass - probs >= p, float("-inf"))
    covered = (k <= n) | ((top_p < 1.0) & (mass[:, -1] >= top_p))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, values), covered


def host_tensor_to(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small tensor of per-row values on `device`; on CUDA via pinned memory and a non-blocking copy, so
    the host does not wait for the stream (the caching host allocator keeps the page until the copy ran)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def sample(
    logits: Tensor, rows: list[RowSampling], *, kernels: CpuKernels | None = None
) -> tuple[list[int], list[float]]:
    """Draw one token per row of `logits` (B, V float32, on any device); return (token ids, their log-probs).

    Each row's log-softmax, its cumulative sum and the draw are batch-wide passes; greedy rows reuse the
    batch's log-softmax (their rows are unscaled and unfiltered); ids and log-probs reach the host in one copy.
    With `kernels` (CPU logits) a batch without top-k / top-p is drawn by their C sampler, the same draw in
    two passes over each row.
    """
    B, V = logits.shape
    dev = logits.device
    greedy = [r.temperature == 0.0 for r in rows]
    if kernels is not None and dev.type == "cpu" and all(r.top_k <= 0 and r.top_p >= 1.0 for r in rows):
        # the same uniforms as below: one per row unless every row is greedy
        uniforms = [0.0] * B if all(greedy) else [r.rng.random() for r in rows]
        return kernels.sample(logits, [r.temperature for r in rows], uniforms)
    if all(greedy):
        lp = torch.log_softmax(logits, dim=-1)
        best = lp.argmax(dim=-1)
        return _to_host(best, lp.gather(1, best[:, None])[:, 0])

    temps = [r.temperature if r.temperature != 0.0 else 1.0 for r in rows]
    scaled = logits if all(t == 1.0 for t in temps) else logits / host_tensor_to(temps, torch.float32, dev)[:, None]
    picked = [i for i, (r, g) in enumerate(zip(rows, greedy, strict=True)) if not g and (r.top_k > 0 or r.top_p < 1.0)]
    if picked:
        idx = host_tensor_to(picked, torch.long, dev)
        top_k = host_tensor_to([rows[i].top_k for i in picked], torch.long, dev)
        top_p = host_tensor_to([rows[i].top_p for i in picked], torch.float32, dev)
        scaled = scaled.clone() if scaled is logits else scaled
        scaled[idx] = filter_logits(scaled[idx], top_k, top_p)
    lp = torch.log_softmax(scaled, dim=-1)
    # Inverse-CDF draw with one uniform per row from the row's own stream: the draw depends only on
    # the request's seed and its distribution, never on which other rows share the batch.
    cdf = lp.exp()
    cdf.cumsum_(dim=-1)
    u = host_tensor_to([r.rng.random() for r in rows], torch.float32, dev)[:, None] * cdf[:, -1:]
    pick = torch.searchsorted(cdf, u, right=True).clamp_(max=V - 1)[:, 0]
    if any(greedy):  # a greedy row of lp is log_softmax(logits): divided by 1.0 and never filtered
        pick = torch.where(host_tensor_to(greedy, torch.bool, dev), lp.argmax(dim=-1), pick)
    tokens, logprobs = _to_host(pick, lp.gather(1, pick[:, None])[:, 0])
    for i, x in enumerate(logprobs):
        if x == -math.inf:  # rounding put u at the very top of the cdf, on a filtered (-inf) tail token
            tokens[i] = int(lp[i].argmax())
            logprobs[i] = float(lp[i, tokens[i]])
    return tokens, logprobs


def _to_host(ids: Tensor, logprobs: Tensor) -> tuple[list[int], list[float]]:
    """Token ids and float32 log-probs as lists: off the CPU in one device-to-host copy (float64 holds both
    exactly); on the CPU directly (stacking costs more than it saves there)."""
    if ids.device.type == "cpu":
        return ids.tolist(), logprobs.tolist()
    both = torch.stack((ids.to(torch.float64), logprobs.to(torch.float64))).tolist()
    return [int(t) for t in both[0]], both[1]
