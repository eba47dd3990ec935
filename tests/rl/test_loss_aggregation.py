"""`loss.aggregation`: token weighting (every generated token the same) against episode weighting (every
episode the same), checked against losses worked out by hand."""

from __future__ import annotations

import pytest
import torch

from asearch.rl.loss import LossConfig, decoupled_ppo_loss, episode_weights
from asearch.rl.trainer import Sample, weigh_episodes_equally

torch.set_num_threads(1)


def test_episode_weights_make_the_token_mean_a_mean_over_episodes():
    # 2 and 6 tokens: N = 8, E = 2, a = 8 / (2 * 2) = 2 and 8 / (2 * 6) = 2/3; an episode with none gets 0
    assert episode_weights([2, 6]) == pytest.approx([2.0, 2 / 3])
    assert episode_weights([0, 4]) == pytest.approx([0.0, 1.0])
    assert episode_weights([5, 5, 5]) == pytest.approx([1.0, 1.0, 1.0])  # equal lengths: token weighting as is


def _sample(n_generated: int, advantage: float, episode: int | None) -> Sample:
    return Sample([1] * (n_generated + 1), [0] + [1] * n_generated, [0.0] * (n_generated + 1),
                  [-1] + [0] * n_generated, advantage, episode)  # fmt: skip


def test_an_episode_split_in_segments_weighs_as_one_episode():
    # episode 0: two segments of 1 and 3 tokens (4 in all), advantage +1; episode 1: 12 tokens, advantage -1
    samples = [_sample(1, 1.0, 0), _sample(3, 1.0, 0), _sample(12, -1.0, 1)]
    # N = 16, E = 2: a_0 = 16 / (2 * 4) = 2, a_1 = 16 / (2 * 12) = 2/3
    assert [s.advantage for s in weigh_episodes_equally(samples)] == pytest.approx([2.0, 2.0, -2 / 3])
    # with no episode numbers each sample is its own episode: 1, 3 and 12 tokens, N = 16, E = 3
    alone = weigh_episodes_equally([_sample(1, 1.0, None), _sample(3, 1.0, None), _sample(12, -1.0, None)])
    assert [s.advantage for s in alone] == pytest.approx([16 / 3, 16 / 9, -16 / 36])


def _loss(samples: list[Sample]) -> float:
    """The policy loss at pi_theta = pi_prox = pi_behav (u = w = 1): -sum_t A_t / N over generated tokens."""
    longest = max(len(s.token_ids) for s in samples)
    mask = torch.tensor([s.loss_mask + [0] * (longest - len(s.loss_mask)) for s in samples], dtype=torch.float64)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float64)[:, None].expand(-1, longest)
    zeros = torch.zeros_like(mask)
    loss, _ = decoupled_ppo_loss(zeros.clone().requires_grad_(), zeros, zeros, adv, mask, LossConfig())
    return loss.item()


def test_the_loss_under_each_aggregation():
    # a short success (2 tokens, A = +1) and a long failure (6 tokens, A = -1), as in a group of two
    samples = [_sample(2, 1.0, 0), _sample(6, -1.0, 1)]
    # token: -(2 * 1 - 6 * 1) / 8 = +0.5, the failure's tokens outweigh the success's
    assert _loss(samples) == pytest.approx(0.5)
    # episode: -(1/2) * (mean of +1 over 2 tokens + mean of -1 over 6 tokens) = 0: they cancel
    assert _loss(weigh_episodes_equally(samples)) == pytest.approx(0.0)
