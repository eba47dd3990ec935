"""Collective weight sync from FSDP ranks: 2 gloo ranks (this file run twice as a script, with torchrun's
environment variables) train a step, then rank 0 broadcasts the sharded policy, gathered one parameter at a
time, to a real `asearch engine serve` process over a weight group of their own (not the ranks' default
group). The server then samples from exactly the trainer's weights."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server  # an engine server and rank processes

PROMPT = [11, 42, 97, 150, 23, 64]
ATOL = 2e-4  # the disk path's tolerance (tests/engine/test_engine_server.py)


def bf16_exact(model) -> None:
    """Weights rounded to bfloat16 values (each rank its shard): bfloat16 on the wire then loses nothing."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def _samples():
    from asearch.rl.trainer import Sample

    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate([20, 26, 18, 30]):
        ids = torch.randint(5, 200, (n,), generator=g).tolist()
        out.append(Sample(ids, [0] * 4 + [1] * (n - 4), [-3.0] * n, [0] * n, advantage=1.0 if i % 2 else -1.0))
    return out


def _rank(tmp: Path) -> None:
    """One FSDP rank: train a step, round, push (rank 0 drives the servers), save the gathered weights."""
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from asearch.engine.remote.pool import EnginePool
    from asearch.engine.remote.sglang import SGLangEngine
    from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed
    from asearch.rl.trainer import OptimConfig, TrainerConfig
    from asearch.rl.weights import CollectiveWeights, DiskWeights

    env = init_distributed()
    model = AutoModelForCausalLM.from_pretrained(tmp / "v1", dtype=torch.float32)
    trainer = DistributedPolicyTrainer(model, TrainerConfig(optim=OptimConfig(lr=1e-2)), env=env, temperature=1.0)
    stats = trainer.train_step(_samples(), policy_version=0)
    bf16_exact(trainer.model)
    if env.is_main:
        url = (tmp / "url").read_text()

        async def push() -> dict:
            pool = EnginePool([SGLangEngine(url)], names=[url])
            weights = CollectiveWeights(pool, trainer, DiskWeights(pool, trainer, None, tmp / "weights", keep=2), [url], bucket_mb=0.05)
            try:
                await weights.push(1)
                return weights.metrics()
            finally:
                await weights.close()
                await pool.close()

        metrics = asyncio.run(push())
    else:
        for _ in range(1):  # one push: rank 1 takes part in each parameter's gather
            trainer.broadcast_weights("bfloat16")
    state = trainer.full_state_dict()  # collective: rank 0 gets the whole policy
    if env.is_main:
        torch.save(state, tmp / "pushed.pt")
        (tmp / "result.json").write_text(json.dumps({"metrics": metrics, "grad_norm": stats["perf/grad_norm"]}))
    trainer.leave_weight_group()
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two rank processes and a server: about a minute on 2 cores
@pytest.mark.timeout(300)
def test_fsdp_ranks_broadcast_to_a_server(tmp_path: Path) -> None:
    from asearch.engine.remote.sglang import SGLangEngine
    from asearch.engine.server.app import launch_engine_server
    from asearch.engine.types import GenerateRequest, SamplingParams
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer
    from asearch.net import free_port

    torch.set_num_threads(1)
    tok = train_bpe_tokenizer([f"the bridge of city {i} is near the river" for i in range(60)], vocab_size=300)
    models = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model = build_tiny_model(tok, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # peaked, seed-specific distributions
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        models[name] = model.eval()
        save_tiny(model, tok, tmp_path / name)
    sup, url = launch_engine_server(tmp_path / "v0", log_path=tmp_path / "server.log", threads=1, max_seq_len=512, weight_version="0")
    try:
        (tmp_path / "url").write_text(url)
        port = str(free_port())
        ranks = [
            subprocess.Popen(
                [sys.executable, __file__, str(tmp_path)],
                env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": port, "OMP_NUM_THREADS": "1"},  # fmt: skip
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=240)[0] for p in ranks]
        assert all(p.returncode == 0 for p in ranks), "\n".join(outs)[-4000:]

        async def served():
            eng = SGLangEngine(url)
            try:
                req = GenerateRequest(input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=16, temperature=0.0))
                return await eng.generate(req)
            finally:
                await eng.close()

        resp = asyncio.run(served())
    finally:
        sup.stop()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["grad_norm"] > 0 and result["metrics"]["weights/collective"] == 1.0
    assert not (tmp_path / "weights").exists()
    policy = models["v1"]
    policy.load_state_dict(torch.load(tmp_path / "pushed.pt"))
    with torch.no_grad():
        logits = policy(torch.tensor([PROMPT + resp.output_ids])).logits[0, len(PROMPT) - 1 : -1].float()
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(resp.output_ids)[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(resp.output_logprobs, ref, strict=True)) <= ATOL
    assert resp.output_versions == [1] * 16


if __name__ == "__main__":
    _rank(Path(sys.argv[1]))
