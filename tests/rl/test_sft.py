"""The supervised warm start: the loss is the token-mean NLL over exactly the tokens it claims."""

from __future__ import annotations

import copy

import pytest
import torch

from asearch.rl.optim import OptimConfig
from asearch.rl.sft import SFTConfig, repeated_bigrams, sft
from asearch.rl.trainer import Sample, sequence_logprobs

torch.set_num_threads(1)

# SFT's default schedule (cosine, weight decay 0.01) at a high peak lr and without warmup: fast on tiny data.
HIGH_LR = OptimConfig(lr=1e-2, weight_decay=0.01, schedule="cosine")


@pytest.fixture(scope="module")
def model_and_samples(tiny_policy):
    tok, model = tiny_policy
    g = torch.Generator().manual_seed(1)
    samples = []
    for n in (9, 14):
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        mask = [0] * 5 + [1] * 3 + [0] * (n - 8)  # context, generated, context again (a tool result)
        samples.append(Sample(ids, mask, [0.0] * n, [0] * n, advantage=0.0))
    return model, samples


@pytest.mark.parametrize("w", [0.0, 0.5])
def test_first_step_loss_is_the_weighted_token_mean_nll(model_and_samples, w):
    model, samples = model_and_samples
    with torch.no_grad():
        lps = [sequence_logprobs(model, [s], temperature=1.0)[0].tolist() for s in samples]
    # by hand: generated tokens weigh 1, read tokens w, position 0 (nothing predicts it) 0
    num = den = 0.0
    for s, lp in zip(samples, lps, strict=True):
        for t in range(1, len(s.token_ids)):
            weight = 1.0 if s.loss_mask[t] else w
            num -= weight * lp[t]
            den += weight
    losses = sft(copy.deepcopy(model), samples, SFTConfig(steps=1, batch_size=2, context_loss_weight=w))
    assert losses[0] == pytest.approx(num / den, rel=1e-5)


def test_context_loss_teaches_the_read_tokens_too(model_and_samples):
    """With weight 0 the read tokens get no gradient signal; with weight 1 their likelihood rises."""
    model, samples = model_and_samples
    ctx = [(i, t) for i, s in enumerate(samples) for t in range(1, len(s.token_ids)) if not s.loss_mask[t]]

    def ctx_nll(m):
        with torch.no_grad():
            lps = [sequence_logprobs(m, [s], temperature=1.0)[0] for s in samples]
        return -sum(lps[i][t].item() for i, t in ctx)

    before = ctx_nll(model)
    trained = {}
    for w in (0.0, 1.0):
        m = copy.deepcopy(model)
        sft(m, samples, SFTConfig(steps=30, batch_size=2, optim=HIGH_LR, context_loss_weight=w))
        trained[w] = ctx_nll(m)
    assert trained[1.0] < 0.5 * before
    assert trained[1.0] < 0.5 * trained[0.0]


def test_bf16_autocast_gives_the_same_first_loss_and_learns(model_and_samples):
    """bfloat16 autocast: the first loss within bf16 rounding of float32's; training still lowers it;
    the weights stay float32."""
    model, samples = model_and_samples
    cfg = SFTConfig(steps=1, batch_size=2)
    exact = sft(copy.deepcopy(model), samples, cfg)[0]
    m = copy.deepcopy(model)
    fast = sft(m, samples, cfg.model_copy(update={"dtype": "bfloat16"}))[0]
    assert fast == pytest.approx(exact, rel=2e-2) and fast != exact
    assert all(p.dtype == torch.float32 for p in m.parameters())
    losses = sft(copy.deepcopy(model), samples, SFTConfig(steps=30, batch_size=2, optim=HIGH_LR, dtype="bfloat16"))
    assert losses[-1] < 0.5 * losses[0]


def test_repeated_bigrams_mark_what_a_copy_could_predict():
    #                    a  b  c  a  b  d  a  b  c
    assert repeated_bigrams([1, 2, 3, 1, 2, 4, 1, 2, 3]) == [0, 0, 0, 0, 1, 0, 0, 1, 1]
    assert repeated_bigrams([]) == [] and repeated_bigrams([5]) == [0]


def test_repeated_context_loss_covers_only_read_tokens_a_copy_could_predict(model_and_samples):
    """context_tokens=repeated: the first step's loss is the token mean over the generated tokens and the read
    tokens whose bigram came before, by hand."""
    model, samples = model_and_samples
    samples = [Sample(s.token_ids + s.token_ids[2:6], s.loss_mask + [0] * 4, [0.0] * (len(s.token_ids) + 4), [0] * (len(s.token_ids) + 4), 0.0) for s in samples]
    with torch.no_grad():
        lps = [sequence_logprobs(model, [s], temperature=1.0)[0].tolist() for s in samples]
    num = den = 0.0
    for s, lp in zip(samples, lps, strict=True):
        rep = repeated_bigrams(s.token_ids)
        assert sum(r for r, m in zip(rep, s.loss_mask, strict=True) if not m) >= 3  # the appended copy
        for t in range(1, len(s.token_ids)):
            weight = 1.0 if s.loss_mask[t] else 0.5 * rep[t]
            num -= weight * lp[t]
            den += weight
    cfg = SFTConfig(steps=1, batch_size=2, context_loss_weight=0.5, context_tokens="repeated")
    assert sft(copy.deepcopy(model), samples, cfg)[0] == pytest.approx(num / den, rel=1e-5)


def test_the_optimiser_keys_that_moved_into_optim_are_named():
    with pytest.raises(ValueError, match=r"lr, warmup_steps: .*sft\.lr -> sft\.optim\.lr"):
        SFTConfig.model_validate({"lr": 3e-3, "warmup_steps": 5})
    assert SFTConfig(optim=OptimConfig(lr=3e-3)).optim.lr == 3e-3
