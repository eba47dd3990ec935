"""The policy update of one RL step: groups -> samples -> proximal log-probs -> minibatch PPO updates.

Reads top to bottom in `PolicyTrainer.train_step`: recompute log pi_prox once (no grad; the first minibatch
takes it from its own forward), then for each minibatch accumulate the decoupled PPO loss over
token-budget micro-batches and take one AdamW step.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import os
import random
import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import torch
from pydantic import Field, model_validator

from asearch.metrics.offpolicy import (
    MASKED_FRAC,
    MASKED_FRAC_BY_STALENESS,
    RATIO_EDGES,
    RATIO_HIST,
    RATIO_LABELS,
    VERSIONS_BEHIND_HIST,
    VERSIONS_BEHIND_LABELS,
)
from asearch.models.device import (
    TrainingPlacement,
    autocast,
    peak_flops,
    resolve_dtype,
    restore_attention,
    synchronize,
    use_attention,
)
from asearch.models.lora import (
    LoraConfig,
    adapter_state_dict,
    add_lora,
    base_model,
    is_lora,
    load_adapter_state_dict,
    merged_state_dict,
)
from asearch.models.packed_attention import use_packed_attention
from asearch.rl.advantages import AdvantageConfig, group_advantages
from asearch.rl.broadcast import BroadcastsWeights
from asearch.rl.loss import LossConfig, corrected_weights, decoupled_ppo_loss, episode_weights
from asearch.rl.optim import Float32Master, OptimConfig, lr_factor, make_optimizer, raise_if_diverged


class TrainerConfig(TrainingPlacement):
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    advantages: AdvantageConfig = Field(default_factory=AdvantageConfig)
    n_minibatches: int = Field(1, ge=1, description="Optimizer steps per pass over a batch (PPO minibatches).")
    epochs: int = Field(
        1, ge=1, description="Passes over each batch (PPO epochs): more updates from the same trajectories when "
        "generation, not training, is the bottleneck. The proximal policy stays the one at the step's start.",
    )
    token_budget: int = Field(16384, ge=64, description="Padded tokens per forward micro-batch.")
    prox: Literal["recompute", "loglinear"] = Field(
        "recompute", description="recompute: one extra forward per step; loglinear: interpolate by versions."
    )
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto", description="Recompute each decoder layer's activations in backward instead of keeping them: "
        "memory per token drops to about the layer inputs, for ~30% more compute. auto: on when training on CUDA.",
    )
    logprob_chunk: int = Field(
        4096, ge=1, description="Tokens per chunk of the LM head: logits of this many positions at a time (never "
        "the whole micro-batch's), float32 log-sum-exp, recomputed in backward.",
    )
    logprob_keep_mib: int = Field(
        3072, ge=0, description="The LM head keeps a micro-batch's softmax (loss tokens x vocabulary in the compute "
        "dtype) from forward to backward when it takes at most this many MiB, instead of recomputing the logits: "
        "3 head matmuls instead of 4. 0: always recompute.",
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Storage of the model's weights. bfloat16: the weights (and a KL reference) in "
        "bfloat16, the trained ones updated through float32 copies in the optimiser (FSDP: float32 shards, "
        "gathered in bfloat16).",
    )
    packing: bool = Field(
        True, description="Samples laid end to end in rows as wide as a micro-batch's longest sample, positions "
        "restarting at each and attention block-diagonal, so shorter samples fill what would be padding (rows x "
        "width within token_budget); off: one padded row per sample. Same log-probs up to float rounding.",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (lora.r > 0): only they train; checkpoints hold them alone, engines get merged weights.",
    )
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _renamed_gradient_checkpointing(cls, data: Any) -> Any:
        """`gradient_checkpointing` (before activation_checkpointing existed) still works, with a warning."""
        if isinstance(data, dict) and "gradient_checkpointing" in data:
            data = dict(data)
            old = data.pop("gradient_checkpointing")
            warnings.warn(
                "trainer.gradient_checkpointing is deprecated: use trainer.activation_checkpointing (auto | true | false)",
                DeprecationWarning, stacklevel=2,
            )  # fmt: skip
            data.setdefault("activation_checkpointing", old)
        return data

    def checkpointing_on(self, device: torch.device) -> bool:
        """`activation_checkpointing` resolved for a model on `device`."""
        return device.type == "cuda" if self.activation_checkpointing == "auto" else bool(self.activation_checkpointing)


@dataclass
class Sample:
    """One training sequence: a segment of a trajectory with its advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    behav_logprobs: list[float]
    versions: list[int]
    advantage: float
    episode: int | None = None  # which episode of the step it belongs to (several segments may); None: its own

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


