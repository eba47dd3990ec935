"""Tiny offline models: BPE tokenizer training, chat template, random Qwen2, save/load through from_pretrained."""

from __future__ import annotations

import pytest
import torch

from asearch.errors import ConfigError
from asearch.models import build_tiny_model, load_model, load_tokenizer, save_tiny, train_bpe_tokenizer
from asearch.models.tiny import CHATML_TEMPLATE

torch.set_num_threads(1)

CORPUS = [
    "Paris is the capital and largest city of France.",
    "The Eiffel Tower was built for the 1889 World's Fair in Paris.",
    "search(query) returns the top-k snippets with their urls; access(url) returns the page text.",
    "Marie Curie was born in Warsaw in 1867 and worked in Paris.",
    "Question: Where was the spouse of Ada Lovelace born? Answer: London.",
] * 40

TRICKY = [
    "Paris is the capital of France.",
    "  leading and   inner spaces\n\nand newlines\t tabs ",
    "numbers 1867 and 3.14159, symbols <>{}[]()!?",
    "unicode: héllo wörld, 北京, Ωμέγα, emoji 🙂🚀",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(CORPUS, vocab_size=400)


def test_tokenizer_round_trips_text_and_keeps_special_tokens_atomic(tokenizer):
    for text in TRICKY:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # BPE actually merged something: a frequent word is fewer tokens than bytes
    assert len(tokenizer.encode("Paris", add_special_tokens=False)) < len("Paris")
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"):
        ids = tokenizer.encode(f"a{special}b", add_special_tokens=False)
        assert tokenizer.convert_tokens_to_ids(special) in ids
        assert len(ids) == 3
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|pad|>"
    assert len(set(tokenizer.all_special_ids)) == 4


def test_chat_template_is_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tokenizer.decode(ids) == text
    assert tokenizer.chat_template == CHATML_TEMPLATE


def test_vocab_size_too_small_is_rejected():
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_bpe_tokenizer(CORPUS, vocab_size=100)


def test_tiny_model_size_and_seed(tokenizer):
    a = build_tiny_model(tokenizer, seed=0)
    b = build_tiny_model(tokenizer, seed=0)
    c = build_tiny_model(tokenizer, seed=1)
    n = a.num_parameters()
    assert 500_000 < n < 10_000_000, n
    assert a.config.vocab_size == len(tokenizer)
    assert a.config.num_key_value_heads == 2  # GQA by default
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()  # tied
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(
        sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"]
    )
    bigger = build_tiny_model(tokenizer, hidden=192, layers=6, heads=6, kv_heads=3)
    assert bigger.num_parameters() > n


def test_save_and_load_round_trip(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, seed=3)
    save_tiny(model, tokenizer, tmp_path / "tiny")
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    loaded = load_model(tmp_path / "tiny")
    tok = load_tokenizer(tmp_path / "tiny")
    for text in TRICKY:
        assert tok.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n"
    )
    ids = torch.tensor([tokenizer.encode(TRICKY[0])])
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-6)
    assert tok.eos_token_id == tokenizer.eos_token_id and tok.pad_token_id == tokenizer.pad_token_id


def test_missing_model_offline_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache, whatever this machine holds
    with pytest.raises(ConfigError) as info:
        load_model("asearch-test-org/no-such-model")
    msg = str(info.value)
    assert "no-such-model" in msg and "HF_HUB_OFFLINE" in msg
    assert "save_tiny" in msg and "smollm2-135m-instruct" in msg
    with pytest.raises(ConfigError, match="tokenizer 'asearch-test-org/no-such-model'"):
        load_tokenizer("asearch-test-org/no-such-model")
    with pytest.raises(ConfigError, match="directory without a saved model"):
        load_model(tmp_path)


def test_word_tokenizer_gives_each_seen_word_one_token_round_trips_and_reloads(tmp_path):
    from asearch.models.tiny import UNK, train_word_tokenizer

    texts = ["Question: Who employs Kota Kaitynd?\n<search> Kota Kaitynd</search>", "[Doc 1] Kota Kaitynd : person ; birth year 1924 .\n"]
    tok = train_word_tokenizer(texts * 3)
    seen = "Question: Who employs Kota Kaitynd?\n<search> Kota Kaitynd</search>\n[Doc 1] Kota Kaitynd : person ; birth year 1924 .\n"
    ids = tok.encode(seen, add_special_tokens=False)
    assert tok.decode(ids) == seen  # exact: each piece keeps the space before it
    assert tok.convert_ids_to_tokens(tok.encode(" Kaitynd 1924", add_special_tokens=False)) == ["ĠKaitynd", "Ġ1924"]
    assert UNK not in tok.convert_ids_to_tokens(ids)
    assert tok.decode(tok.encode(" Kota Zork", add_special_tokens=False)) == f" Kota{UNK}"  # unseen word -> unk
    ids = tok.encode("a<|im_end|>", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids and tok.eos_token == "<|im_end|>"

    model = build_tiny_model(tok, hidden=32, layers=1, heads=2)
    save_tiny(model, tok, tmp_path / "m")
    again = load_tokenizer(tmp_path / "m")  # not rebuilt as Qwen2's BPE class
    assert again.encode(seen, add_special_tokens=False) == tok.encode(seen, add_special_tokens=False)
    assert again.decode(again.encode(seen, add_special_tokens=False)) == seen
    assert again.unk_token == UNK and again.pad_token_id == tok.pad_token_id
