"""A tiny Qwen2 policy (d=32, 2 layers, tied embeddings) and its tokenizer, shared by the trainer tests."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_policy():
    """(tokenizer, model in eval mode); module-scoped: copy the model before training it."""
    from asearch.models.tiny import build_tiny_model, train_bpe_tokenizer

    tok = train_bpe_tokenizer(["the cat sat on the mat", "a dog ran in the park"] * 50, vocab_size=300)
    return tok, build_tiny_model(tok, hidden=32, layers=2, heads=2, seed=0).eval()