def groups_to_samples(
    rewards: Sequence[Sequence[float]], trajectories: Sequence[Sequence[Any]], cfg: AdvantageConfig, *, first_episode: int = 0
):
    """(G, n) rewards + trajectories -> Samples (one per segment with generated tokens, numbered by episode from
    `first_episode`) and advantages."""
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float32), cfg)
    samples = []
    episodes = itertools.count(first_episode)
    for g, group in enumerate(trajectories):
        for i, traj in enumerate(group):
            e = next(episodes)
            for seg in traj.segments:
                if seg.n_generated:
                    samples.append(Sample(seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions, float(adv[g, i]) * seg.advantage_scale, e))
    return samples, adv


def weigh_episodes_equally(samples: Sequence[Sample]) -> list[Sample]:
    """`loss.aggregation: episode`: each sample's advantage scaled by its episode's a_e (`episode_weights`)."""
    keys = [("episode", s.episode) if s.episode is not None else ("sample", k) for k, s in enumerate(samples)]
    tokens: dict[tuple[str, int], int] = {}
    for key, s in zip(keys, samples, strict=True):
        tokens[key] = tokens.get(key, 0) + s.n_generated
    scale = dict(zip(tokens, episode_weights(list(tokens.values())), strict=True))
    return [dataclasses.replace(s, advantage=s.advantage * scale[key]) for key, s in zip(keys, samples, strict=True)]


def micro_batches(samples: Sequence[Sample], token_budget: int, *, packing: bool = False) -> list[list[int]]:
    """Indices grouped into micro-batches of (rows x row width) within `token_budget`; a longer sample is one alone.

    Padded (`packing` off): a row per sample, as wide as the longest, similar lengths together. Packed: rows as
    wide as the micro-batch's longest sample, each holding as many samples end to end as fit (`pack_rows`).
    """
    if packing:
        return _packed_micro_batches([len(s.token_ids) for s in samples], token_budget)
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].token_ids))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = max([len(samples[j].token_ids) for j in cur] + [len(samples[i].token_ids)])
        if cur and longest * (len(cur) + 1) > token_budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def _packed_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Longest first: each sample goes into the first row of any micro-batch with room for it, else into a new
    row of the last micro-batch while (rows x its width) stays within the budget, else opens a micro-batch
    as wide as itself. `pack_rows` on a micro-batch's lengths gives back the same rows."""
    batches: list[list[int]] = []
    widths: list[int] = []
    rooms: list[list[int]] = []  # per micro-batch, the free tokens of each row
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        b, r = next(((b, r) for b, room in enumerate(rooms) for r, free in enumerate(room) if n <= free), (None, 0))
        if b is None and batches and (len(rooms[-1]) + 1) * widths[-1] <= token_budget:
            b, r = len(batches) - 1, len(rooms[-1])
            rooms[-1].append(widths[-1])
        elif b is None:
            b, r = len(batches), 0
            batches.append([])
            widths.append(n)
            rooms.append([n])
        batches[b].append(i)
        rooms[b][r] -= n
    return batches


def pack_rows(lengths: Sequence[int]) -> list[list[int]]:
    """Sample indices in rows as wide as the longest sample, longest first, each into the first row it fits.
    Not wider: attention costs (row width)^2 per row whatever the mask, so a row as wide as the padded layout's
    keeps its cost while its padding is filled."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if r is None:
            rows.append([])
            room.append(max(lengths))
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= lengths[i]
    return rows


@dataclass
class _Layout:
    """Where a micro-batch's samples sit in the rows the decoder runs on, and which log-probs it wants."""

    ids: torch.Tensor  # (rows, width)
    attention_mask: torch.Tensor | None  # padded rows: 1 on tokens
    position_ids: torch.Tensor | None  # packed rows: restarting at every sample (block-diagonal attention)
    row_lengths: list[list[int]]  # per row, the lengths of the samples laid end to end from its start
    source: torch.Tensor  # (n,) flat index into (rows * width) of the hidden state predicting each target
    targets: torch.Tensor  # (n,) the predicted tokens
    out_index: tuple[torch.Tensor, torch.Tensor]  # (n,) sample and position of each log-prob in the output
    shape: tuple[int, int]  # (samples, longest)


