"""Load a causal LM and its tokenizer by Hugging Face name, local directory, or built-in alias.

This is the one real code path for models: tiny models saved by `save_tiny`, the converted SmolLM2 and
hub models all go through `from_pretrained`. Offline (HF_HUB_OFFLINE=1) a missing model is a
`ConfigError` that says how to build or cache one instead of a hub stack trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from asearch.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DType = Literal["float32", "bfloat16", "float16", "auto"]


def _smollm2() -> Path:
    from asearch.models.smollm import smollm2_path

    return smollm2_path()


# Aliases resolved before anything touches the hub; the converter runs on first use.
BUILTIN_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": _smollm2,
}


def hf_offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (read at call time, not import time)."""
    return any(
        os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> str:
    """A built-in alias -> its cached directory; anything else unchanged (a directory or a hub name)."""
    name = str(name_or_path)
    if name.lower() in BUILTIN_MODELS:
        return str(BUILTIN_MODELS[name.lower()]())
    return name


def _not_found(name: str, what: str, err: Exception) -> ConfigError:
    aliases = ", ".join(repr(a) for a in BUILTIN_MODELS)
    if Path(name).is_dir():
        where = "is a directory without a saved model (no config.json / tokenizer files)"
    else:
        where = "is not a local directory" + (
            " and is not in the Hugging Face cache (HF_HUB_OFFLINE=1)"
            if hf_offline()
            else " and could not be fetched"
        )
    return ConfigError(
        f"{what} {name!r} {where}: {err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''}\n"
        f"  - use a built-in model: {aliases} (converted from the bundled GGUF on first use), or\n"
        "  - build a tiny random one: asearch.models.tiny.train_bpe_tokenizer -> build_tiny_model -> "
        "save_tiny(model, tokenizer, DIR), then pass DIR, or\n"
        f"  - cache it where the network is reachable: `hf download {name}` and copy ~/.cache/huggingface over"
    )


def _torch_dtype(dtype: DType) -> Any:
    import torch

    return "auto" if dtype == "auto" else getattr(torch, dtype)


def load_model(
    name_or_path: str | os.PathLike[str], *, dtype: DType = "float32", device: str = "cpu"
) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained` in eval mode on `device`; no hub access when offline."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_torch_dtype(dtype), local_files_only=hf_offline()
        )
    except (OSError, ValueError) as e:
        if Path(path).is_dir() and (Path(path) / "config.json").exists():
            raise  # the directory exists but is broken: the original error is the useful one
        raise _not_found(path, "model", e) from e
    return model.to(device).eval()


def empty_model(name_or_path: str | os.PathLike[str], *, dtype: DType = "float32") -> PreTrainedModel:
    """The architecture of `name_or_path` on the meta device: shapes, no weights and no memory. An FSDP rank
    other than 0 builds this and receives rank 0's weights shard by shard (`asearch.rl.distributed.shard_model`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=hf_offline())
    except (OSError, ValueError) as e:
        if Path(path).is_dir() and (Path(path) / "config.json").exists():
            raise
        raise _not_found(path, "model", e) from e
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=_torch_dtype(dtype))
    return model.eval()


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained` for the same names `load_model` accepts."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    if _saved_as_generic(path):
        # A tokenizer saved as a generic fast tokenizer (`train_bpe_tokenizer`, `train_word_tokenizer`) is its
        # tokenizer.json; AutoTokenizer would pick the model type's class instead (Qwen2's rebuilds a BPE with
        # its own split rules from vocab and merges: whole numbers split again, a word-level vocab encodes nothing)
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=hf_offline())
    except (OSError, ValueError) as e:
        if Path(path).is_dir() and any(Path(path).glob("tokenizer*")):
            raise
        raise _not_found(path, "tokenizer", e) from e


def _saved_as_generic(path: str | os.PathLike[str]) -> bool:
    """Whether directory `path` holds a tokenizer.json saved as a generic fast tokenizer (no model-specific class)."""
    config, file = Path(path) / "tokenizer_config.json", Path(path) / "tokenizer.json"
    if not (config.is_file() and file.is_file()):
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") in _GENERIC_TOKENIZER_CLASSES
    except (OSError, ValueError):
        return False  # AutoTokenizer reports a broken file better


_GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
