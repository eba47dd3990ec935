"""The trainer's memory and speed knobs change no result: the chunked LM head, packed micro-batches, activation
checkpointing, bfloat16 parameters with float32 copies in the optimiser."""

from __future__ import annotations

import copy

import pytest
import torch

from asearch.models.lora import LoraConfig
from asearch.rl.trainer import (
    OptimConfig,
    PolicyTrainer,
    Sample,
    TrainerConfig,
    chunked_target_logprobs,
    micro_batches,
    pack_rows,
    sequence_logprobs,
)

torch.set_num_threads(1)
LENGTHS = [8, 23, 11, 30, 5, 17, 14]


@pytest.fixture(scope="module")
def model_and_samples(tiny_policy):
    tok, model = tiny_policy
    g = torch.Generator().manual_seed(1)
    samples = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(5, len(tok), (n,), generator=g).tolist()
        mask = [0] * 3 + [1] * (n - 3)
        behav = (-torch.rand(n, generator=g) * 3).tolist()
        samples.append(Sample(ids, mask, behav, [0] * n, advantage=1.0 if i % 2 else -0.5))
    return model, samples


def _weights(samples) -> torch.Tensor:
    """A different weight per position, so the gradient sees every log-prob."""
    out = torch.zeros(len(samples), max(len(s.token_ids) for s in samples))
    for r, s in enumerate(samples):
        out[r, : len(s.token_ids)] = torch.linspace(0.5, 1.5, len(s.token_ids)) * (r + 1)
    return out


@pytest.mark.parametrize("keep_bytes", [0, 10 * 50 * 4], ids=["recomputed", "kept"])
def test_chunked_head_equals_the_full_log_softmax(keep_bytes):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (10,), generator=g)
    upstream = torch.randn(10, generator=g)
    got = chunked_target_logprobs(hidden, weight, targets, 0.7, chunk=3, keep_bytes=keep_bytes)
    assert (got.grad_fn.kept is not None) == bool(keep_bytes)  # 10 x 50 float32 softmax: 2,000 bytes
    (got * upstream).sum().backward(retain_graph=True)
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (got * upstream).sum().backward()  # a second backward (the kept softmax was used up): recomputed, the same
    torch.testing.assert_close(hidden.grad, grads[0])
    torch.testing.assert_close(weight.grad, grads[1])
    hidden.grad = weight.grad = None
    want = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-5)


def test_chunked_head_under_bf16_autocast_matches_bf16_logits():
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(12, 16, generator=g), torch.randn(40, 16, generator=g)
    targets = torch.randint(0, 40, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = chunked_target_logprobs(hidden, weight, targets, 1.0, chunk=5)
        logits = torch.nn.functional.linear(hidden, weight)  # bf16, as the model's head under autocast
    assert got.dtype == torch.float32
    want = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_rows_give_the_padded_log_probs_and_gradients(model_and_samples, attention):
    model, samples = model_and_samples
    m = copy.deepcopy(model)
    m.set_attn_implementation(attention)
    assert len(pack_rows([len(s.token_ids) for s in samples])) < len(samples)  # some rows hold several samples
    out = []
    for packing in (False, True):
        m.zero_grad()
        lp = sequence_logprobs(m, samples, 0.7, generated_only=True, packing=packing, chunk=16)
        (lp * _weights(samples)).sum().backward()
        out.append((lp.detach(), torch.cat([p.grad.flatten() for p in m.parameters()])))
    (padded, g_padded), (packed, g_packed) = out
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(g_packed, g_padded, atol=1e-5, rtol=1e-4)
    assert (padded[:, :3] == 0).all() and (padded[:, 3] != 0).all()  # the prompt has none, the generated all


def test_packed_micro_batches_hold_the_budget_and_every_sample(model_and_samples):
    _, samples = model_and_samples

    def cells(batches, packing):  # rows x width of each micro-batch
        lengths = [[len(samples[i].token_ids) for i in b] for b in batches]
        return [(len(pack_rows(n)) if packing else len(n)) * max(n) for n in lengths]

    packed = micro_batches(samples, 64, packing=True)
    assert sorted(i for b in packed for i in b) == list(range(len(samples)))
    assert all(c <= 64 for c in cells(packed, True))
    padded = micro_batches(samples, 64)
    assert sum(cells(packed, True)) < sum(cells(padded, False))  # shorter samples filled padding
    assert micro_batches(samples, 64, packing=True) == packed  # deterministic: every rank groups alike


def _step_grads(model, samples, **keys):
    m = copy.deepcopy(model)
    cfg = TrainerConfig(token_budget=64, optim=OptimConfig(lr=1e-12), **keys)
    trainer = PolicyTrainer(m, cfg)
    stats = trainer.train_step(samples, policy_version=0)
    return torch.cat([p.grad.flatten() for p in trainer.master.params if p.grad is not None]), stats, trainer


def test_packing_and_checkpointing_train_as_the_padded_step(model_and_samples):
    model, samples = model_and_samples
    padded, stats, _ = _step_grads(model, samples, packing=False, activation_checkpointing=False)
    packed, _, _ = _step_grads(model, samples, packing=True, activation_checkpointing=False)
    checkpointed, _, trainer = _step_grads(model, samples, packing=True, activation_checkpointing=True, logprob_chunk=7)
    assert trainer.model.is_activation_checkpointing
    torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(checkpointed, packed, atol=1e-6, rtol=1e-4)
    assert stats["perf/train_tokens_per_s"] > 0 and "perf/mfu" not in stats  # no known peak on a CPU


def test_checkpointing_with_lora_trains_the_adapters_alike(model_and_samples):
    model, samples = model_and_samples
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    plain, _, _ = _step_grads(model, samples, lora=lora, activation_checkpointing=False)
    checkpointed, _, _ = _step_grads(model, samples, lora=lora, activation_checkpointing=True)
    assert plain.abs().sum() > 0
    torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=1e-4)