def _layout(samples: Sequence[Sample], *, packing: bool, generated_only: bool) -> _Layout:
    lengths = [len(s.token_ids) for s in samples]
    rows = pack_rows(lengths) if packing else [[k] for k in range(len(samples))]
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    source: list[int] = []
    row_lengths: list[list[int]] = [[lengths[k] for k in members] for members in rows]
    out_rows: list[int] = []
    out_cols: list[int] = []
    for r, members in enumerate(rows):
        start = 0
        for k in members:
            s, n = samples[k], lengths[k]
            ids[r, start : start + n] = torch.tensor(s.token_ids)
            attn[r, start : start + n] = 1
            pos[r, start : start + n] = torch.arange(n)
            wanted = [t for t in range(1, n) if s.loss_mask[t]] if generated_only else range(1, n)
            source.extend(r * width + start + t - 1 for t in wanted)  # token t is predicted from position t - 1
            out_rows.extend(k for _ in wanted)
            out_cols.extend(wanted)
            start += n
        pos[r, start:] = torch.arange(width - start)  # the padding: a sequence of its own
    source_t = torch.tensor(source, dtype=torch.long)
    return _Layout(
        ids, None if packing else attn, pos if packing else None, row_lengths, source_t, ids.flatten()[source_t + 1],
        (torch.tensor(out_rows, dtype=torch.long), torch.tensor(out_cols, dtype=torch.long)), (len(samples), width),
    )  # fmt: skip


# Causal LMs whose logits are exactly lm_head(final hidden state): no logit scaling or soft-capping, so the
# head may be applied to a subset of positions, a chunk at a time.
_PLAIN_HEAD_MODELS = frozenset({"qwen2", "qwen3", "llama", "mistral"})


def sequence_logprobs(
    model: Any, samples: Sequence[Sample], temperature: float, *, generated_only: bool = False, packing: bool = False,
    chunk: int = 4096, keep_bytes: int = 0,
) -> torch.Tensor:  # fmt: skip
    """log pi(token_t | tokens_<t) under the sampling temperature, shape (samples, longest); 0 at position 0.

    `generated_only`: only where the loss mask is 1 (0 elsewhere). `packing`: the samples run concatenated in
    rows with positions restarting at each (`pack_rows`), not one padded row each; same values up to float
    rounding. The LM head runs inside the model's own forward (so a sharded model's root gathers it) on the
    wanted positions alone, `chunk` of them at a time, its softmax kept for backward if it takes at most
    `keep_bytes` (`chunked_target_logprobs`); a model whose logits are
    more than the head's output (not in _PLAIN_HEAD_MODELS) computes full logits instead.
    """
    device = next(model.parameters()).device
    lay = _layout(samples, packing=packing, generated_only=generated_only)
    source, targets = lay.source.to(device, non_blocking=True), lay.targets.to(device, non_blocking=True)
    inputs = {"input_ids": lay.ids.to(device), "use_cache": False}
    if lay.attention_mask is not None:
        inputs["attention_mask"] = lay.attention_mask.to(device)
    if lay.position_ids is not None:
        inputs["position_ids"] = lay.position_ids.to(device)
        if use_packed_attention(model):  # each sample its own causal block, not the row's dense mask
            inputs["packed_lengths"] = lay.row_lengths
    head = model.get_output_embeddings()
    if getattr(model.config, "model_type", None) in _PLAIN_HEAD_MODELS and getattr(head, "bias", None) is None:
        with _head_replaced(model, _LogprobHead(head, source, targets, temperature, chunk, keep_bytes)):
            lp = model(**inputs).logits
    else:
        logits = model(**inputs).logits
        logits = logits.flatten(0, 1).index_select(0, source).float()
        if temperature > 0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    rows, cols = (t.to(device, non_blocking=True) for t in lay.out_index)
    return torch.zeros(lay.shape, dtype=lp.dtype, device=device).index_put((rows, cols), lp)


class _LogprobHead(torch.nn.Module):
    """Stands in for a causal LM's head during one forward: returns the log-probs of `targets` at `source`."""

    def __init__(
        self, head: torch.nn.Module, source: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int,
        keep_bytes: int = 0,
    ):  # fmt: skip
        super().__init__()
        self.head = head  # a submodule, so that hooks walking the model still find it
        self.source, self.targets, self.temperature, self.chunk = source, targets, temperature, chunk
        self.keep_bytes = keep_bytes

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        selected = hidden.flatten(0, 1).index_select(0, self.source)
        return chunked_target_logprobs(
            selected, cast(torch.Tensor, self.head.weight), self.targets, self.temperature, self.chunk, keep_bytes=self.keep_bytes
        )


@contextlib.contextmanager
def _head_replaced(model: Any, replacement: _LogprobHead):
    """`model`'s output embedding module swapped for `replacement` inside the block (found by identity, so a
    LoRA wrapper's inner model works too)."""
    parent, name = next(
        (m, n) for m in model.modules() for n, child in m.named_children() if child is replacement.head
    )
    setattr(parent, name, replacement)
    try:
        yield
    finally:
        setattr(parent, name, replacement.head)


