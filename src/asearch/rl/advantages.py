"""Advantages from group rewards: reward shaping, then GRPO (group-normalised) or RLOO (leave-one-out).

Each group is the n samples of one question; the advantage of a sample is broadcast to all its tokens
(no critic: GAE with gamma = lambda = 1 reduces to the sequence reward).
"""

from __future__ import annotations

from typing import Literal

import torch

from asearch.config import Config


class AdvantageConfig(Config):
    estimator: Literal["grpo", "rloo"] = "grpo"
    reward_bias: float = 0.0  # r' = (r + bias) * scale, then clipped to [-clip, clip]
    reward_scale: float = 1.0
    reward_clip: float = 20.0
    std_normalize: bool = True  # grpo: divide by the group std (Dr.GRPO argues for False)
    eps: float = 1e-6


def shape_rewards(rewards: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    return ((rewards + cfg.reward_bias) * cfg.reward_scale).clamp(-cfg.reward_clip, cfg.reward_clip)


def group_advantages(rewards: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """rewards: (G, n) for G groups of n samples -> advantages (G, n)."""
    G, n = rewards.shape
    r = shape_rewards(rewards, cfg)
    if cfg.estimator == "grpo":
        adv = r - r.mean(dim=1, keepdim=True)
        if cfg.std_normalize:
            adv = adv / (r.std(dim=1, keepdim=True, unbiased=False) + cfg.eps)
        return adv
    assert n > 1, f"rloo needs at least 2 samples per group, got {n}"
    baseline = (r.sum(dim=1, keepdim=True) - r) / (n - 1)  # mean of the other n-1 samples
    return r - baseline


def is_degenerate(rewards: torch.Tensor) -> torch.Tensor:
    """(G, n) -> (G,) True where every sample got the same reward: no learning signal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values).abs() < 1e-9
