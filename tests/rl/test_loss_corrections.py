"""The off-policy corrections (`loss.correction`) against hand-computed losses and gradients, the default kept
bit for bit, and the staleness lab's token counts (`asearch.rl.trainer`) against the bins' definitions."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from asearch.metrics.offpolicy import RATIO_LABELS, VERSIONS_BEHIND_LABELS, ratio_bin, versions_behind_bin
from asearch.rl.loss import LossConfig, decoupled_ppo_loss
from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig, sequence_logprobs, staleness_lab_counts

torch.set_num_threads(1)

# Three sequences (rows), position 0 a prompt token; row 2 is one token shorter (padding). Behaviour
# probability 0.1 everywhere, so w = pi_prox / pi_behav is set by pi_prox = 0.1 w.
W = [[1.0, 3.0, 0.25], [1.5, 8.0, 1.0], [1.5, 1.5]]
ADV = [1.0, -1.0, 1.0]  # one advantage per sequence
N_GENERATED = 8


def _batch():
    """(log pi_theta with grad, log pi_prox, log pi_behav, advantages, loss mask), each (3, 4), float64.
    pi_theta = pi_prox, so u = 1 and the surrogate is A: the loss is -sum(keep * c * A) / 8."""
    prox = torch.zeros(3, 4, dtype=torch.float64)
    behav = torch.zeros(3, 4, dtype=torch.float64)
    mask = torch.zeros(3, 4, dtype=torch.float64)
    for r, ws in enumerate(W):
        for t, w in enumerate(ws, start=1):
            prox[r, t], behav[r, t], mask[r, t] = math.log(0.1 * w), math.log(0.1), 1.0
    adv = torch.tensor(ADV, dtype=torch.float64)[:, None].expand(-1, 4)
    return prox.clone().requires_grad_(), prox, behav, adv, mask


def _expected_grad(c: list[list[float]], keep: list[list[int]]) -> torch.Tensor:
    """d loss / d log pi_theta at u = 1: -keep * c * A / N per generated token, 0 elsewhere."""
    g = torch.zeros(3, 4, dtype=torch.float64)
    for r, ws in enumerate(W):
        for t in range(len(ws)):
            g[r, t + 1] = -keep[r][t] * c[r][t] * ADV[r] / N_GENERATED
    return g


CASES = {
    # name: (config, weight c per token, keep per token, the sum of keep * c * A worked out by hand)
    "decoupled: w = 8 is over the cap of 5": (
        LossConfig(correction="decoupled", behav_weight_cap=5.0),
        W, [[1, 1, 1], [1, 0, 1], [1, 1]], (1 + 3 + 0.25) - (1.5 + 1.0) + (1.5 + 1.5),  # 4.75
    ),
    "tis: 3 and 8 are cut to 2, nothing masked": (
        LossConfig(correction="tis", tis_cap=2.0),
        [[1.0, 2.0, 0.25], [1.5, 2.0, 1.0], [1.5, 1.5]], [[1, 1, 1], [1, 1, 1], [1, 1]], 3.25 - 4.5 + 3.0,  # 1.75
    ),
    "token_mask: 0.25 and 8 are outside [0.5, 5]": (
        LossConfig(correction="token_mask", mask_low=0.5, mask_high=5.0),
        W, [[1, 1, 0], [1, 0, 1], [1, 1]], (1 + 3) - (1.5 + 1.0) + 3.0,  # 4.5
    ),
    # geometric means: row 0 (0.75)^(1/3) = 0.909, row 1 12^(1/3) = 2.29 (out), row 2 1.5
    "seq_mask geometric: row 1 leaves [0.5, 2] and goes whole": (
        LossConfig(correction="seq_mask", seq_ratio="geometric", seq_mask_low=0.5, seq_mask_high=2.0),
        W, [[1, 1, 1], [0, 0, 0], [1, 1]], 4.25 + 3.0,  # 7.25
    ),
    # products: row 0 0.75, row 1 12 (out), row 2 2.25 (out: its geometric mean 1.5 was in)
    "seq_mask product: rows 1 and 2 leave [0.5, 2]": (
        LossConfig(correction="seq_mask", seq_ratio="product", seq_mask_low=0.5, seq_mask_high=2.0),
        W, [[1, 1, 1], [0, 0, 0], [0, 0]], 4.25,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_correction_by_hand(case):
    cfg, c, keep, kept_sum = CASES[case]
    cur, prox, behav, adv, mask = _batch()
    loss, stats = decoupled_ppo_loss(cur, prox, behav, adv, mask, cfg)
    assert loss.item() == pytest.approx(-kept_sum / N_GENERATED, abs=1e-12)
    n_masked = sum(k == 0 for row in keep for k in row)
    assert stats["loss/masked_frac"] == pytest.approx(n_masked / N_GENERATED)
    kept_c = [x for cr, kr in zip(c, keep, strict=True) for x, k in zip(cr, kr, strict=True) if k]
    assert stats["loss/is_weight_mean"] == pytest.approx(sum(kept_c) / len(kept_c))
    assert stats["loss/behav_weight_mean"] == pytest.approx(sum(sum(row) for row in W) / N_GENERATED)
    loss.backward()
    torch.testing.assert_close(cur.grad, _expected_grad(c, keep), atol=1e-12, rtol=0)
    # the sign: a kept token of a positive advantage is pushed up (negative gradient of the loss), a kept
    # token of a negative advantage down, a masked one not at all
    for r, t in ((0, 1), (1, 1)):
        if keep[r][t - 1]:
            assert math.copysign(1.0, -cur.grad[r, t].item()) == ADV[r]
    assert cur.grad[mask == 0].abs().sum() == 0


def test_tis_reports_the_tokens_it_truncated():
    cur, prox, behav, adv, mask = _batch()
    _, stats = decoupled_ppo_loss(cur, prox, behav, adv, mask, LossConfig(correction="tis", tis_cap=2.0))
    assert stats["loss/truncated_frac"] == pytest.approx(2 / N_GENERATED)  # w = 3 and w = 8
    _, stats = decoupled_ppo_loss(cur, prox, behav, adv, mask, LossConfig())
    assert stats["loss/truncated_frac"] == 0.0


def test_the_default_is_todays_decoupled_loss_bit_for_bit():
    """The loss before the corrections existed, written out: same value and gradient to the last bit."""
    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 9, generator=g) - 2).requires_grad_()
    prox = logp.detach() + 0.3 * torch.randn(4, 9, generator=g)
    behav = prox + 2 * torch.randn(4, 9, generator=g)  # w spans about e^-5 .. e^5: some over the cap of 5
    adv = torch.randn(4, 1, generator=g).expand(-1, 9)
    mask = (torch.rand(4, 9, generator=g) > 0.3).float()
    cfg = LossConfig()

    m = mask.clone()
    n_tokens = m.sum().clamp(min=1.0)
    w = torch.exp(prox - behav).detach()
    m = m * (~((w > cfg.behav_weight_cap) & (m > 0))).float()
    ratio = torch.exp(logp - prox.detach())
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip) * adv)
    before = -(w * surrogate * m).sum() / n_tokens
    (grad_before,) = torch.autograd.grad(before, logp)

    loss, stats = decoupled_ppo_loss(logp, prox, behav, adv, mask, cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(loss, before) and torch.equal(grad, grad_before)
    assert 0 < stats["loss/masked_frac"] < 1


def test_bands_must_be_ordered_and_corrections_known():
    with pytest.raises(ValueError, match="mask_low must be below mask_high"):
        LossConfig(correction="token_mask", mask_low=2.0, mask_high=1.0)
    with pytest.raises(ValueError, match="seq_mask_low must be below seq_mask_high"):
        LossConfig(seq_mask_low=3.0)
    with pytest.raises(ValueError, match=r"unknown loss correction 'ppo' \(registered: decoupled, seq_mask, tis, token_mask\)"):
        LossConfig(correction="ppo")
    with pytest.raises(ValueError, match="did you mean 'tis'"):
        LossConfig(correction="tiss")


# ---------------------------------------------------------------------------- the staleness lab


def test_lab_counts_match_the_bins_token_by_token():
    g = torch.Generator().manual_seed(1)
    prox = torch.randn(5, 12, generator=g) - 2
    behav = prox + 1.5 * torch.randn(5, 12, generator=g)
    mask = (torch.rand(5, 12, generator=g) > 0.25).float()
    versions = torch.randint(0, 9, (5, 12), generator=g).float()
    cfg = LossConfig(correction="token_mask")
    counts = staleness_lab_counts(prox, behav, mask, versions, 8, cfg).tolist()

    nb, nr = len(VERSIONS_BEHIND_LABELS), len(RATIO_LABELS)
    want = [0.0] * (2 * nb + nr)
    for r in range(5):
        for t in range(12):
            if mask[r, t]:
                w = math.exp(prox[r, t].item() - behav[r, t].item())
                b = versions_behind_bin(8 - int(versions[r, t]))
                want[b] += 1
                want[nb + b] += not (cfg.mask_low <= w <= cfg.mask_high)
                want[2 * nb + ratio_bin(w)] += 1
    assert counts == want and sum(counts[:nb]) == mask.sum().item()


@pytest.fixture(scope="module")
def stale_samples(tiny_policy):
    """Six on-policy sequences sampled 0..5 versions before version 5; sequence 3's behaviour log-probs are
    2 nats below the policy's (w = e^2 = 7.4 on each of its tokens), as if a much older policy sampled it."""
    tok, model = tiny_policy
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(6):
        n = 10 + 2 * i
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        with torch.no_grad():
            lp = sequence_logprobs(model, [Sample(ids, mask, [0.0] * n, [0] * n, 0.0)], temperature=1.0)[0]
        shift = 2.0 if i == 3 else 0.0
        behav = [v - shift if m else 0.0 for v, m in zip(lp.tolist(), mask, strict=True)]
        samples.append(Sample(ids, mask, behav, [-1] * 4 + [5 - i] * (n - 4), advantage=1.0 if i % 2 else -1.0))
    return model, samples


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_train_step_reports_the_lab_histograms(stale_samples, epochs):
    model, samples = stale_samples
    cfg = TrainerConfig(loss=LossConfig(correction="seq_mask"), epochs=epochs, n_minibatches=2, token_budget=64)
    stats = PolicyTrainer(copy.deepcopy(model), cfg).train_step(samples, policy_version=5)
    n = [s.n_generated for s in samples]  # sample i is i versions behind, so bin "4+" holds samples 4 and 5
    behind = [stats[f"staleness/versions_behind_hist/{b}"] for b in VERSIONS_BEHIND_LABELS]
    assert behind == [n[0], n[1], n[2], n[3], n[4] + n[5]]  # each token once, whatever the epochs
    # only sequence 3 is off (geometric mean e^2 > 2): masked whole, and it is the 3-versions-behind bin
    assert stats["is/masked_frac"] == pytest.approx(n[3] / sum(n))
    assert stats["staleness/masked_frac/3"] == 1.0 and stats["staleness/masked_frac/0"] == 0.0
    assert stats["is/ratio_hist/5-10"] == n[3] and stats["is/ratio_hist/0.8-1.25"] == sum(n) - n[3]
