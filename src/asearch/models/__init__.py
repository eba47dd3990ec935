"""Models that work offline: tiny random Qwen2 + trained BPE tokenizer, the bundled SmolLM2-135M, and loading by name."""

from asearch.models.loading import BUILTIN_MODELS, load_model, load_tokenizer, resolve_model_path
from asearch.models.smollm import smollm2_path
from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "build_tiny_model",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
    "save_tiny",
    "smollm2_path",
    "train_bpe_tokenizer",
]