def chunked_target_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int,
    *, keep_bytes: int = 0,
) -> torch.Tensor:  # fmt: skip
    """log softmax(hidden @ weight.T / temperature)[targets] per row, float32, shape (n,): logits a chunk of
    rows at a time (in the autocast dtype if one is on), float32 log-sum-exp. Backward recomputes them chunk by
    chunk, so no (n x vocab) tensor ever lives, unless the softmax (n x vocab in that dtype) takes at most
    `keep_bytes`: then it is kept from forward, saving backward one matmul."""
    dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) else weight.dtype
    keep = hidden.shape[0] * weight.shape[0] * dtype.itemsize <= keep_bytes
    t = temperature if temperature > 0 else 1.0
    return _ChunkedTargetLogprobs.apply(hidden, weight, targets, t, chunk, dtype, keep)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """float32 logits / temperature of a chunk, the matmul in `dtype` (a fresh tensor: safe to change in place)."""
    logits = (hidden.to(dtype) @ weight.to(dtype).T).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _ChunkedTargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, dtype, keep):  # noqa: ANN001, ANN205
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        keep = keep and any(ctx.needs_input_grad[:2])
        kept: list[torch.Tensor | None] = []  # per chunk, its softmax in `dtype` (keep) for backward
        with torch.autocast(hidden.device.type, enabled=False):
            for a in range(0, hidden.shape[0], chunk):
                z = _chunk_logits(hidden[a : a + chunk], weight, dtype, temperature)
                picked = z.gather(-1, targets[a : a + chunk, None]).squeeze(-1)
                top = z.amax(-1)
                total = z.sub_(top[:, None]).exp_().sum(-1)  # in place: one chunk tensor
                lse[a : a + chunk] = top + total.log()
                out[a : a + chunk] = picked - lse[a : a + chunk]
                if keep:
                    kept.append(z.div_(total[:, None]).to(dtype))
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.kept = temperature, chunk, dtype, kept or None
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        hidden, weight, targets, lse = ctx.saved_tensors
        t, dtype = ctx.temperature, ctx.dtype
        kept, ctx.kept = ctx.kept, None  # changed in place below: a second backward recomputes
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        w = weight.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for i, a in enumerate(range(0, hidden.shape[0], ctx.chunk)):
                h = hidden[a : a + ctx.chunk].to(dtype)
                g = grad_out[a : a + ctx.chunk, None].float() / t
                # d out / d z = onehot(target) - softmax(z), z = logits / t
                if kept is not None:
                    dz = kept[i].mul_(-g.to(dtype)).scatter_add_(-1, targets[a : a + ctx.chunk, None], g.to(dtype))
                    kept[i] = None
                else:
                    z = _chunk_logits(h, w, dtype, t).sub_(lse[a : a + ctx.chunk, None]).exp_().mul_(-g)
                    dz = z.scatter_add_(-1, targets[a : a + ctx.chunk, None], g).to(dtype)
                if grad_hidden is not None:
                    grad_hidden[a : a + ctx.chunk] = dz @ w
                if grad_weight is not None:
                    grad_weight += (dz.T @ h).float()
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None, None


