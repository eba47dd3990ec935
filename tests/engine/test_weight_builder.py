"""DecoderWeightsBuilder: the engine's weights filled one HF-named tensor at a time (as a weight broadcast
delivers them), equal to a whole-state-dict build, into a previous version's tensors when handed them, and
refusing a set that is incomplete or mixes biases."""

from __future__ import annotations

import pytest
import torch

from asearch.engine.local import cpu_kernels
from asearch.engine.local.decoder import DecoderSpec, DecoderWeights, DecoderWeightsBuilder
from asearch.errors import ConfigError

torch.set_num_threads(1)


def qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def same(a: DecoderWeights, b: DecoderWeights) -> bool:
    fa, fb = a.by_field(), b.by_field()
    return fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa)


def test_tensor_by_tensor_in_any_order_equals_the_whole_build_and_fills_reused_tensors() -> None:
    m1, m2 = qwen2(0), qwen2(1)
    spec = DecoderSpec.from_config(m1.config)
    sd1 = {k: v.to(torch.bfloat16) for k, v in m1.state_dict().items()}  # the wire's dtype; the engine's is float32
    sd2 = {k: v.to(torch.bfloat16) for k, v in m2.state_dict().items()}
    whole = DecoderWeights.from_state_dict(spec, sd1, torch.float32)
    builder = DecoderWeightsBuilder(spec, torch.float32)
    for name in reversed(list(sd1)):
        builder.put(name, sd1[name])
    built = builder.finish()
    assert same(built, whole)
    assert built.layers[0].qkv_wt.shape == (64, 64 + 2 * 32)  # fused and transposed: (in, out)

    storage = {k: t.data_ptr() for k, t in built.by_field().items()}
    again = DecoderWeights.from_state_dict(spec, sd2, torch.float32, reuse=built)
    assert {k: t.data_ptr() for k, t in again.by_field().items()} == storage  # no new tensor
    assert same(again, DecoderWeights.from_state_dict(spec, sd2, torch.float32))


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler builds cpu_kernels.c")
@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float32, torch.float16])
def test_the_c_transpose_builds_the_same_weights_as_torchs_copy(wire) -> None:
    """float16 is not the kernel's: those tensors go through torch's copy, which the builder falls back to."""
    m = qwen2(2)
    spec = DecoderSpec.from_config(m.config)
    sd = {k: v.to(wire) for k, v in m.state_dict().items()}
    calls: list[bool] = []
    kernels = cpu_kernels.CpuKernels(cpu_kernels.load())

    def transpose(dst: torch.Tensor, src: torch.Tensor) -> bool:
        calls.append(kernels.transpose_into(dst, src))
        return calls[-1]

    built = DecoderWeights.from_state_dict(spec, sd, torch.float32, transpose=transpose)
    assert same(built, DecoderWeights.from_state_dict(spec, sd, torch.float32))
    assert len(calls) == 2 * 7  # q, k, v, o, gate, up, down of 2 layers
    assert all(calls) == (wire != torch.float16) and any(calls) == (wire != torch.float16)


def test_a_missing_tensor_or_half_the_biases_is_refused() -> None:
    m = qwen2(0)
    spec = DecoderSpec.from_config(m.config)
    sd = m.state_dict()

    def all_but(skipped: str) -> DecoderWeightsBuilder:
        builder = DecoderWeightsBuilder(spec, torch.float32)
        for name, t in sd.items():
            if name != skipped:
                builder.put(name, t)
        return builder

    with pytest.raises(ConfigError, match="down_proj"):
        all_but("model.layers.1.mlp.down_proj.weight").finish()
    builder = all_but("model.layers.0.self_attn.k_proj.bias")
    with pytest.raises(ConfigError, match="biases of layer 0"):
        builder.finish()
    with pytest.raises(ConfigError, match="wrong shapes"):
        builder.put("model.norm.weight", torch.zeros(3))
    with pytest.raises(ConfigError, match="unexpected"):
        builder.check({"model.layers.9.mlp.up_proj.weight": (96, 64)})
