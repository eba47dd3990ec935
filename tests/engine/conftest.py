"""Shared by the SGLang-protocol tests: two tiny models with the same shapes, and reference log-probs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def sglang_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """{"v0": (model, dir, tokenizer), "v1": ...}: random tiny Qwen2s with peaked, seed-specific outputs."""
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    texts = [
        f"the {w} of city {i} is near the river {w}"
        for i in range(60)
        for w in ("capital", "mayor", "bridge")
    ]
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    root: Path = tmp_path_factory.mktemp("sglang-models")
    out = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model = build_tiny_model(tok, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # wider than the default init so distributions are peaked and seed-specific
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        out[name] = (model.eval(), save_tiny(model, tok, root / name), tok)
    return out


def reference_logprobs(
    model, prompt: list[int], out: list[int], temperature: float = 1.0, top_k: int = 0
) -> list[float]:
    """log-probs of `out` after `prompt` from one transformers forward, after temperature and top-k."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


@pytest.fixture(scope="session")
def ref_logprobs() -> Callable[..., list[float]]:
    return reference_logprobs


def logprobs_close(a: list[float], b: list[float], atol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= atol for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="session")
def close() -> Callable[..., bool]:
    return logprobs_close
