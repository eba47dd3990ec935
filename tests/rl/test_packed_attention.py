"""Packed rows' attention, one causal block per sample (asearch.models.packed_attention): the same outputs and
gradients as each sample alone, in the trainer's step as in the function itself."""

from __future__ import annotations

import copy

import pytest
import torch

from asearch.models.lora import LoraConfig
from asearch.models.packed_attention import PACKED_ATTENTION, packed_attention_forward, use_packed_attention
from asearch.rl.trainer import OptimConfig, PolicyTrainer, Sample, TrainerConfig, pack_rows, sequence_logprobs

torch.set_num_threads(1)
LENGTHS = [8, 23, 11, 30, 5, 17, 14]


class _Attention(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


@pytest.fixture
def causal_calls(monkeypatch):
    """Counts SDPA calls made with is_causal=True: the packed path's (SDPA under a mask is not causal)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def test_each_sample_attends_as_if_alone_and_padding_is_zero():
    g = torch.Generator().manual_seed(0)
    lengths, width = [[5, 3, 4], [9], [2, 2]], 12
    q = torch.randn(3, 4, width, 8, generator=g, requires_grad=True)
    k = torch.randn(3, 2, width, 8, generator=g, requires_grad=True)
    v = torch.randn(3, 2, width, 8, generator=g, requires_grad=True)
    upstream = torch.randn(3, width, 4, 8, generator=g)
    out, weights = packed_attention_forward(_Attention(), q, k, v, None, scaling=0.3, packed_lengths=lengths)
    assert weights is None and out.shape == (3, width, 4, 8)
    (out * upstream).sum().backward()
    got = out.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()
    q.grad = k.grad = v.grad = None

    want = torch.zeros_like(out)
    for r, row in enumerate(lengths):
        start = 0
        for n in row:
            s = slice(start, start + n)
            scores = q[r, :, s] @ k[r, :, s].repeat_interleave(2, 0).transpose(-1, -2) * 0.3
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            want[r, s] = (scores.softmax(-1) @ v[r, :, s].repeat_interleave(2, 0)).transpose(0, 1)
            start += n
    (want * upstream).sum().backward()
    torch.testing.assert_close(got[0], want.detach(), atol=1e-6, rtol=1e-5)
    for a, b in zip(got[1:], (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert (got[0][1, 9:] == 0).all() and (got[0][2, 4:] == 0).all()  # the padding's output


def test_without_lengths_it_is_sdpa_with_the_given_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    mask = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    mask[..., 0] = True
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    got, _ = packed_attention_forward(_Attention(), q, k, v, mask, scaling=0.5)
    torch.testing.assert_close(got, sdpa_attention_forward(_Attention(), q, k, v, mask, scaling=0.5)[0])
    with pytest.raises(ValueError, match="rows"):
        packed_attention_forward(_Attention(), q, k, v, None, packed_lengths=[[6]])


@pytest.fixture(scope="module")
def model_and_samples(tiny_policy):
    tok, model = tiny_policy
    g = torch.Generator().manual_seed(1)
    samples = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        behav = (-torch.rand(n, generator=g) * 3).tolist()
        samples.append(Sample(ids, [0] * 3 + [1] * (n - 3), behav, [0] * n, advantage=1.0 if i % 2 else -0.5))
    return model, samples


def test_packed_log_probs_and_gradients_equal_one_sample_at_a_time(model_and_samples, causal_calls):
    model, samples = model_and_samples
    m = copy.deepcopy(model)
    m.set_attn_implementation("sdpa")
    rows = pack_rows([len(s.token_ids) for s in samples])
    assert len(rows) < len(samples)
    weights = [torch.linspace(0.5, 1.5, len(s.token_ids)) * (r + 1) for r, s in enumerate(samples)]
    lp = sequence_logprobs(m, samples, 0.7, generated_only=True, packing=True, chunk=16)
    assert m.config._attn_implementation == PACKED_ATTENTION
    assert sum(causal_calls) == len(samples) * m.config.num_hidden_layers  # one causal block per sample and layer
    sum((lp[r, : len(s.token_ids)] * weights[r]).sum() for r, s in enumerate(samples)).backward()
    packed = torch.cat([p.grad.flatten() for p in m.parameters()])

    alone = copy.deepcopy(model)
    alone.set_attn_implementation("sdpa")
    for r, s in enumerate(samples):
        one = sequence_logprobs(alone, [s], 0.7, generated_only=True, chunk=16)[0]
        torch.testing.assert_close(lp[r, : len(s.token_ids)].detach(), one.detach(), atol=1e-5, rtol=0)
        (one * weights[r]).sum().backward()
    torch.testing.assert_close(packed, torch.cat([p.grad.flatten() for p in alone.parameters()]), atol=1e-5, rtol=1e-4)


def _step_grads(model, samples, **keys):
    m = copy.deepcopy(model)
    trainer = PolicyTrainer(m, TrainerConfig(token_budget=64, optim=OptimConfig(lr=1e-12), **keys))
    trainer.train_step(samples, policy_version=0)
    grads = torch.cat([p.grad.flatten() for p in trainer.master.params if p.grad is not None])
    return grads, trainer


@pytest.mark.parametrize("lora", [None, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])], ids=["full", "lora"])
def test_trainer_step_with_packed_attention_equals_the_padded_step(model_and_samples, causal_calls, lora):
    """attention=sdpa: packed micro-batches run the per-sample attention, checkpointed recomputation too."""
    model, samples = model_and_samples
    keys = {"attention": "sdpa"} | ({"lora": lora} if lora else {})
    padded, _ = _step_grads(model, samples, packing=False, **keys)
    causal_calls.clear()  # (a padded micro-batch of one sample runs causal SDPA too: it has no mask)
    packed, trainer = _step_grads(model, samples, packing=True, activation_checkpointing=False, **keys)
    n_layers = model.config.num_hidden_layers
    assert sum(causal_calls) == len(samples) * n_layers
    checkpointed, _ = _step_grads(model, samples, packing=True, activation_checkpointing=True, logprob_chunk=7, **keys)
    assert sum(causal_calls) == 3 * len(samples) * n_layers  # forward, then the recomputation in backward
    assert padded.abs().sum() > 0
    torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(checkpointed, padded, atol=1e-6, rtol=1e-4)
    assert trainer.model.config._attn_implementation == "eager"  # the model's own, given back after the step


def test_only_an_sdpa_model_switches(model_and_samples):
    model, _ = model_and_samples
    m = copy.deepcopy(model)
    assert not use_packed_attention(m) and m.config._attn_implementation == "eager"
    m.set_attn_implementation("sdpa")
    assert use_packed_attention(m) and use_packed_attention(m)
    assert m.config._attn_implementation == PACKED_ATTENTION
