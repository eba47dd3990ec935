"""The engine's lean decoder and sampler against transformers and a slow reference, for each architecture."""

from __future__ import annotations

import random

import pytest
import torch

from asearch.engine.local import sampling
from asearch.engine.local.decoder import DecoderSpec, DecoderWeights, RoPE, SlotKVCache, forward
from asearch.engine.local.sampling import RowSampling, filter_logits, sample
from asearch.errors import ConfigError

torch.set_num_threads(1)


def tiny(arch: str):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    if arch == "llama":  # SmolLM2's architecture, with rope scaling to exercise transformers' inv_freq
        cfg = LlamaConfig(
            **common,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        )
        return LlamaForCausalLM(cfg).eval()
    if arch == "qwen2":  # q/k/v biases, untied head
        return Qwen2ForCausalLM(
            Qwen2Config(**common, num_key_value_heads=1, tie_word_embeddings=False)
        ).eval()
    return Qwen3ForCausalLM(
        Qwen3Config(**common, num_key_value_heads=2, head_dim=32)
    ).eval()  # q/k norm, head_dim != H/heads


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_ragged_prefill_chunks_and_decode_match_transformers(arch):
    model = tiny(arch)
    spec = DecoderSpec.from_config(model.config)
    weights = DecoderWeights.from_state_dict(spec, model.state_dict(), torch.float32)
    rotary = model.model.rotary_emb
    rope = RoPE(rotary.inv_freq, rotary.attention_scaling, 256, torch.float32)
    cache = SlotKVCache(spec, torch.float32, max_slots=8, max_len=256)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, spec.vocab_size, (n,), generator=g).tolist() for n in (40, 12, 33)]
    with torch.inference_mode():
        ref = [torch.log_softmax(model(torch.tensor([s])).logits[0], -1) for s in seqs]
        lens = [0, 0, 0]
        err = 0.0
        # slots 2..4 (not 0: the first_slot offset must be honoured); ragged chunks, then single tokens
        for chunk in ([3, 7, 1], [9, 2, 4], [1, 1, 1], [5, 1, 8], [1, 1, 1]):
            width = max(chunk)
            toks = torch.tensor(
                [s[n : n + c] + [0] * (width - c) for s, n, c in zip(seqs, lens, chunk, strict=True)]
            )
            out = forward(spec, weights, rope, cache, 2, toks, torch.tensor(lens), torch.tensor(chunk))
            lens = [n + c for n, c in zip(lens, chunk, strict=True)]
            for b in range(3):
                err = max(err, (torch.log_softmax(out[b], -1) - ref[b][lens[b] - 1]).abs().max().item())
    assert err < 1e-4, err
    assert cache.slots >= 5 and cache.length >= max(lens)


def test_cache_grows_and_moves_slots():
    spec = DecoderSpec.from_config(tiny("qwen2").config)
    cache = SlotKVCache(spec, torch.float32, max_slots=16, max_len=100)
    cache.kv[0][1, :, :, :3] = 7.0
    cache.ensure(9, 70)
    assert (cache.slots, cache.length) == (16, 100)  # doubling, capped at the maxima
    assert torch.all(cache.kv[0][1, :, :, :3] == 7.0)  # growth keeps contents
    cache.move(1, 5, 3)
    assert torch.all(cache.kv[0][5, :, :, :3] == 7.0)
    with pytest.raises(ValueError, match="exceeds"):
        cache.ensure(17, 10)


def test_unsupported_architecture_is_a_clear_error():
    from transformers import GPT2Config

    with pytest.raises(ConfigError, match="supports model types"):
        DecoderSpec.from_config(GPT2Config())


def slow_filter(scaled, top_k, top_p):
    out = scaled.clone()
    for b in range(scaled.shape[0]):
        values, order = scaled[b].sort(descending=True)
        if top_k[b]:
            values[int(top_k[b]) :] = float("-inf")
        probs = torch.softmax(values, -1)
        if top_p[b] < 1:
            values[(probs.cumsum(-1) - probs) >= top_p[b]] = float("-inf")
        out[b] = torch.full_like(values, float("-inf")).scatter(0, order, values)
    return out


@pytest.mark.parametrize("vocab", [50, 3000])
@pytest.mark.parametrize("candidates", [8, 256])
def test_filter_matches_full_sort_reference(vocab, candidates, monkeypatch):
    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", candidates)  # small: forces the fallback path too
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    for _ in range(15):
        scaled = torch.randn(6, vocab, generator=g) * rng.choice([0.3, 3.0, 12.0])
        top_k = torch.tensor([rng.choice([0, 1, 5, 40, 500]) for _ in range(6)])
        top_p = torch.tensor([rng.choice([1.0, 0.5, 0.9, 0.99]) for _ in range(6)])
        got, want = filter_logits(scaled, top_k, top_p), slow_filter(scaled, top_k, top_p)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        assert torch.allclose(got[~torch.isinf(got)], want[~torch.isinf(want)])


def test_sampler_frequencies_follow_the_filtered_distribution():
    """Empirical draw frequencies of the inverse-CDF sampler match softmax(filtered logits)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    n = 6000
    rows = [RowSampling(temperature=0.8, top_k=4, top_p=0.95, rng=random.Random(i)) for i in range(n)]
    tokens, logprobs = sample(logits.expand(n, -1).contiguous(), rows)
    expected = torch.log_softmax(slow_filter(logits / 0.8, torch.tensor([4]), torch.tensor([0.95]))[0], -1)
    counts = torch.bincount(torch.tensor(tokens), minlength=6).float() / n
    assert torch.allclose(counts, expected.exp(), atol=0.025), (counts, expected.exp())
    assert all(
        lp == pytest.approx(expected[t].item(), abs=1e-5) for t, lp in zip(tokens, logprobs, strict=True)
    )
    assert counts[4:].sum() == 0  # outside the top-4


def test_prefill_plan_respects_budget_and_cache_length():
    from asearch.engine.local.inprocess import plan_prefill

    rng = random.Random(0)
    for _ in range(300):
        max_len, chunk, budget = rng.choice([64, 200]), rng.choice([4, 16, 64]), rng.choice([16, 64, 512])
        slots = sorted(rng.sample(range(12), rng.randint(1, 12)))
        rows = []
        for s in slots:
            total = rng.randint(2, max_len)
            cached = rng.randint(0, total - 2)
            rows.append((s, cached, total - cached))
        groups = plan_prefill(rows, chunk=chunk, budget=budget, max_len=max_len)
        covered = [i for a, b, _ in groups for i in range(a, b)]
        assert covered == slots  # every row exactly once, groups contiguous and in order
        info = {s: (c, n) for s, c, n in rows}
        for a, b, width in groups:
            assert width == max(min(chunk, budget, info[i][1]) for i in range(a, b))
            assert (b - a) * width <= budget
            assert all(info[i][0] + width <= max_len for i in range(a, b)), (rows, groups)
