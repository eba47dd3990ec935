"""The learning-rate schedule RL and SFT share: linear warmup, then constant or a cosine to lr * min_lr_ratio."""

from __future__ import annotations

import math

import pytest

from asearch.rl.optim import OptimConfig, lr_factor


def test_warmup_then_cosine_down_to_the_floor():
    cfg = OptimConfig(warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(cfg, s, 24) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(cfg, 4, 24) == pytest.approx(1.0)
    assert lr_factor(cfg, 14, 24) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: the cosine's midpoint
    assert lr_factor(cfg, 24, 24) == pytest.approx(0.1) and lr_factor(cfg, 99, 24) == pytest.approx(0.1)
    steps = [lr_factor(cfg, s, 24) for s in range(4, 25)]
    assert all(a >= b for a, b in zip(steps, steps[1:], strict=False))


def test_constant_ignores_the_horizon_and_progress_only_moves_the_cosine_ahead():
    assert lr_factor(OptimConfig(), 500, 10, progress=0.9) == 1.0
    cfg = OptimConfig(schedule="cosine", min_lr_ratio=0.0)
    assert lr_factor(cfg, 1, 100, progress=0.5) == pytest.approx(0.5)  # a time budget half spent
    assert lr_factor(cfg, 60, 100, progress=0.5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.6)))
