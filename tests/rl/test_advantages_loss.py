"""Advantages and the decoupled PPO loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asearch.rl.advantages import AdvantageConfig, group_advantages, is_degenerate, shape_rewards
from asearch.rl.loss import LossConfig, decoupled_ppo_loss


def test_grpo_group_normalisation_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(r, AdvantageConfig(eps=0.0 + 1e-12))
    # group 1: mean 0.5, population std 0.5 -> (+1, -1, -1, +1); group 2: all equal -> 0
    assert adv[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([0.0] * 4, abs=1e-6)
    assert is_degenerate(r).tolist() == [False, True]


def test_rloo_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0]])
    adv = group_advantages(r, AdvantageConfig(estimator="rloo"))
    # sample 0: 1 - mean(0, 0) = 1; sample 1: 0 - mean(1, 0) = -0.5
    assert adv[0].tolist() == pytest.approx([1.0, -0.5, -0.5])


def test_reward_shaping_bias_scale_clip():
    cfg = AdvantageConfig(reward_bias=-0.5, reward_scale=10.0, reward_clip=3.0)
    assert shape_rewards(torch.tensor([1.0, 0.5, 0.0, 0.6]), cfg).tolist() == pytest.approx([3.0, 0.0, -3.0, 1.0])


def test_decoupled_loss_by_hand():
    # three generated tokens and one prompt token (masked)
    behav = torch.log(torch.tensor([0.5, 0.5, 0.1, 0.9]))
    prox = torch.log(torch.tensor([0.5, 0.6, 0.6, 0.9]))
    cur = torch.log(torch.tensor([0.8, 0.6, 0.6, 0.9])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, 5.0])
    mask = torch.tensor([1, 1, 1, 0])
    loss, stats = decoupled_ppo_loss(cur, prox, behav, adv, mask, LossConfig(eps_clip=0.2, behav_weight_cap=5.0))
    # token 0: w = 1, u = 1.6 -> min(1.6, 1.2) * 1 = 1.2
    # token 1: w = 1.2, u = 1 -> -1 -> weighted -1.2
    # token 2: w = 6 > cap -> masked; token 3: prompt -> masked. Denominator: 3 generated tokens.
    assert loss.item() == pytest.approx(-(1.2 - 1.2) / 3, abs=1e-6)
    assert stats["loss/masked_frac"] == pytest.approx(1 / 3)
    loss.backward()
    # token 0 is clipped (no gradient); token 1's gradient: d/dlogp of -(w * u * A)/3 = -(1.2 * 1 * -1)/3
    assert cur.grad.tolist() == pytest.approx([0.0, 0.4, 0.0, 0.0], abs=1e-6)


def test_on_policy_loss_is_reinforce():
    # prox = behav = current: ratio 1, weight 1 -> loss = -mean(A), gradient -A/N per token
    lp = torch.log(torch.tensor([0.3, 0.7])).requires_grad_()
    adv = torch.tensor([2.0, -1.0])
    loss, _ = decoupled_ppo_loss(lp, lp.detach(), lp.detach(), adv, torch.ones(2), LossConfig())
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1.0, 0.5])


def test_kl_penalty_k3():
    lp = torch.log(torch.tensor([0.5])).requires_grad_()
    ref = torch.log(torch.tensor([0.25]))
    loss, stats = decoupled_ppo_loss(lp, lp.detach(), lp.detach(), torch.zeros(1), torch.ones(1), LossConfig(kl_coef=0.1), ref_logprobs=ref)
    k3 = 0.5 - 1 - math.log(0.5)  # r = ref/pi = 0.5: r - 1 - log r
    assert stats["loss/kl"] == pytest.approx(0.1 * k3, rel=1e-5)
