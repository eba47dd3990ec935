"""Decoupled PPO with a choice of off-policy correction: the clipped surrogate against a proximal policy,
weighted and masked by how far behaviour is from it.

    J = sum_t keep_t * c_t * min(u_t * A_t, clip(u_t, 1 - eps, 1 + eps) * A_t) / N
        u_t = pi_theta / pi_prox     (the trust region is around the proximal policy)
        w_t = pi_prox / pi_behav     (tokens were sampled by an older policy, or another engine; no gradient)
        (c_t, keep_t) = correction(w_t): the weight a token gets and whether it stays in the loss
        N = the generated tokens, counted before any masking, so masking shrinks the loss
Every token weighs the same there, so an episode weighs by its length; `loss.aggregation: episode` rescales
each episode's advantage (`episode_weights`) so that every episode weighs the same instead.
The corrections (`loss.correction`, one `@register_correction` function each in `CORRECTIONS`):
    decoupled   c = w,           keep: w <= cap                   (AReaL's; the default)
    tis         c = min(w, C),   keep: every token                (truncated importance sampling)
    token_mask  c = w,           keep: lo <= w <= hi              (IcePop-style band per token)
    seq_mask    c = w,           keep: lo <= rho_seq <= hi        (the whole sequence in or out)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import torch
from pydantic import AfterValidator, Field, model_validator

from asearch.config import Config
from asearch.registry import Registry

# -- the corrections: (w, loss mask (rows, T) float, cfg) -> (weight c, keep 0/1 float). Rows are sequences
#    (the trainer pads one sample per row), which `seq_mask` reads; the others act per token.
WeightAndKeep = tuple[torch.Tensor, torch.Tensor]
Correction = Callable[[torch.Tensor, torch.Tensor, "LossConfig"], WeightAndKeep]
CORRECTIONS: Registry[Correction] = Registry("loss correction", "asearch.rl", wants=lambda s: "@register_correction(" in s)


def register_correction(name: str) -> Callable[[Correction], Correction]:
    """Make the decorated function the correction `loss.correction=<name>` picks."""
    return CORRECTIONS.decorator(name)


class LossConfig(Config):
    eps_clip: float = Field(0.2, gt=0, description="PPO clip range around pi_prox: u in [1 - eps, 1 + eps].")
    eps_clip_high: float | None = Field(
        None, gt=0, description="Asymmetric upper clip (DAPO's clip-higher); None: eps_clip."
    )
    kl_coef: float = Field(
        0.0, ge=0, description="k3 KL penalty against the policy the run started from (the trainer keeps a "
        "frozen copy; with LoRA it switches the adapters off instead); 0: off, no reference kept."
    )
    correction: Annotated[str, AfterValidator(CORRECTIONS.check)] = Field(  # any registered correction
        "decoupled",
        description="Off-policy correction by w = pi_prox / pi_behav. decoupled: weight w, mask tokens with w above "
        "behav_weight_cap. tis: weight min(w, tis_cap), nothing masked. token_mask: weight w, mask tokens with w "
        "outside [mask_low, mask_high]. seq_mask: weight w, mask every token of a sequence whose ratio "
        "(seq_ratio) is outside [seq_mask_low, seq_mask_high]. docs/rl.md says when to use which.",
    )
    behav_weight_cap: float | None = Field(
        5.0, gt=0, description="decoupled: mask tokens with w above this (AReaL and ASearcher: 5); None: no mask."
    )
    tis_cap: float = Field(2.0, gt=0, description="tis: the truncation C of min(w, C) (verl recommends 2).")
    mask_low: float = Field(0.5, ge=0, description="token_mask: low end of the band of w kept (IcePop: 0.5).")
    mask_high: float = Field(5.0, gt=0, description="token_mask: high end of the band of w kept (IcePop: 5).")
    seq_ratio: Literal["geometric", "product"] = Field(
        "geometric",
        description="seq_mask: the sequence's ratio. geometric: exp(mean_t log w_t), the same scale at any length; "
        "product: exp(sum_t log w_t), the sequence's own likelihood ratio (its band must widen with length).",
    )
    seq_mask_low: float = Field(0.5, ge=0, description="seq_mask: low end of the band of sequence ratios kept.")
    seq_mask_high: float = Field(2.0, gt=0, description="seq_mask: high end of the band of sequence ratios kept.")

    aggregation: Literal["token", "episode"] = Field(
        "token",
        description="token: the loss is a mean over generated tokens (a long episode weighs more). episode: a mean "
        "over episodes of each one's token mean (every episode weighs the same; `episode_weights`).",
    )

    @model_validator(mode="after")
    def _bands_are_ordered(self) -> LossConfig:
        for low, high in (("mask_low", "mask_high"), ("seq_mask_low", "seq_mask_high")):
            if getattr(self, low) >= getattr(self, high):
                raise ValueError(f"{low} must be below {high}: got {getattr(self, low)} >= {getattr(self, high)}")
        return self


@register_correction("decoupled")
def decoupled_correction(w: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> WeightAndKeep:
    """c_t = w_t; keep_t = [w_t <= cap]: a token too far off-policy is dropped rather than trusted."""
    if cfg.behav_weight_cap is None:
        return w, mask
    over_cap = (w > cfg.behav_weight_cap) & (mask > 0)
    return w, mask * (~over_cap).float()


@register_correction("tis")
def tis_correction(w: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> WeightAndKeep:
    """c_t = min(w_t, C); keep_t = 1: every token trains, and none weighs more than C (a biased, bounded
    variance estimate instead of an unbiased, unbounded one)."""
    return w.clamp(max=cfg.tis_cap), mask


@register_correction("token_mask")
def token_mask_correction(w: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> WeightAndKeep:
    """c_t = w_t; keep_t = [lo <= w_t <= hi]: tokens the proximal policy finds much less likely than the
    sampler did (w_t < lo) are dropped as well as the ones it finds much more likely."""
    in_band = (w >= cfg.mask_low) & (w <= cfg.mask_high)
    return w, mask * in_band.float()


@register_correction("seq_mask")
def seq_mask_correction(w: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> WeightAndKeep:
    """c_t = w_t; keep_t = [lo <= rho <= hi] for every token of the row, with
        log rho = sum_t m_t log w_t / sum_t m_t   (geometric)   or   sum_t m_t log w_t   (product)
    over the row's generated tokens m_t: a sequence that drifted is dropped whole, not token by token."""
    log_w = torch.where(mask > 0, torch.log(w), torch.zeros_like(w))  # padding and prompt count 0, never nan
    log_rho = log_w.sum(dim=-1, keepdim=True)
    if cfg.seq_ratio == "geometric":
        log_rho = log_rho / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    rho = torch.exp(log_rho)
    in_band = (rho >= cfg.seq_mask_low) & (rho <= cfg.seq_mask_high)
    return w, mask * in_band.float()


