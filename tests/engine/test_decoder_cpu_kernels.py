"""The C decode attention (asearch/engine/cpu_kernels.c) against torch's kernel in the same decoder forward."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asearch.engine import cpu_kernels
from asearch.engine.decoder import DecoderSpec, DecoderWeights, RoPE, SlotKVCache, forward
from asearch.errors import ConfigError

torch.set_num_threads(1)

needs_kernels = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler builds cpu_kernels.c")


def tiny_qwen(heads: int, kv_heads: int, head_dim: int, *, qwen3: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=200, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
    )  # fmt: skip
    torch.manual_seed(heads * 100 + head_dim)
    if qwen3:  # q/k norm, head_dim independent of hidden / heads
        return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=head_dim)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()  # q/k/v biases, head_dim = 48 / heads


def decoder_parts(model):
    spec = DecoderSpec.from_config(model.config)
    weights = DecoderWeights.from_state_dict(spec, model.state_dict(), torch.float32)
    rotary = model.model.rotary_emb
    rope = RoPE(rotary.inv_freq, rotary.attention_scaling, 128, torch.float32)
    return spec, weights, rope


@needs_kernels
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "qwen3"),
    [(4, 2, 12, False), (4, 4, 12, False), (8, 2, 32, True), (4, 1, 64, True), (2, 2, 8, True)],
)
def test_native_decode_matches_sdpa_on_ragged_rows(heads, kv_heads, head_dim, qwen3):
    model = tiny_qwen(heads, kv_heads, head_dim, qwen3=qwen3)
    spec, weights, rope = decoder_parts(model)
    attend = cpu_kernels.DecodeAttention(cpu_kernels.load(), spec.heads, spec.kv_heads, spec.head_dim)
    caches = [SlotKVCache(spec, torch.float32, max_slots=8, max_len=128) for _ in range(2)]
    g = torch.Generator().manual_seed(0)
    lens = [21, 5, 40, 1]  # rows of slots 1..4 (first_slot 1 must be honoured)
    prompts = torch.randint(0, spec.vocab_size, (4, 40), generator=g)
    with torch.inference_mode():
        for cache in caches:  # the same prefill (torch's kernel) into both caches
            forward(spec, weights, rope, cache, 1, prompts, torch.zeros(4, dtype=torch.long), torch.tensor(lens))
        # garbage past each row's length: a kernel that read it would give NaN
        for buf in caches[1].kv:
            for b, n in enumerate(lens):
                buf[1 + b, :, :, n:] = float("nan")
        worst = 0.0
        for _ in range(6):
            tokens = torch.randint(0, spec.vocab_size, (4, 1), generator=g)
            starts = torch.tensor(lens)
            want = forward(spec, weights, rope, caches[0], 1, tokens, starts, None, n_keys=max(lens) + 1)
            got = forward(
                spec, weights, rope, caches[1], 1, tokens, starts, None, n_keys=max(lens) + 1, decode_attention=attend
            )  # fmt: skip
            worst = max(worst, (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item())
            lens = [n + 1 for n in lens]
    assert worst < 1e-5, worst
    for a, b in zip(caches[0].kv, caches[1].kv, strict=True):  # the new tokens' K/V were written alike
        for row, n in enumerate(lens):
            assert torch.allclose(a[1 + row, :, :, :n], b[1 + row, :, :, :n], atol=1e-5)


def test_cpu_attention_setting_resolves_and_falls_back(monkeypatch):
    spec = DecoderSpec.from_config(tiny_qwen(4, 2, 12, qwen3=False).config)
    cpu = torch.device("cpu")
    assert cpu_kernels.decode_attention_for("sdpa", spec, cpu, torch.float32) is None
    assert cpu_kernels.decode_attention_for("auto", spec, cpu, torch.bfloat16) is None
    assert cpu_kernels.decode_attention_for("native", spec, torch.device("meta"), torch.float32) is None
    monkeypatch.setattr(cpu_kernels, "_state", {})
    monkeypatch.setenv("CC", "/nonexistent/cc")  # a build that fails: logged, torch's kernel stays
    assert cpu_kernels.load() is None
    assert cpu_kernels.decode_attention_for("auto", spec, cpu, torch.float32) is None
    with pytest.raises(ConfigError, match="could not be built"):
        cpu_kernels.decode_attention_for("native", spec, cpu, torch.float32)


@needs_kernels
def test_engine_with_native_attention_samples_what_sdpa_samples():
    from asearch.engine.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    model = tiny_qwen(4, 2, 12, qwen3=False)
    reqs = [
        GenerateRequest(input_ids=list(range(3, 3 + 4 * i)), sampling=SamplingParams(max_new_tokens=12, seed=i))
        for i in range(1, 6)
    ]

    async def run(setting: str):
        engine = InProcessEngine(model, None, cfg=InProcessEngineConfig(max_seq_len=64, cpu_attention=setting))
        try:
            assert (engine._decode_attention is not None) == (setting == "native")
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.close()

    native, sdpa = asyncio.run(run("native")), asyncio.run(run("sdpa"))
    for a, b in zip(native, sdpa, strict=True):
        assert a.output_ids == b.output_ids
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)
