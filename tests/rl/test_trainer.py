"""The policy trainer on a real tiny Qwen2: micro-batching is exact, updates move the policy the right way."""

from __future__ import annotations

import copy

import pytest
import torch

from asearch.rl.loss import LossConfig, k3_kl
from asearch.rl.trainer import (
    OptimConfig,
    PolicyTrainer,
    Sample,
    TrainerConfig,
    micro_batches,
    sequence_logprobs,
    weigh_episodes_equally,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_and_samples(tiny_policy):
    tok, model = tiny_policy
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        n = 8 + 3 * i
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        samples.append(Sample(ids, mask, [0.0] * n, [0] * n, advantage=1.0 if i % 2 else -1.0))
    with torch.no_grad():  # behaviour log-probs = the current policy's (on-policy)
        for s in samples:
            lp = sequence_logprobs(model, [s], temperature=1.0)[0]
            s.behav_logprobs = [v if m else 0.0 for v, m in zip(lp.tolist(), s.loss_mask, strict=True)]
    return model, samples


def _grads(model, samples, budget):
    m = copy.deepcopy(model)
    t = PolicyTrainer(m, TrainerConfig(token_budget=budget, optim=OptimConfig(lr=1e-12)))
    t.train_step(samples, policy_version=0)  # gradients stay in .grad after the (negligible) step
    return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


def test_micro_batching_does_not_change_the_gradient(model_and_samples):
    model, samples = model_and_samples
    assert len(micro_batches(samples, 64)) >= 3
    one = _grads(model, samples, budget=10_000)
    many = _grads(model, samples, budget=64)
    assert torch.allclose(one, many, atol=1e-6, rtol=1e-4)


def test_episode_aggregation_is_the_token_loss_on_rescaled_advantages(model_and_samples):
    """`loss.aggregation: episode` in the trainer is the token loss on `weigh_episodes_equally`'s samples."""
    model, samples = model_and_samples
    episodes = [copy.copy(s) for s in samples]
    for k, s in enumerate(episodes):
        s.episode = k // 2  # episodes of two segments each
    m = copy.deepcopy(model)
    t = PolicyTrainer(m, TrainerConfig(optim=OptimConfig(lr=1e-12), loss=LossConfig(aggregation="episode")))
    t.train_step(episodes, policy_version=0)
    by_episode = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    assert torch.allclose(by_episode, _grads(model, weigh_episodes_equally(episodes), budget=16384), atol=1e-7)
    assert not torch.allclose(by_episode, _grads(model, episodes, budget=16384), atol=1e-7)


def test_generated_only_logprobs_and_gradients_equal_the_full_head(model_and_samples):
    """The LM head on the loss-mask positions alone gives the same log-probs there (0 elsewhere) and the same
    gradient as the head over every position."""
    model, samples = model_and_samples
    m = copy.deepcopy(model)
    mask = torch.zeros(len(samples), max(len(s.token_ids) for s in samples))
    for r, s in enumerate(samples):
        mask[r, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    grads, logprobs = [], []
    for generated_only in (False, True):
        m.zero_grad()
        lp = sequence_logprobs(m, samples, 0.7, generated_only=generated_only)
        (lp * mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        logprobs.append(lp.detach())
    assert torch.allclose(logprobs[1], logprobs[0] * mask, atol=1e-5) and (logprobs[1][mask == 0] == 0).all()
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4) and grads[1].abs().sum() > 0


def test_update_raises_logprob_of_positive_advantage_tokens(model_and_samples):
    model, samples = model_and_samples
    m = copy.deepcopy(model)
    trainer = PolicyTrainer(m, TrainerConfig(optim=OptimConfig(lr=3e-3)))

    def total(sign):
        with torch.no_grad():
            out = 0.0
            for s in samples:
                if (s.advantage > 0) == (sign > 0):
                    lp = sequence_logprobs(m, [s], 1.0)[0]
                    out += sum(v for v, k in zip(lp.tolist(), s.loss_mask, strict=True) if k)
            return out

    pos0, neg0 = total(+1), total(-1)
    for _ in range(5):
        stats = trainer.train_step(samples, policy_version=0)
    assert total(+1) > pos0 and total(-1) < neg0
    assert stats["loss/masked_frac"] == 0.0 and stats["perf/grad_norm"] > 0


def test_loglinear_prox_equals_recompute_on_policy(model_and_samples):
    model, samples = model_and_samples
    a = copy.deepcopy(model)
    b = copy.deepcopy(model)
    sa = PolicyTrainer(a, TrainerConfig(prox="recompute")).train_step(samples, policy_version=0)
    sb = PolicyTrainer(b, TrainerConfig(prox="loglinear")).train_step(samples, policy_version=0)
    assert sa["loss/policy"] == pytest.approx(sb["loss/policy"], abs=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_state_dict_round_trip(model_and_samples):
    model, samples = model_and_samples
    t1 = PolicyTrainer(copy.deepcopy(model), TrainerConfig(optim=OptimConfig(schedule="cosine", warmup_steps=2)), total_steps=10)
    t1.train_step(samples, policy_version=0)
    t2 = PolicyTrainer(copy.deepcopy(model), TrainerConfig(optim=OptimConfig(schedule="cosine", warmup_steps=2)), total_steps=10)
    t2.load_state_dict(copy.deepcopy(t1.state_dict()))
    s1 = t1.train_step(samples, policy_version=1)
    s2 = t2.train_step(samples, policy_version=1)
    assert s1["perf/lr"] == s2["perf/lr"] and s1["loss/policy"] == pytest.approx(s2["loss/policy"])


def test_cosine_schedule_follows_the_runs_progress_when_it_is_further_along(model_and_samples):
    """A time-budgeted run does not know its step count: `progress` (its share of the budget) drives the
    cosine when it is ahead of steps/total_steps."""
    model, samples = model_and_samples
    optim = OptimConfig(lr=1e-3, schedule="cosine", min_lr_ratio=0.1)
    trainer = PolicyTrainer(copy.deepcopy(model), TrainerConfig(optim=optim), total_steps=1000)
    lr_after = lambda progress: trainer.train_step(samples, policy_version=0, progress=progress)["perf/lr"]  # noqa: E731
    assert lr_after(None) == pytest.approx(1e-3, rel=1e-4)  # 1 of 1000 steps: still the peak
    assert lr_after(0.5) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5), rel=1e-6)
    assert lr_after(1.0) == pytest.approx(1e-4, rel=1e-6)
    assert lr_after(0.0) == pytest.approx(1e-3, rel=1e-4)  # behind the step count (4 of 1000): steps rule


def test_epochs_train_a_batch_again_against_the_policy_at_the_steps_start(model_and_samples):
    """epochs=2: two optimizer steps per batch; the second pass's ratio pi_theta / pi_prox is off 1 (pi_prox stays
    the policy before the step, not recomputed per pass), and the policy moves further than after one pass.
    The log-linear proximal approximation agrees on the first pass and is used on the second."""
    model, samples = model_and_samples

    def run(epochs, prox="recompute"):
        m = copy.deepcopy(model)
        t = PolicyTrainer(m, TrainerConfig(epochs=epochs, prox=prox, optim=OptimConfig(lr=3e-3)))
        stats = t.train_step(samples, policy_version=0)
        return m, t, stats

    m1, t1, s1 = run(1)
    m2, t2, s2 = run(2)
    assert (t1.step, t2.step) == (1, 2)
    assert s1["loss/approx_kl"] == pytest.approx(0.0, abs=1e-9) and s2["loss/approx_kl"] > 1e-6

    def moved(m):
        return sum((a - b).abs().sum().item() for a, b in zip(m.parameters(), model.parameters(), strict=True))

    assert moved(m2) > 1.5 * moved(m1)
    m3, t3, s3 = run(2, prox="loglinear")
    assert t3.step == 2 and s3["loss/approx_kl"] > 1e-6


def _kl_to(reference, model, samples) -> float:
    """Mean k3 estimate of KL(policy || reference) over the generated tokens."""
    with torch.no_grad():
        lp, ref = sequence_logprobs(model, samples, 1.0), sequence_logprobs(reference, samples, 1.0)
    mask = torch.zeros_like(lp)
    for r, s in enumerate(samples):
        mask[r, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return float((k3_kl(lp, ref) * mask).sum() / mask.sum())


@pytest.mark.parametrize("lora_r", [0, 4])
def test_kl_penalty_holds_the_policy_near_the_model_it_started_from(model_and_samples, lora_r):
    """`loss.kl_coef`: 0 at the first step (the policy is the reference), then it pulls back: after the same
    updates the policy is far closer to where it started than without it. With LoRA the reference is the base
    model with the adapters off; a trainer resumed from a checkpoint keeps the starting model as reference."""
    from asearch.models.lora import LoraConfig

    model, samples = model_and_samples

    def trainer(kl_coef: float) -> PolicyTrainer:
        loss = LossConfig(kl_coef=kl_coef)
        cfg = TrainerConfig(optim=OptimConfig(lr=1e-2), lora=LoraConfig(r=lora_r, alpha=8), loss=loss)
        return PolicyTrainer(copy.deepcopy(model), cfg)

    free, held = trainer(0.0), trainer(50.0)
    free_stats = [free.train_step(samples, policy_version=v) for v in range(6)]
    held_stats = [held.train_step(samples, policy_version=v) for v in range(6)]
    assert held_stats[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7) and held_stats[-1]["loss/kl"] > 1e-4
    assert all(s["loss/kl"] == 0.0 for s in free_stats)
    drift_free, drift_held = _kl_to(model, free.model, samples), _kl_to(model, held.model, samples)
    assert 0 < drift_held < 0.25 * drift_free, (drift_held, drift_free)
    if lora_r:
        assert held.reference is None
        with held.model.disable_adapter():  # the adapters off give the untouched starting weights
            assert _kl_to(model, held.model, samples) == pytest.approx(0.0, abs=1e-7)

    resumed = trainer(50.0)
    resumed.load_state_dict(copy.deepcopy(held.state_dict()))
    a, b = held.train_step(samples, policy_version=6), resumed.train_step(samples, policy_version=6)
    assert b["loss/kl"] == pytest.approx(a["loss/kl"], rel=1e-4) and a["loss/kl"] > 1e-4