def episode_weights(episode_tokens: Sequence[int]) -> list[float]:
    """The advantage scale a_e of each episode under `aggregation: episode`, which turns the token mean into
    a mean over episodes:

        sum_e sum_t a_e * l_et / N  =  (1/E) sum_e (1/n_e) sum_t l_et      with  a_e = N / (E * n_e)
        n_e = episode e's generated tokens, N = sum_e n_e, E = the episodes with any

    With token weighting, the episodes of a group that failed long (a loop, a page read to its end) push their
    common, mostly right, actions down by more than the short successes push them up; here they cancel.
    """
    n_total, n_episodes = sum(episode_tokens), sum(1 for n in episode_tokens if n > 0)
    return [n_total / (n_episodes * n) if n > 0 else 0.0 for n in episode_tokens]


def corrected_weights(
    prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, loss_mask: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, c, keep) of `cfg.correction`, without gradient: the behaviour weight, the weight the loss applies
    and the 0/1 mask of the tokens it keeps (0 off the loss mask)."""
    w = torch.exp(prox_logprobs - behav_logprobs).detach()
    weight, keep = CORRECTIONS[cfg.correction](w, loss_mask.float(), cfg)
    return w, weight, keep


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref), unbiased and never negative:

        k3_t = r_t - 1 - log r_t,   r_t = pi_ref(token_t) / pi(token_t)
    """
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - 1 - log_r


def decoupled_ppo_loss(
    logprobs: torch.Tensor,  # log pi_theta, with grad
    prox_logprobs: torch.Tensor,  # log pi_prox, recomputed once per step before the minibatch loop
    behav_logprobs: torch.Tensor,  # log pi_behav, from the engine at sampling time
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,  # 1 on generated tokens; (rows, T) with one sequence per row for seq_mask
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    generated = loss_mask.float()
    n_tokens = generated.sum().clamp(min=1.0)  # counted before the correction masks: masking shrinks the loss

    behav_weight, weight, mask = corrected_weights(prox_logprobs, behav_logprobs, loss_mask, cfg)
    ratio = torch.exp(logprobs - prox_logprobs.detach())
    high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - cfg.eps_clip, 1 + high) * advantages)
    pg_loss = -(weight * surrogate * mask).sum() / n_tokens

    kl_loss = torch.zeros((), dtype=logprobs.dtype)
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("loss.kl_coef > 0 needs ref_logprobs (log pi_ref of the same tokens)")
        kl_loss = cfg.kl_coef * (k3_kl(logprobs, ref_logprobs) * mask).sum() / n_tokens
    loss = pg_loss + kl_loss

    with torch.no_grad():
        m, g = mask > 0, generated > 0
        stats = {
            "loss/policy": pg_loss.item(),
            "loss/kl": kl_loss.item(),
            "loss/clip_frac": ((ratio - 1).abs() > cfg.eps_clip)[m].float().mean().item() if m.any() else 0.0,
            "loss/approx_kl": ((ratio - 1) - torch.log(ratio))[m].mean().item() if m.any() else 0.0,
            "loss/behav_weight_mean": behav_weight[g].mean().item() if g.any() else 1.0,
            "loss/is_weight_mean": weight[m].mean().item() if m.any() else 1.0,
            "loss/masked_frac": 1.0 - mask.sum().item() / n_tokens.item(),
            "loss/truncated_frac": (weight < behav_weight)[g].float().mean().item() if g.any() else 0.0,
        }
    return loss, stats