def test_gradient_checkpointing_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="activation_checkpointing"):
        cfg = TrainerConfig.model_validate({"gradient_checkpointing": True})
    assert cfg.activation_checkpointing is True
    assert TrainerConfig().checkpointing_on(torch.device("cpu")) is False  # auto: CUDA only
    assert TrainerConfig(activation_checkpointing="true").activation_checkpointing is True


def test_bf16_parameters_train_through_float32_copies(model_and_samples):
    model, samples = model_and_samples
    m = copy.deepcopy(model)
    trainer = PolicyTrainer(m, TrainerConfig(param_dtype="bfloat16", optim=OptimConfig(lr=1e-3)))
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.master.params} == {torch.float32}
    before = [p.detach().clone() for p in trainer.master.params]
    trainer.train_step(samples, policy_version=0)
    moved = [(p - b).abs().max().item() for p, b in zip(trainer.master.params, before, strict=True)]
    assert max(moved) > 0
    for p, (weight, copy_) in zip(m.parameters(), trainer.master.pairs, strict=True):
        assert p is weight and torch.equal(p, copy_.to(torch.bfloat16))  # the model holds the rounded copies
    state = trainer.state_dict()
    resumed = PolicyTrainer(copy.deepcopy(model), TrainerConfig(param_dtype="bfloat16", optim=OptimConfig(lr=1e-3)))
    resumed.load_state_dict(state)
    for a, b in zip(resumed.master.params, trainer.master.params, strict=True):
        assert torch.equal(a, b)  # the float32 copies come back, not the rounded weights


_FSDP_ONE_RANK = """
import sys, torch
from transformers import AutoModelForCausalLM
from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed
from asearch.rl.trainer import OptimConfig, Sample, TrainerConfig
torch.set_num_threads(1)
causal, sdpa = [], torch.nn.functional.scaled_dot_product_attention
def spy(*args, **kwargs):  # is_causal=True with packing: the per-sample attention ran
    causal.append(kwargs.get("is_causal", False))
    return sdpa(*args, **kwargs)
torch.nn.functional.scaled_dot_product_attention = spy
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
samples = torch.load(sys.argv[2], weights_only=False)
cfg = TrainerConfig(token_budget=64, optim=OptimConfig(lr=1e-12), activation_checkpointing=True, logprob_chunk=7,
                    attention=sys.argv[4])
trainer = DistributedPolicyTrainer(model, cfg, env=init_distributed("gloo"))
trainer.train_step(samples, policy_version=0)
grads = {n: p.grad.full_tensor() for n, p in trainer.model.named_parameters() if p.grad is not None}
torch.save({"grads": grads, "checkpointing": trainer.model.is_activation_checkpointing, "causal": sum(causal)}, sys.argv[3])
torch.distributed.destroy_process_group()
"""


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_fsdp_rank_with_checkpointing_and_the_chunked_head_equals_one_process(model_and_samples, tiny_policy, tmp_path, attention):
    """FSDP over one gloo process (its root gathers the head inside the swapped-in chunked head), checkpointed
    layers and packed rows (under sdpa: one causal block per sample, asearch.models.packed_attention): the padded,
    unsharded step's gradients."""
    import os
    import subprocess
    import sys

    from asearch.models.tiny import save_tiny

    model, samples = model_and_samples
    save_tiny(model, tiny_policy[0], tmp_path / "model")
    torch.save(samples, tmp_path / "samples.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    args = [str(tmp_path / "model"), str(tmp_path / "samples.pt"), str(tmp_path / "out.pt"), attention]
    proc = subprocess.run([sys.executable, "-c", _FSDP_ONE_RANK, *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    assert got["checkpointing"]
    assert got["causal"] == (2 * len(samples) * model.config.num_hidden_layers if attention == "sdpa" else 0)  # + recomputed
    m = copy.deepcopy(model)
    PolicyTrainer(m, TrainerConfig(token_budget=64, optim=OptimConfig(lr=1e-12), packing=False)).train_step(samples, policy_version=0)
    for n, p in m.named_parameters():
        torch.testing.assert_close(got["grads"][n], p.grad, atol=1e-6, rtol=1e-4, msg=n)
