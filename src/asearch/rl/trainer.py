"""The policy update of one RL step: groups -> samples -> proximal log-probs -> minibatch PPO updates.

Reads top to bottom in `PolicyTrainer.train_step`: recompute log pi_prox once (no grad; the first minibatch
takes it from its own forward), then for each minibatch accumulate the decoupled PPO loss over
token-budget micro-batches and take one AdamW step.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from pydantic import Field

from asearch.metrics.offpolicy import (
    MASKED_FRAC,
    MASKED_FRAC_BY_STALENESS,
    RATIO_EDGES,
    RATIO_HIST,
    RATIO_LABELS,
    VERSIONS_BEHIND_HIST,
    VERSIONS_BEHIND_LABELS,
)
from asearch.models.device import TrainingPlacement, autocast, resolve_dtype, restore_attention, use_attention
from asearch.models.lora import (
    LoraConfig,
    adapter_state_dict,
    add_lora,
    base_model,
    is_lora,
    load_adapter_state_dict,
    merged_state_dict,
)
from asearch.rl.advantages import AdvantageConfig, group_advantages
from asearch.rl.broadcast import BroadcastsWeights
from asearch.rl.loss import LossConfig, corrected_weights, decoupled_ppo_loss, episode_weights
from asearch.rl.optim import OptimConfig, lr_factor, make_optimizer, raise_if_diverged


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
    gradient_checkpointing: bool = False
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters (lora.r > 0): only they train; checkpoints hold them alone, engines get merged weights.",
    )
    seed: int = 0


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
                    samples.append(Sample(seg.token_ids, seg.loss_mask, seg.logprobs, seg.versions, float(adv[g, i]), e))
    return samples, adv


def weigh_episodes_equally(samples: Sequence[Sample]) -> list[Sample]:
    """`loss.aggregation: episode`: each sample's advantage scaled by its episode's a_e (`episode_weights`)."""
    keys = [("episode", s.episode) if s.episode is not None else ("sample", k) for k, s in enumerate(samples)]
    tokens: dict[tuple[str, int], int] = {}
    for key, s in zip(keys, samples, strict=True):
        tokens[key] = tokens.get(key, 0) + s.n_generated
    scale = dict(zip(tokens, episode_weights(list(tokens.values())), strict=True))
    return [dataclasses.replace(s, advantage=s.advantage * scale[key]) for key, s in zip(keys, samples, strict=True)]


def micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[int]]:
    """Indices grouped so that (rows x longest) stays within the budget; similar lengths together."""
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


# Causal LMs whose logits are exactly lm_head(final hidden state): no logit scaling or soft-capping, so the
# head may be applied to a subset of positions.
_PLAIN_HEAD_MODELS = frozenset({"qwen2", "qwen3", "llama", "mistral"})


def sequence_logprobs(model: Any, samples: Sequence[Sample], temperature: float, *, generated_only: bool = False) -> torch.Tensor:
    """log pi(token_t | tokens_<t) under the sampling temperature, shape (rows, longest); 0 at position 0.

    `generated_only`: only where the loss mask is 1 (0 elsewhere). The LM head and softmax then run on the
    generated tokens alone (a fifth of an episode's positions in the CPU demo; docs/rl.md); a sharded or
    unlisted model still computes every position.
    """
    device = next(model.parameters()).device
    longest = max(len(s.token_ids) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    attn = torch.zeros(len(samples), longest, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, : len(s.token_ids)] = torch.tensor(s.token_ids)
        attn[r, : len(s.token_ids)] = 1
    ids, attn = ids.to(device), attn.to(device)
    plain = getattr(model.config, "model_type", None) in _PLAIN_HEAD_MODELS and not _is_sharded(model)
    if generated_only and plain:
        mask = torch.zeros(len(samples), longest, dtype=torch.bool)
        for r, s in enumerate(samples):
            mask[r, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
        sel = mask[:, 1:].to(device)  # token t is predicted from position t - 1
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[sel]).float()
        if temperature > 0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
        lp = torch.zeros(sel.shape, dtype=lp.dtype, device=device).masked_scatter(sel, lp)
        return torch.nn.functional.pad(lp, (1, 0))
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0))


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


# A checkpoint's whole trainer state in one file: one process's trainer, and checkpoints from before sharding.
TRAINER_STATE_FILE = "trainer.pt"


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
        if reference is None and cfg.loss.kl_coef > 0 and not cfg.lora.enabled:
            reference = frozen_copy(model)
        self.reference = reference
        model = add_lora(model, cfg.lora, seed=cfg.seed)
        self.model, self.cfg, self.temperature = model, cfg, temperature
        self.total_steps = max(total_steps, 1)
        self.device = next(model.parameters()).device  # the caller places the model (`trainer.device`)
        self.compute_dtype = resolve_dtype(cfg.dtype, self.device)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if is_lora(model):  # frozen embeddings: checkpointed blocks need an input that requires grad
                model.enable_input_require_grads()
        self.optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim)
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
        return [[idx[j] for j in mb] for mb in micro_batches(rows, self.cfg.token_budget)]

    def _all_sum(self, values: list[float]) -> list[float]:
        """Sums over all processes."""
        return values

    def _clip_grad_norm(self) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip))

    def train_step(self, samples: Sequence[Sample], *, policy_version: int, progress: float | None = None) -> dict[str, float]:
        """One RL step. `progress` (0-1): how far the run is, e.g. by its time budget; the LR schedule takes
        it when it is further along than the step count."""
        cfg = self.cfg
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
                    lp = sequence_logprobs(self.model, [samples[i] for i in idx] or [_NOOP], self.temperature, generated_only=True)
                    for r, i in enumerate(idx):
                        prox[i] = lp[r, : len(samples[i].token_ids)].cpu()

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
            grad_norms.append(self._clip_grad_norm())
            # every rank has the global norm, so all raise together
            raise_if_diverged(grad_norms[-1], cfg.optim, where="trainer", step=self.step)
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        keys = sorted(stats)
        sums = self._all_sum([stats[k] for k in keys] + [float(n_stats)])
        out = {k: v / max(sums[-1], 1) for k, v in zip(keys, sums, strict=False)}
        out.update(staleness_lab_stats(self._all_sum(lab.tolist())))
        out["perf/grad_norm"] = sum(grad_norms) / max(len(grad_norms), 1)
        out["perf/lr"] = self.scheduler.get_last_lr()[0]
        out["perf/train_tokens"] = float(sum(len(s.token_ids) for s in samples))
        out["perf/train_samples"] = float(len(samples))
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
            logp = sequence_logprobs(self.model, rows, self.temperature, generated_only=True)
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
        (loss * (mask.sum().item() / max(mb_tokens, 1))).backward()
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
                    return sequence_logprobs(self.model, rows, self.temperature, generated_only=True)
            use_attention(self.reference, longest, self.cfg)
            return sequence_logprobs(self.reference, rows, self.temperature, generated_only=True)

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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if is_lora(self.model):
            load_adapter_state_dict(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.rng.setstate(state["rng"])

    def save_checkpoint(self, directory: Path) -> None:
        torch.save(self.state_dict(), Path(directory) / TRAINER_STATE_FILE)

    def load_checkpoint(self, directory: Path) -> None:
        self.load_state_dict(torch.load(Path(directory) / TRAINER_STATE_FILE, map_location="cpu", weights_only=False))


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
