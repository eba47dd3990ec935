"""Decoupled PPO: the clipped surrogate against a proximal policy, importance-weighted by behaviour.

    J = mean_t  w_t * min(u_t * A_t, clip(u_t, 1 - eps, 1 + eps) * A_t)
        u_t = pi_theta / pi_prox     (the trust region is around the proximal policy)
        w_t = pi_prox / pi_behav     (corrects for tokens sampled by an older policy; no gradient)
Tokens whose behaviour weight w_t exceeds a cap are masked: they are too off-policy to trust.
"""

from __future__ import annotations

import torch

from asearch.config import Config


class LossConfig(Config):
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # asymmetric upper clip (DAPO "clip higher"); None = eps_clip
    behav_weight_cap: float | None = 5.0  # mask tokens with pi_prox / pi_behav above this; None = off
    kl_coef: float = 0.0  # penalty against a reference policy (k3 estimator); 0 = no reference needed


def decoupled_ppo_loss(
    logprobs: torch.Tensor,  # log pi_theta, with grad
    prox_logprobs: torch.Tensor,  # log pi_prox, recomputed once per step before the minibatch loop
    behav_logprobs: torch.Tensor,  # log pi_behav, from the engine at sampling time
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,  # 1 on generated tokens
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = loss_mask.float()
    n_tokens = mask.sum().clamp(min=1.0)  # counted before the behaviour cap so masking shrinks the loss

    behav_weight = torch.exp(prox_logprobs - behav_logprobs).detach()
    if cfg.behav_weight_cap is not None:
        over_cap = (behav_weight > cfg.behav_weight_cap) & (mask > 0)
        mask = mask * (~over_cap).float()
    ratio = torch.exp(logprobs - prox_logprobs.detach())
    high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - cfg.eps_clip, 1 + high) * advantages)
    pg_loss = -(behav_weight * surrogate * mask).sum() / n_tokens

    kl_loss = torch.zeros((), dtype=logprobs.dtype)
    if cfg.kl_coef > 0:
        assert ref_logprobs is not None, "kl_coef > 0 needs ref_logprobs"
        log_r = ref_logprobs - logprobs
        kl_loss = cfg.kl_coef * ((torch.exp(log_r) - 1 - log_r) * mask).sum() / n_tokens
    loss = pg_loss + kl_loss

    with torch.no_grad():
        m = mask > 0
        stats = {
            "loss/policy": pg_loss.item(),
            "loss/kl": kl_loss.item(),
            "loss/clip_frac": ((ratio - 1).abs() > cfg.eps_clip)[m].float().mean().item() if m.any() else 0.0,
            "loss/approx_kl": ((ratio - 1) - torch.log(ratio))[m].mean().item() if m.any() else 0.0,
            "loss/behav_weight_mean": behav_weight[loss_mask > 0].mean().item() if (loss_mask > 0).any() else 1.0,
            "loss/behav_capped_frac": 1.0 - mask.sum().item() / n_tokens.item(),
        }
    return loss, stats
