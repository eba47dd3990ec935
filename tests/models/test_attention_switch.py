"""trainer.attention / sft.attention: SDPA for long micro-batches, the model's own attention for short ones."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from asearch.models.device import TrainingPlacement, use_attention
from asearch.rl.trainer import PolicyTrainer, Sample, TrainerConfig


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    return make_tokenizer(["the search agent reads a page and answers"] * 20)


def test_auto_picks_sdpa_from_the_switch_length_and_returns_to_the_models_own(tokenizer, make_tiny_model) -> None:
    model = make_tiny_model(tokenizer, max_positions=256)
    assert model.config._attn_implementation == "eager"
    auto = TrainingPlacement(attention="auto", attention_switch_tokens=100)
    seen = []
    for longest in (20, 99, 100, 250, 30):
        use_attention(model, longest, auto)
        seen.append(model.config._attn_implementation)
    assert seen == ["eager", "eager", "sdpa", "sdpa", "eager"]
    use_attention(model, 250, TrainingPlacement(attention="model"))
    assert model.config._attn_implementation == "eager"
    use_attention(model, 5, TrainingPlacement(attention="sdpa"))
    assert model.config._attn_implementation == "sdpa"


def test_a_model_without_a_switchable_attention_is_left_alone() -> None:
    calls = []
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    model.set_attn_implementation = lambda name: calls.append(name)  # refuses: the config keeps "eager"
    for _ in range(3):
        use_attention(model, 10_000, TrainingPlacement(attention="auto"))
    assert calls == ["sdpa"]  # asked once, then remembered as fixed
    use_attention(SimpleNamespace(), 10_000, TrainingPlacement(attention="sdpa"))  # no config at all: nothing

    def unsupported(name):
        raise ValueError(f"{name} is not supported by this architecture")

    raising = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"), set_attn_implementation=unsupported)
    for _ in range(2):
        use_attention(raising, 10_000, TrainingPlacement(attention="auto"))  # no crash, then left alone
    assert raising.__dict__.get("_asearch_fixed_attention") is True


def test_auto_leaves_a_model_loaded_with_another_kernel_alone(tokenizer, make_tiny_model) -> None:
    model = make_tiny_model(tokenizer, max_positions=256)
    model.set_attn_implementation("sdpa")
    use_attention(model, 10, TrainingPlacement(attention="auto", attention_switch_tokens=100))
    assert model.config._attn_implementation == "sdpa"  # auto upgrades eager only; it never downgrades


def _samples(lengths: list[int], vocab: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(10, vocab) for _ in range(n)]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        out.append(Sample(ids, mask, [-5.0] * n, [0] * n, 1.0 if i % 2 else -1.0))
    return out


def test_a_step_under_auto_matches_the_same_step_under_eager_and_uses_sdpa_on_its_long_rows(
    tokenizer, make_tiny_model
) -> None:
    """Mixed lengths: the short micro-batch runs eager, the long one SDPA, and the update equals an all-eager one."""
    samples = _samples([24, 30, 200, 210], len(tokenizer))
    weights = {}
    for attention in ("model", "auto"):
        model = make_tiny_model(tokenizer, layers=2, max_positions=256, seed=3)
        used = []
        original = model.set_attn_implementation
        model.set_attn_implementation = lambda name, _o=original, _u=used: (_u.append(name), _o(name))[1]
        cfg = TrainerConfig(token_budget=420, attention=attention, attention_switch_tokens=128, device="cpu")
        PolicyTrainer(model, cfg).train_step(samples, policy_version=0)
        weights[attention] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        # two micro-batches, [24, 30] and [200, 210]: SDPA for the long one (run per sample on its packed rows:
        # asearch_packed_sdpa), and the model handed back as it came
        assert used == ([] if attention == "model" else ["sdpa", "asearch_packed_sdpa", "eager"]), used
        assert model.config._attn_implementation == "eager"
    for k, w in weights["model"].items():
        torch.testing.assert_close(weights["auto"][k], w, rtol=1e-4, atol=1e-5)