def _is_sharded(model: Any) -> bool:
    """An FSDP-wrapped model must be called as a whole: its root unshards the embedding and the head."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(model, FSDPModule)


# Stands in for a micro-batch on a process that has run out of samples: its all-zero loss mask gives a
# zero gradient, while its forward and backward still join the collectives of a sharded model.
_NOOP = Sample(token_ids=[0, 0], loss_mask=[0, 0], behav_logprobs=[0.0, 0.0], versions=[0, 0], advantage=0.0)


def _pad(rows: Sequence[Sequence[float]], longest: int, fill: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), longest), fill, dtype=torch.float32)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


# -- the staleness lab: per step, generated tokens counted by versions behind the trained policy (and how many
#    of those the correction masked) and by importance ratio, in the fixed bins of `asearch.metrics.offpolicy`.
_N_BEHIND, _N_RATIO = len(VERSIONS_BEHIND_LABELS), len(RATIO_LABELS)
_LAB_SIZE = 2 * _N_BEHIND + _N_RATIO  # [tokens by behind | masked by behind | tokens by ratio]


def staleness_lab_counts(
    prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, loss_mask: torch.Tensor, versions: torch.Tensor,
    policy_version: int, cfg: LossConfig,
) -> torch.Tensor:  # fmt: skip
    """Token counts of one micro-batch, shape (_LAB_SIZE,): generated tokens by min(v - version, 4), how far
    behind the trained version v they were sampled; the ones `cfg.correction` masks, in the same bins; and
    generated tokens by w = pi_prox / pi_behav."""
    with torch.no_grad():
        w, _, keep = corrected_weights(prox_logprobs, behav_logprobs, loss_mask, cfg)
        generated = loss_mask > 0
        behind = (policy_version - versions[generated]).clamp(0, _N_BEHIND - 1).long()
        edges = torch.tensor(RATIO_EDGES, dtype=w.dtype, device=w.device)
        ratio_bin = torch.bucketize(w[generated], edges, right=True)
        return torch.cat([
            torch.bincount(behind, minlength=_N_BEHIND),
            torch.bincount(behind[keep[generated] == 0], minlength=_N_BEHIND),
            torch.bincount(ratio_bin, minlength=_N_RATIO),
        ]).float()  # fmt: skip


def staleness_lab_stats(counts: Sequence[float]) -> dict[str, float]:
    """The metrics row of the summed counts: both histograms (every bin), the masked share per staleness
    bin that has tokens, and the masked share overall."""
    tokens, masked, ratio = counts[:_N_BEHIND], counts[_N_BEHIND : 2 * _N_BEHIND], counts[2 * _N_BEHIND :]
    out = {f"{VERSIONS_BEHIND_HIST}{b}": c for b, c in zip(VERSIONS_BEHIND_LABELS, tokens, strict=True)}
    out.update({f"{RATIO_HIST}{b}": c for b, c in zip(RATIO_LABELS, ratio, strict=True)})
    for b, m, n in zip(VERSIONS_BEHIND_LABELS, masked, tokens, strict=True):
        if n:
            out[f"{MASKED_FRAC_BY_STALENESS}{b}"] = m / n
    out[MASKED_FRAC] = sum(masked) / max(sum(tokens), 1.0)
    return out


class Trainer(Protocol):
    """What the RL loop needs of a trainer: `PolicyTrainer` here, or FSDP ranks elsewhere
    (`asearch.launch.ray.RayTrainerGroup`)."""

    def train_step(self, samples: Sequence[Sample], *, policy_version: int, progress: float | None = None) -> dict[str, float]: ...

    def save_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None, dtype: str | None = None) -> Path: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_checkpoint(self, directory: Path) -> None:
        """Write the trainer's state into `directory` (each process its own part)."""
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Read what `save_checkpoint` wrote (or a whole-state `trainer.pt`)."""
        ...

    def weights_digest(self) -> list[float]:
        """[sum, sum of squares] of the policy's weights in float64 (`weights_digest`; every rank takes part)."""
        ...


# A checkpoint's whole trainer state in one file: one process's trainer, and checkpoints from before sharding.
TRAINER_STATE_FILE = "trainer.pt"


@torch.no_grad()
def weights_digest(model: Any) -> list[float]:
    """[sum, sum of squares] over every parameter's values, in float64: equal weights give equal digests
    (up to float64 rounding when a resumed run shards them otherwise). A DTensor's sums are reduced over the
    ranks that shard it (a collective: every rank calls this), so each rank gets the whole model's."""
    total = [0.0, 0.0]
    for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        values = param.detach().double()
        for i, part in enumerate((values.sum(), (values * values).sum())):
            total[i] += float(part.full_tensor() if hasattr(part, "full_tensor") else part)
    return total


def enable_activation_checkpointing(model: Any) -> None:
    """Each decoder layer recomputed in backward (non-reentrant: needs no input that requires grad, so frozen
    embeddings under LoRA are fine, and FSDP's hooks stay outside the checkpointed forward)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        if not model.is_activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif not model.is_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def frozen_copy(model: Any) -> Any:
    """A copy of `model` no optimizer sees, in eval mode: the reference policy of the KL penalty."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


