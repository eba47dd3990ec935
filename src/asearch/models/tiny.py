"""Build small offline models from scratch: a byte-level BPE tokenizer trained on a corpus and a random Qwen2.

Used by tests and the CPU RL demo, where no pretrained weights may be downloaded. `save_tiny` writes a
normal Hugging Face directory, so everything downstream loads it through the real `from_pretrained` path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heavy imports stay lazy: importing asearch.models must not pull torch in
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

log = logging.getLogger(__name__)

IM_START, IM_END, ENDOFTEXT, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"
DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END, PAD)

QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ChatML, as Qwen and SmolLM use it; no default system message so prompts stay short for tiny models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    *,
    min_frequency: int = 2,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (GPT-2 style, every byte representable) on `texts`.

    The special tokens get the first ids in the given order and are never split. `<|im_end|>` is the
    eos token (what a chat model emits at the end of a turn), `<|endoftext|>` the bos, `<|pad|>` the pad,
    and the tokenizer carries a ChatML chat template so `apply_chat_template` works.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = list(special_tokens)
    for required in (IM_START, IM_END, ENDOFTEXT, PAD):
        if required not in special_tokens:
            raise ValueError(f"special_tokens must include {required!r} (got {special_tokens})")
    n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < n_bytes + len(special_tokens):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
            f"{n_bytes} byte tokens + {len(special_tokens)} special tokens"
        )

    # The exact pipeline transformers' Qwen2Tokenizer rebuilds on load (NFC, Qwen's split regex with
    # single digits, byte-level, no post-processor): a saved directory is loaded as that class because the
    # model is a Qwen2, and any difference here would make the reloaded tokenizer encode differently.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        unk_token=None,
        pad_token=PAD,
        additional_special_tokens=[t for t in special_tokens if t not in (ENDOFTEXT, IM_END, PAD)],
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
    log.info("trained byte-level BPE tokenizer: %d tokens (%d special)", len(hf), len(special_tokens))
    return hf


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 2048,
    tie: bool = True,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 sized for CPU training (d=128, 4 layers: ~1M parameters).

    `kv_heads` defaults to heads // 2 (grouped-query attention, so the engine's GQA path is exercised);
    `intermediate` to 3 * hidden. The same seed gives the same weights.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kv_heads = kv_heads if kv_heads is not None else max(1, heads // 2)
    intermediate = intermediate if intermediate is not None else 3 * hidden
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} must be divisible by kv_heads={kv_heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
        # plain matmul attention: 1.22x the training tokens/s of SDPA's CPU flash kernel at head size 32
        # and ~150-token sequences (measured; the kernel's backward was 39% of a step). In-process only:
        # a saved model loads with the library default.
        attn_implementation="eager",
    )
    # Seed a private generator state: building a model must not disturb the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    log.info(
        "built tiny Qwen2: %s parameters (hidden=%d layers=%d heads=%d/%d kv vocab=%d)",
        f"{model.num_parameters():,}",
        hidden,
        layers,
        heads,
        kv_heads,
        config.vocab_size,
    )
    return model


def save_tiny(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Write model (safetensors) and tokenizer as a Hugging Face directory that `from_pretrained` loads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
