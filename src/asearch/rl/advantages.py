"""Advantages from group rewards: reward shaping, then GRPO (group-normalised) or RLOO (leave-one-out).

Each group is the n samples of one question; the advantage of a sample is broadcast to all its tokens
(no critic: GAE with gamma = lambda = 1 reduces to the sequence reward). A new estimator is one
function `(shaped rewards (G, n), cfg) -> advantages (G, n)` under `@register_estimator("name")`, in this
file or a new module of `asearch.rl` (found on the first lookup).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
from pydantic import AfterValidator

from asearch.config import Config
from asearch.registry import Registry

Estimator = Callable[[torch.Tensor, "AdvantageConfig"], torch.Tensor]
ESTIMATORS: Registry[Estimator] = Registry(
    "advantage estimator", "asearch.rl", wants=lambda source: "@register_estimator(" in source
)


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Make the decorated function the estimator `advantages.estimator=<name>` picks."""
    return ESTIMATORS.decorator(name)


class AdvantageConfig(Config):
    estimator: Annotated[str, AfterValidator(ESTIMATORS.check)] = "grpo"  # any registered estimator
    reward_bias: float = 0.0  # r' = (r + bias) * scale, then clipped to [-clip, clip]
    reward_scale: float = 1.0
    reward_clip: float = 20.0
    std_normalize: bool = True  # grpo: divide by the group std (Dr.GRPO argues for False)
    eps: float = 1e-6


def shape_rewards(rewards: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    return ((rewards + cfg.reward_bias) * cfg.reward_scale).clamp(-cfg.reward_clip, cfg.reward_clip)


@register_estimator("grpo")
def grpo_advantages(r: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps), the std term only with `std_normalize`."""
    adv = r - r.mean(dim=1, keepdim=True)
    if cfg.std_normalize:
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=False) + cfg.eps)
    return adv


@register_estimator("rloo")
def rloo_advantages(r: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = r_i - mean_{j != i}(r_j): the baseline is the mean of the other n-1 samples."""
    n = r.shape[1]
    assert n > 1, f"rloo needs at least 2 samples per group, got {n}"
    baseline = (r.sum(dim=1, keepdim=True) - r) / (n - 1)
    return r - baseline


def group_advantages(rewards: torch.Tensor, cfg: AdvantageConfig) -> torch.Tensor:
    """rewards: (G, n) for G groups of n samples -> advantages (G, n)."""
    return ESTIMATORS.get(cfg.estimator)(shape_rewards(rewards, cfg), cfg)


def is_degenerate(rewards: torch.Tensor) -> torch.Tensor:
    """(G, n) -> (G,) True where every sample got the same reward: no learning signal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values).abs() < 1e-9
