"""A non-finite loss or gradient stops SFT and RL training with TrainingDiverged before the optimiser step,
so the weights keep their last finite values (a NaN step would otherwise poison every later one silently)."""

from __future__ import annotations

import copy

import pytest
import torch

from asearch.errors import TrainingDiverged
from asearch.rl.optim import OptimConfig
from asearch.rl.sft import SFTConfig, sft
from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig

torch.set_num_threads(1)


def _samples(vocab: int, advantage: float) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (9, 12):
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        out.append(Sample(ids, [0] * 4 + [1] * (n - 4), [0.0] * n, [0] * n, advantage=advantage))
    return out


def _poisoned(model):
    """A copy whose final norm weight holds one NaN: every logit, loss and gradient downstream is NaN."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.model.norm.weight[0] = float("nan")
    return m


def _unchanged(before: dict, model) -> bool:
    return all(torch.allclose(before[k], v, rtol=0, atol=0, equal_nan=True) for k, v in model.state_dict().items())


def test_sft_raises_at_the_first_non_finite_step_and_leaves_the_weights(tiny_policy):
    tok, model = tiny_policy
    m = _poisoned(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(TrainingDiverged, match=r"sft step 0: loss nan.*Lower sft\.optim\.lr"):
        sft(m, _samples(len(tok), 0.0), SFTConfig(steps=3, batch_size=2, optim=OptimConfig(lr=1e-2)))
    assert _unchanged(before, m)


def test_sft_on_finite_data_does_not_raise(tiny_policy):
    tok, model = tiny_policy
    losses = sft(copy.deepcopy(model), _samples(len(tok), 0.0), SFTConfig(steps=2, batch_size=2))
    assert all(torch.isfinite(torch.tensor(losses)))


def test_rl_trainer_raises_on_a_non_finite_gradient_and_leaves_the_weights(tiny_policy):
    tok, model = tiny_policy
    m = _poisoned(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    trainer = PolicyTrainer(m, TrainerConfig(optim=OptimConfig(lr=1e-3)))
    with pytest.raises(TrainingDiverged, match=r"trainer step 0: gradient norm nan.*trainer\.optim\.lr"):
        trainer.train_step(_samples(len(tok), 1.0), policy_version=0)
    assert _unchanged(before, m)
