"""LoRA through peft: only adapters train, checkpoints hold them alone, engines get the merged weights, resume
reproduces the run, and SFT merges its adapters into the model at the end."""

from __future__ import annotations

import asyncio
import copy
import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from asearch.errors import ConfigError  # noqa: E402
from asearch.models.lora import LoraConfig, add_lora, is_lora, merged_state_dict  # noqa: E402
from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig, sequence_logprobs  # noqa: E402

LORA = LoraConfig(r=4, alpha=8)


@pytest.fixture(scope="module")
def policy(tiny_policy):
    return tiny_policy


def _samples(tok, n=4):
    ids = tok("the cat sat on the mat a dog ran in the park")["input_ids"]
    half = len(ids) // 2
    return [Sample(ids, [0] * half + [1] * (len(ids) - half), [-3.0] * len(ids), [0] * len(ids), 1.0 if i % 2 else -1.0)
            for i in range(n)]  # fmt: skip


def _nbytes(obj) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()


def test_only_adapters_train_and_merged_weights_are_the_adapted_model(policy):
    tok, model = policy
    base_sd = {k: v.clone() for k, v in model.state_dict().items()}
    peft_model = add_lora(copy.deepcopy(model), LORA)
    assert is_lora(peft_model)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    merged = merged_state_dict(peft_model)
    assert set(merged) == set(base_sd)  # the base model's own names: any engine loads them
    assert all(torch.equal(merged[k], base_sd[k]) for k in base_sd)  # B = 0 at the start: the base model
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    merged = merged_state_dict(peft_model)
    changed = {k for k in base_sd if not torch.equal(merged[k], base_sd[k])}
    assert changed and all(k.split(".")[-2] in LORA.target_modules for k in changed)
    plain = copy.deepcopy(model)
    plain.load_state_dict(merged)
    ids = torch.tensor([tok("the dog sat in the park")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, peft_model(input_ids=ids).logits, atol=1e-5)


def test_unknown_target_module_is_named(policy):
    _, model = policy
    with pytest.raises(ConfigError, match="attn_c"):
        add_lora(copy.deepcopy(model), LoraConfig(r=2, target_modules=["attn_c"]))


def test_lora_trainer_learns_checkpoints_small_and_resumes_exactly(policy, tmp_path):
    tok, model = policy
    samples = _samples(tok)
    cfg = TrainerConfig(lora=LORA, device="cpu")
    cfg.optim.lr = 1e-2
    trainer = PolicyTrainer(copy.deepcopy(model), cfg)
    before = sequence_logprobs(trainer.model, samples[:1], 1.0).detach()
    trainer.train_step(samples, policy_version=0)
    after = sequence_logprobs(trainer.model, samples[:1], 1.0).detach()
    assert not torch.allclose(before, after)
    base_weights = trainer.model.get_base_model().model.embed_tokens.weight
    assert torch.equal(base_weights, model.model.embed_tokens.weight)  # frozen

    full = PolicyTrainer(copy.deepcopy(model), TrainerConfig(device="cpu"))
    full.train_step(samples, policy_version=0)
    lora_state, full_state = trainer.state_dict(), full.state_dict()
    assert _nbytes(lora_state) * 4 < _nbytes(full_state)  # adapters and their Adam moments only

    # resume: a fresh trainer from the base model and the checkpoint takes the same next step
    resumed = PolicyTrainer(copy.deepcopy(model), cfg)
    resumed.load_state_dict(copy.deepcopy(lora_state))
    a = trainer.train_step(samples, policy_version=1)
    b = resumed.train_step(samples, policy_version=1)
    assert a["perf/grad_norm"] == pytest.approx(b["perf/grad_norm"], rel=1e-6)
    ma, mb = merged_state_dict(trainer.model), merged_state_dict(resumed.model)
    assert all(torch.allclose(ma[k], mb[k], atol=1e-7) for k in ma)

    # save_hf: merged weights any loader reads, adapters beside them
    from asearch.models.loading import load_model

    out = trainer.save_hf(tmp_path / "policy", tok)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    loaded = load_model(out)
    ids = torch.tensor([samples[0].token_ids])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)


def test_inprocess_engine_serves_the_merged_lora_policy(policy):
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    tok, model = policy
    peft_model = add_lora(copy.deepcopy(model), LORA)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    prompt = tok("the cat sat")["input_ids"]

    async def go():
        engine = InProcessEngine(peft_model, tok, cfg=InProcessEngineConfig(device="cpu", max_seq_len=64))
        try:
            return await engine.generate(GenerateRequest(input_ids=prompt, sampling=SamplingParams(temperature=0, max_new_tokens=6)))
        finally:
            await engine.close()

    out = asyncio.run(go())
    ids = torch.tensor([prompt + out.output_ids])
    with torch.no_grad():
        lp = peft_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    ref = lp.gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
    assert torch.allclose(ref, torch.tensor(out.output_logprobs), atol=1e-4)


def test_lora_sft_learns_and_merges_into_the_model(policy):
    from asearch.rl.sft import SFTConfig, sft

    tok, model = policy
    m = copy.deepcopy(model)
    cfg = SFTConfig(steps=60, batch_size=2, device="cpu", lora=LoraConfig(r=8, alpha=32))
    cfg.optim.lr = 3e-2
    losses = sft(m, _samples(tok), cfg)
    # every sample is the same sequence, so an untrained model's loss stays put; the tied embedding (no adapter)
    # carries most of a random tiny model's logits, so adapters on the linear layers move it slowly. One step's
    # loss swings by 3% at this learning rate, and on an AVX2-only CPU 30 steps ended 4.7% down: 60 steps, and
    # the mean of the last five
    assert sum(losses[-5:]) / 5 < 0.95 * losses[0], losses
    assert not is_lora(m) and not any("lora_" in n for n, _ in m.named_parameters())  # merged, adapters gone
    assert torch.equal(m.model.embed_tokens.weight, model.model.embed_tokens.weight)  # not a target: untouched
    assert not torch.equal(m.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight)
