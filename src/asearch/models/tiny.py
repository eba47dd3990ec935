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
# The same with a number kept whole after one leading character (` 1924`), so BPE can merge it into one token:
# a year in single digits is four tokens that recur everywhere in a page, and a tiny model copying them
# digit by digit answered 0 of 91 year questions (docs/demo.md).
WHOLE_NUMBERS_PRETOKENIZE_REGEX = QWEN2_PRETOKENIZE_REGEX.replace(r"|\p{N}|", r"|[^\r\n\p{L}\p{N}]?\p{N}+|")

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
    whole_numbers: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (GPT-2 style, every byte representable) on `texts`.

    The special tokens get the first ids in the given order and are never split. `<|im_end|>` is the
    eos token (what a chat model emits at the end of a turn), `<|endoftext|>` the bos, `<|pad|>` the pad,
    and the tokenizer carries a ChatML chat template so `apply_chat_template` works. Text is split as
    Qwen2 splits it (digits one by one), or with `whole_numbers` keeping each number whole for merging.
    """
    from tokenizers import models, pre_tokenizers, trainers

    special_tokens = list(special_tokens)
    _check_specials(special_tokens)
    n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < n_bytes + len(special_tokens):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
            f"{n_bytes} byte tokens + {len(special_tokens)} special tokens"
        )

    # Qwen2's pipeline (NFC, its split regex, byte-level, no post-processor). A saved directory reloads
    # from its tokenizer.json (`load_tokenizer`), not rebuilt by the model type's class.
    tok = _byte_level(models.BPE(), WHOLE_NUMBERS_PRETOKENIZE_REGEX if whole_numbers else QWEN2_PRETOKENIZE_REGEX)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    hf = _wrap(tok, special_tokens, unk_token=None)
    log.info("trained byte-level BPE tokenizer: %d tokens (%d special)", len(hf), len(special_tokens))
    return hf


# A word-level tokenizer's pieces: Qwen2's split with whole numbers and newlines apart. A word keeps the one
# character before it (` Kota`, `>Kota`), so concatenating the pieces gives back the text exactly.
WORD_PIECES_REGEX = WHOLE_NUMBERS_PRETOKENIZE_REGEX.replace(r"[^\s\p{L}\p{N}]+[\r\n]*|", r"[^\s\p{L}\p{N}]+|")
UNK = "<|unk|>"


def train_word_tokenizer(
    texts: Iterable[str],
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    *,
    min_frequency: int = 1,
    max_vocab: int = 100_000,
) -> PreTrainedTokenizerFast:
    """Fit a word-level tokenizer on `texts`: every piece seen (a word or number with the character before
    it, a punctuation run, a newline) is one token, and decoding gives back the text exactly.

    For a closed vocabulary like the synthetic world's, where a name word split into byte-pair pieces is
    several tokens a tiny model must copy in order (docs/demo.md): here ` Kaitynd` is one token. A piece
    not seen maps to `<|unk|>`. Special tokens, eos, bos, pad and the chat template are those of
    `train_bpe_tokenizer`.
    """
    from tokenizers import models, trainers

    special_tokens = [*special_tokens, *([UNK] if UNK not in special_tokens else [])]
    _check_specials(special_tokens)
    tok = _byte_level(models.WordLevel(unk_token=UNK), WORD_PIECES_REGEX)
    trainer = trainers.WordLevelTrainer(
        vocab_size=max_vocab, min_frequency=min_frequency, special_tokens=special_tokens, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = _wrap(tok, special_tokens, unk_token=UNK)
    log.info("trained word-level tokenizer: %d tokens (%d special)", len(hf), len(special_tokens))
    return hf


def _byte_level(model, split_regex: str):
    """A `tokenizers.Tokenizer` around `model`: NFC, split by `split_regex`, bytes mapped to printable
    characters (every byte representable, decoding exact), no post-processor."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _check_specials(special_tokens: Sequence[str]) -> None:
    for required in (IM_START, IM_END, ENDOFTEXT, PAD):
        if required not in special_tokens:
            raise ValueError(f"special_tokens must include {required!r} (got {list(special_tokens)})")


def _wrap(tok, special_tokens: Sequence[str], unk_token: str | None) -> PreTrainedTokenizerFast:
    """The `tokenizers` object as a transformers tokenizer with ChatML roles and template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        unk_token=unk_token,
        pad_token=PAD,
        additional_special_tokens=[t for t in special_tokens if t not in (ENDOFTEXT, IM_END, PAD, unk_token)],
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
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
        # plain matmul attention trains faster on CPU than SDPA's flash kernel at these sizes (docs/demo.md).
        # In-process only: a saved model loads with the library default.
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