class PolicyTrainer(BroadcastsWeights):
    """`reference`: the KL penalty's policy (`loss.kl_coef > 0`); default, a frozen copy of `model` as given,
    or with LoRA the same model with its adapters switched off (no copy)."""

    def __init__(
        self, model: Any, cfg: TrainerConfig, *, temperature: float = 1.0, total_steps: int = 1, reference: Any = None
    ):
        bf16 = cfg.param_dtype == "bfloat16" and not _is_sharded(model)  # FSDP: its mixed-precision policy instead
        if bf16 and any(p.dtype != torch.bfloat16 for p in model.parameters()):
            model.to(torch.bfloat16)  # before the reference is copied: it is kept in bfloat16 too
        if reference is None and cfg.loss.kl_coef > 0 and not cfg.lora.enabled:
            reference = frozen_copy(model)
        self.reference = reference
        model = add_lora(model, cfg.lora, seed=cfg.seed)
        self.model, self.cfg, self.temperature = model, cfg, temperature
        self.total_steps = max(total_steps, 1)
        self.device = next(model.parameters()).device  # the caller places the model (`trainer.device`)
        self.compute_dtype = resolve_dtype(cfg.dtype, self.device)
        if cfg.checkpointing_on(self.device):
            enable_activation_checkpointing(model)
        self.master = Float32Master([p for p in model.parameters() if p.requires_grad])
        self.optimizer = make_optimizer(self.master.params, cfg.optim, device=self.device)
        self.peak_flops = peak_flops(self.device)  # the MFU denominator (None: unknown, no perf/mfu)
        self.n_params = sum(p.numel() for p in model.parameters())
        self._progress: float | None = None  # the run's, when the caller says (see train_step)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.rng = random.Random(cfg.seed)
        self.step = 0  # optimizer steps taken

    def _lr_factor(self, opt_step: int) -> float:
        return lr_factor(self.cfg.optim, opt_step, self.total_steps * self.cfg.n_minibatches, self._progress)

    # -- the hooks a data-parallel trainer overrides (asearch.rl.distributed.DistributedPolicyTrainer);
    #    here: one process sees every sample.

    def _shard(self, samples: Sequence[Sample], idx: list[int]) -> list[int]:
        """The part of a minibatch (sample indices) this process computes."""
        return idx

    def _micro_batches(self, samples: Sequence[Sample], idx: list[int]) -> list[list[int]]:
        """`idx` in token-budget micro-batches (lists of sample indices; [] = a no-op stand-in)."""
        rows = [samples[i] for i in idx]
        return [[idx[j] for j in mb] for mb in micro_batches(rows, self.cfg.token_budget, packing=self.cfg.packing)]

    def _all_sum(self, values: list[float]) -> list[float]:
        """Sums over all processes."""
        return values

    def _clip_grad_norm(self) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.master.params, self.cfg.optim.grad_clip))

    def _world_size(self) -> int:
        """Devices the step runs on (the MFU denominator's count)."""
        return 1

    def train_step(self, samples: Sequence[Sample], *, policy_version: int, progress: float | None = None) -> dict[str, float]:
        """One RL step. `progress` (0-1): how far the run is, e.g. by its time budget; the LR schedule takes
        it when it is further along than the step count."""
        cfg = self.cfg
        started = time.perf_counter()
        self._progress = progress
        if cfg.loss.aggregation == "episode":
            samples = weigh_episodes_equally(samples)
        self.model.train()
        order = list(range(len(samples)))
        self.rng.shuffle(order)
        minibatches = [self._shard(samples, order[k :: cfg.n_minibatches]) for k in range(cfg.n_minibatches)]
        # a minibatch's loss is the mean over all its loss-mask tokens, whichever process holds them
        counts = self._all_sum(
            [float(sum(samples[i].n_generated for i in mb)) for mb in minibatches]
            + [float(len(mb)) for mb in minibatches]
        )
        mb_tokens, mb_sizes = counts[: cfg.n_minibatches], counts[cfg.n_minibatches :]

        # -- 1. proximal log-probs: the policy as it is before this step's updates. The first minibatch is
        # trained before any update, so its own forward gives them (below, kept for later epochs): only the
        # other minibatches need this extra pass, and with one minibatch (the default) it is skipped.
        prox: dict[int, torch.Tensor] = {}
        if cfg.prox == "recompute" and cfg.n_minibatches > 1:
            with torch.no_grad(), autocast(self.device, self.compute_dtype):
                for idx in self._micro_batches(samples, sorted(i for mb in minibatches[1:] for i in mb)):
                    use_attention(self.model, max((len(samples[i].token_ids) for i in idx), default=1), cfg)
                    lp = self._logprobs(self.model, [samples[i] for i in idx] or [_NOOP]).cpu()
                    for r, i in enumerate(idx):
                        prox[i] = lp[r, : len(samples[i].token_ids)]

        # -- 2. minibatch updates
        stats: dict[str, float] = {}
        n_stats = 0
        grad_norms: list[float] = []
        lab = torch.zeros(_LAB_SIZE)  # the staleness lab's counts, over the first pass: each sample once
        updates = cfg.epochs * cfg.n_minibatches
        for u, (k_mb, mb) in enumerate(itertools.chain.from_iterable(enumerate(minibatches) for _ in range(cfg.epochs))):
            if not mb_sizes[k_mb]:
                continue  # fewer samples than minibatches
            self.optimizer.zero_grad(set_to_none=True)
            for idx in self._micro_batches(samples, mb):
                first_pass = u < cfg.n_minibatches
                s, lab_counts = self._micro_batch(
                    samples, idx, prox, update=(u, updates), policy_version=policy_version, mb_tokens=mb_tokens[k_mb],
                    count_lab=first_pass,
                )  # fmt: skip
                for k, v in s.items():  # every process has the same keys, for the sum below
                    stats[k] = stats.get(k, 0.0) + (v if idx else 0.0)
                n_stats += bool(idx)
                if lab_counts is not None:
                    lab += lab_counts
            self.master.grads_in()
            grad_norms.append(self._clip_grad_norm())
            # every rank has the global norm, so all raise together
            raise_if_diverged(grad_norms[-1], cfg.optim, where="trainer", step=self.step)
            self.optimizer.step()
            self.master.weights_out()
            self.scheduler.step()
            self.step += 1
        keys = sorted(stats)
        sums = self._all_sum([stats[k] for k in keys] + [float(n_stats)])
        out = {k: v / max(sums[-1], 1) for k, v in zip(keys, sums, strict=False)}
        out.update(staleness_lab_stats(self._all_sum(lab.tolist())))
        out["perf/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        out["perf/lr"] = float(self.scheduler.get_last_lr()[0])
        out["perf/train_tokens"] = float(sum(len(s.token_ids) for s in samples))
        out["perf/train_samples"] = float(len(samples))
        synchronize(self.device)  # the last optimizer step's kernels belong to this step's time
        out.update(self._speed(samples, time.perf_counter() - started))
        restore_attention(self.model)  # whoever uses the model next finds it as it was given
        self.model.eval()
        return out

    def _micro_batch(
        self, samples: Sequence[Sample], idx: list[int], prox: dict[int, torch.Tensor], *, update: tuple[int, int],
        policy_version: int, mb_tokens: float, count_lab: bool,
    ) -> tuple[dict[str, float], torch.Tensor | None]:  # fmt: skip
        """Forward and backward of one micro-batch (`idx`; [] = the no-op stand-in), its loss scaled by its
        share of the minibatch's `mb_tokens` loss-mask tokens. Returns the loss stats and, with `count_lab`
        (the first pass over the samples: each is counted once), the lab's counts."""
        rows = [samples[i] for i in idx] or [_NOOP]
        longest = max(len(s.token_ids) for s in rows)
        use_attention(self.model, longest, self.cfg)
        with autocast(self.device, self.compute_dtype):
            logp = self._logprobs(self.model, rows)
        behav = _pad([s.behav_logprobs for s in rows], longest)
        mask = _pad([s.loss_mask for s in rows], longest)
        adv = torch.tensor([s.advantage for s in rows])[:, None].expand(-1, longest)
        prox_lp = self._proximal(logp, behav, samples, idx, prox, update=update, policy_version=policy_version)
        ref_lp = self._reference_logprobs(rows, longest) if self.cfg.loss.kl_coef > 0 else None
        dev = logp.device
        loss, stats = decoupled_ppo_loss(
            logp, prox_lp.to(dev), behav.to(dev), adv.to(dev), mask.to(dev), self.cfg.loss, ref_logprobs=ref_lp
        )
        # the no-op stand-in has an all-zero mask: a zero gradient, but every collective runs
        (loss * (sum(s.n_generated for s in rows) / max(mb_tokens, 1))).backward()
        if not count_lab:
            return stats, None
        versions = _pad([s.versions for s in rows], longest)
        return stats, staleness_lab_counts(prox_lp, behav, mask, versions, policy_version, self.cfg.loss)

    @torch.no_grad()
    def _reference_logprobs(self, rows: Sequence[Sample], longest: int) -> torch.Tensor:
        """log pi_ref of a micro-batch's rows, for the KL penalty."""
        with autocast(self.device, self.compute_dtype):
            if self.reference is None:  # LoRA: the reference is the base model, the adapters off
                with self.model.disable_adapter():
                    return self._logprobs(self.model, rows)
            use_attention(self.reference, longest, self.cfg)
            return self._logprobs(self.reference, rows)

    def _logprobs(self, model: Any, rows: Sequence[Sample]) -> torch.Tensor:
        """log-probs of the generated tokens of `rows`, (rows, longest), as the config lays them out."""
        cfg = self.cfg
        return sequence_logprobs(
            model, rows, self.temperature, generated_only=True, packing=cfg.packing, chunk=cfg.logprob_chunk,
            keep_bytes=cfg.logprob_keep_mib * 2**20,
        )

    def _speed(self, samples: Sequence[Sample], seconds: float) -> dict[str, float]:
        """perf/train_tokens_per_s of the step, and perf/mfu where the device's peak is known: model FLOPs
        (6 per parameter per token, plus causal attention's 6 x layers x hidden x length^2 per sample, forward
        and backward; recomputation and the extra log-prob passes not counted) over peak x seconds."""
        tokens = sum(len(s.token_ids) for s in samples)
        out = {"perf/train_tokens_per_s": tokens / max(seconds, 1e-9)}
        if self.peak_flops:
            config = getattr(self.model, "config", None)
            layers, hidden = getattr(config, "num_hidden_layers", 0), getattr(config, "hidden_size", 0)
            flops = 6 * self.n_params * tokens + 6 * layers * hidden * sum(len(s.token_ids) ** 2 for s in samples)
            out["perf/mfu"] = flops / (seconds * self.peak_flops * self._world_size())
        return out

    def _proximal(
        self, logp: torch.Tensor, behav: torch.Tensor, samples: Sequence[Sample], idx: list[int],
        prox: dict[int, torch.Tensor], *, update: tuple[int, int], policy_version: int,
    ) -> torch.Tensor:  # fmt: skip
        """log pi_prox of one micro-batch at update u of the step's U (`update`), per `trainer.prox`.
        recompute: before the first update theta is the proximal policy (kept in `prox` for the next
        epochs), after it the values `prox` holds. loglinear: log pi_prox ~ log pi_behav + alpha
        (log pi_theta - log pi_behav), alpha = (v_prox - v_behav) / (v_theta - v_behav), where theta counts
        as version v + u/U (so the first update is exact: alpha = 1, prox = theta)."""
        (u, updates), longest = update, behav.shape[1]
        if self.cfg.prox == "recompute" and u == 0:
            prox_lp = logp.detach().cpu()  # no update yet: theta is the proximal policy
            for r, i in enumerate(idx):  # the next epoch trains these samples again
                prox[i] = prox_lp[r, : len(samples[i].token_ids)]
            return prox_lp
        if self.cfg.prox == "recompute":
            return _pad([prox[i].tolist() for i in idx] or [[0.0] * longest], longest)
        rows = [samples[i] for i in idx] or [_NOOP]
        v_theta = policy_version + u / updates
        v_behav = _pad([s.versions for s in rows], longest, fill=float(policy_version))
        gap = (v_theta - v_behav).clamp(min=1e-9)
        alpha = ((policy_version - v_behav) / gap).clamp(0.0, 1.0)
        alpha = torch.where(v_theta - v_behav < 1e-9, torch.ones_like(alpha), alpha)
        return behav + alpha * (logp.detach().cpu() - behav)

    def save_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None, dtype: str | None = None) -> Path:
        """The policy as a Hugging Face directory (config + safetensors, and the tokenizer if given):
        what `engine.update_weights(directory, version)` loads on a rollout server. With LoRA: the merged
        weights, and the adapters alone in `directory/adapter` (peft's format). `dtype`: the tensors' (default:
        the model's own)."""
        if not is_lora(self.model):
            return write_hf_dir(self.model, directory, tokenizer=tokenizer, dtype=dtype)
        return write_hf_dir(
            base_model(self.model), directory, tokenizer=tokenizer, state_dict=merged_state_dict(self.model),
            adapter=self.model, dtype=dtype,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": adapter_state_dict(self.model) if is_lora(self.model) else self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "rng": self.rng.getstate(),
        } | ({"master": self.master.state_dict()} if self.master.pairs else {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if is_lora(self.model):
            load_adapter_state_dict(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "master" in state:  # bfloat16 weights: their float32 copies, so a resumed run continues exactly
            self.master.load_state_dict(state["master"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.rng.setstate(state["rng"])

    def save_checkpoint(self, directory: Path) -> None:
        torch.save(self.state_dict(), Path(directory) / TRAINER_STATE_FILE)

    def load_checkpoint(self, directory: Path) -> None:
        self.load_state_dict(torch.load(Path(directory) / TRAINER_STATE_FILE, map_location="cpu", weights_only=False))

    def weights_digest(self) -> list[float]:
        return weights_digest(self.model)


def write_hf_dir(
    model: Any, directory: str | os.PathLike[str], *, tokenizer: Any = None, state_dict: dict | None = None,
    adapter: Any = None, dtype: str | None = None,
) -> Path:
    """`model.save_pretrained` (with `state_dict` instead of the model's own, if given, its tensors cast to
    `dtype` if given; a peft `adapter`'s own files under `adapter/`) into a temporary sibling that then
    replaces `directory`, so a server never reads a half-written directory."""
    directory = Path(directory)
    if dtype is not None:
        state_dict = cast_state_dict(model.state_dict() if state_dict is None else state_dict, dtype)
    tmp = directory.with_name(f".tmp-{directory.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state_dict)
    if adapter is not None:
        adapter.save_pretrained(tmp / "adapter")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def cast_state_dict(state: dict[str, Any], dtype: str) -> dict[str, Any]:
    """`state` with its floating-point tensors in `dtype`; tensors that shared storage (a tied LM head) still
    share it, so save_pretrained still recognises them as tied."""
    to = getattr(torch, dtype)
    cast: dict[int, Any] = {}
    out = {}
    for name, t in state.items():
        if not t.is_floating_point():
            out[name] = t
            continue
        if t.data_ptr() not in cast:
            cast[t.data_ptr()] = t.detach().to(to)
        out[name] = cast[t.data_ptr()]
    return out
