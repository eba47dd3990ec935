"""The C kernels of the decode step (asearch/engine/local/cpu_kernels.c) against torch's ops: attention with RoPE and
the K/V write in the same decoder forward, and the sampler."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from asearch.engine.local import cpu_kernels
from asearch.engine.local.decoder import DecoderSpec, DecoderWeights, RoPE, SlotKVCache, forward
from asearch.engine.local.sampling import RowSampling, sample
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
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    attend = kernels.decode_attention(spec)
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
                spec, weights, rope, caches[1], 1, tokens, starts, None, n_keys=max(lens) + 1,
                decode_attention=attend, rms_norm=kernels.rms_norm,
            )  # fmt: skip
            worst = max(worst, (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item())
            lens = [n + 1 for n in lens]
    assert worst < 1e-5, worst
    for a, b in zip(caches[0].kv, caches[1].kv, strict=True):  # the new tokens' K/V were rotated and written alike
        for row, n in enumerate(lens):
            assert torch.allclose(a[1 + row, :, :, :n], b[1 + row, :, :, :n], atol=1e-5)


@needs_kernels
def test_native_attention_refuses_positions_past_the_cache():
    model = tiny_qwen(4, 2, 12, qwen3=False)
    spec, _, rope = decoder_parts(model)  # RoPE for 128 positions
    attend = cpu_kernels.CpuKernels(cpu_kernels.load()).decode_attention(spec)
    cache = SlotKVCache(spec, torch.float32, max_slots=4, max_len=512)
    cache.ensure(2, 200)
    before = cache.kv[0].clone()
    qkv = torch.randn(2, (spec.heads + 2 * spec.kv_heads) * spec.head_dim)
    for bad in (128, -1):  # past the RoPE table (the cache is longer), and negative
        with pytest.raises(IndexError, match="position past"):
            attend(qkv, rope.table, cache.kv[0][:2], torch.tensor([3, bad]))
    assert torch.equal(cache.kv[0], before)  # nothing written
    with pytest.raises(ValueError, match="wrong dtype"):
        attend(qkv, rope.table, cache.kv[0][:2], torch.tensor([3, 4], dtype=torch.int32))


@needs_kernels
def test_native_rms_norm_matches_torch():
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(7, 2 * 37, generator=g) * 3, torch.randn(37, generator=g)
    rows = x[:, :37]  # rows with a stride past their width
    got = kernels.rms_norm(rows, weight, 1e-6)
    assert torch.allclose(got, torch.nn.functional.rms_norm(rows, (37,), weight, 1e-6), atol=1e-6, rtol=1e-5)


@needs_kernels
def test_native_sampler_draws_what_torch_draws():
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 3000, generator=g) * 4
    logits[5, 100:] = float("-inf")  # a row with most of its vocabulary masked
    temps = [[0.0, 0.5, 1.0, 1.7][i % 4] for i in range(40)]

    def rows():
        return [RowSampling(t, 0, 1.0, random.Random(i)) for i, t in enumerate(temps)]

    ids, lps = sample(logits, rows(), kernels=kernels)
    want_ids, want_lps = sample(logits, rows())
    assert ids == want_ids
    assert lps == pytest.approx(want_lps, abs=1e-5)
    assert ids[5] < 100
    greedy_only = [RowSampling(0.0, 0, 1.0, random.Random(0)) for _ in range(3)]
    assert sample(logits[:3], greedy_only, kernels=kernels)[0] == logits[:3].argmax(-1).tolist()


@needs_kernels
def test_native_sampler_frequencies_and_the_top_of_the_cdf():
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    logits = torch.tensor([[2.0, 1.0, 0.5, float("-inf"), -1.0, float("-inf")]])
    n = 6000
    rows = [RowSampling(0.8, 0, 1.0, random.Random(i)) for i in range(n)]
    tokens, logprobs = sample(logits.expand(n, -1).contiguous(), rows, kernels=kernels)
    expected = torch.log_softmax(logits[0] / 0.8, -1)
    counts = torch.bincount(torch.tensor(tokens), minlength=6).float() / n
    assert torch.allclose(counts, expected.exp(), atol=0.025), (counts, expected.exp())
    assert all(lp == pytest.approx(expected[t].item(), abs=1e-5) for t, lp in zip(tokens, logprobs, strict=True))

    class Top(random.Random):  # u just below 1: the last token with mass, never a masked one after it
        def random(self):
            return 1.0 - 2**-53

    assert sample(logits, [RowSampling(1.0, 0, 1.0, Top())], kernels=kernels)[0] == [4]


def test_cpu_kernels_setting_resolves_and_falls_back(monkeypatch):
    cpu = torch.device("cpu")
    assert cpu_kernels.kernels_for("torch", cpu, torch.float32) is None
    assert cpu_kernels.kernels_for("auto", cpu, torch.bfloat16) is None
    assert cpu_kernels.kernels_for("native", torch.device("meta"), torch.float32) is None
    monkeypatch.setattr(cpu_kernels, "_state", {})
    monkeypatch.setenv("CC", "/nonexistent/cc")  # a build that fails: logged, torch's ops stay
    assert cpu_kernels.load() is None
    assert cpu_kernels.kernels_for("auto", cpu, torch.float32) is None
    with pytest.raises(ConfigError, match="could not be built"):
        cpu_kernels.kernels_for("native", cpu, torch.float32)


@needs_kernels
def test_engine_with_native_kernels_samples_what_torch_samples():
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    model = tiny_qwen(4, 2, 12, qwen3=False)
    reqs = [
        GenerateRequest(
            input_ids=list(range(3, 3 + 4 * i)),
            sampling=SamplingParams(max_new_tokens=12, seed=i, temperature=0.0 if i == 2 else 1.0),
        )
        for i in range(1, 6)
    ]

    async def run(setting: str):
        engine = InProcessEngine(model, None, cfg=InProcessEngineConfig(max_seq_len=64, cpu_kernels=setting))
        try:
            assert (engine._kernels is not None) == (setting == "native")
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.close()

    native, reference = asyncio.run(run("native")), asyncio.run(run("torch"))
    for a, b in zip(native, reference, strict=True):
        assert a.output_ids == b.output_ids
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(8, 8), (37, 21), (1, 13), (70, 45), (130, 64)])
def test_transpose_into_equals_torchs_copy_bit_for_bit(dtype, rows, cols):
    """Whole 8 x 8 tiles and the edges around them, from a column slice into a column slice (both with
    row strides of their own), special values included."""
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    g = torch.Generator().manual_seed(rows * cols)
    wide = torch.randn(rows, cols + 11, generator=g).to(dtype)
    src = wide[:, 5 : 5 + cols]
    assert rows == 1 or not src.is_contiguous()  # the kernel must follow the source's row stride
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40], dtype=dtype)
    src[0, : min(cols, 5)] = specials[: min(cols, 5)]
    fused = torch.full((cols, rows + 9), 7.0)
    fused_ref = fused.clone()
    assert kernels.transpose_into(fused[:, 3 : 3 + rows], src)
    fused_ref[:, 3 : 3 + rows].copy_(src.t())
    assert torch.equal(fused.view(torch.int32), fused_ref.view(torch.int32))  # NaN bits and -0.0 too; rest untouched


@needs_kernels
def test_transpose_into_declines_what_it_does_not_handle_and_writes_nothing():
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())
    src = torch.randn(16, 24)
    for dst, s in [
        (torch.zeros(24, 16), src.half()),  # float16 source
        (torch.zeros(24, 16, dtype=torch.float64), src),  # float64 destination
        (torch.zeros(16, 24), src),  # not the transposed shape
        (torch.zeros(24, 16), src.t().contiguous().t()),  # source elements not contiguous in a row
        (torch.zeros(16, 24).t(), src),  # destination elements not contiguous in a row
    ]:
        assert not kernels.transpose_into(dst, s)
        assert not dst.any()
