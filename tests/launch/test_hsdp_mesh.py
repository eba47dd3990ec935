"""The 2-D FSDP mesh the Ray launcher picks across nodes (HSDP: replicate 2 x shard 2, on 4 gloo ranks) takes
the same step as one process: gradients summed over every rank, the gradient norm over one row's shards (the
rows hold copies), ranks 1-3 built on the meta device with rank 0's weights."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from asearch.rl.trainer import OptimConfig, PolicyTrainer, Sample, TrainerConfig  # noqa: E402

WORLD, MESH = 4, (2, 2)
CFG = TrainerConfig(token_budget=64, optim=OptimConfig(lr=1e-3, grad_clip=1e-3))  # the random model's norm is ~2e-3
LENGTHS = [30, 22, 28, 45, 26, 20, 24, 18]


def _worker(tmp: Path) -> None:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from asearch.models.loading import empty_model
    from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed

    env = init_distributed()
    model = AutoModelForCausalLM.from_pretrained(tmp / "model", dtype=torch.float32) if env.is_main else empty_model(tmp / "model")
    trainer = DistributedPolicyTrainer(model, CFG, env=env, total_steps=2, mesh_shape=MESH)
    samples = [Sample(**d) for d in json.loads((tmp / "samples.json").read_text())]
    stats = trainer.train_step(samples, policy_version=0)
    params = trainer.full_state_dict()
    mesh = next(trainer.model.parameters()).device_mesh
    if env.is_main:
        torch.save({"stats": stats, "params": params, "mesh": tuple(mesh.shape), "names": mesh.mesh_dim_names}, tmp / "hsdp.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_hsdp_mesh_equals_one_process(tmp_path, tiny_world_model_dir, run_ranks) -> None:
    from asearch.models.loading import load_model
    model = load_model(str(tiny_world_model_dir))
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(5, model.config.vocab_size, (n,), generator=g).tolist()
        samples.append(Sample(ids, [0] * 4 + [1] * (n - 4), [-1.0] * n, [0] * n, advantage=(-1.0) ** i * 0.5))
    (tmp_path / "samples.json").write_text(json.dumps([s.__dict__ for s in samples]))
    os.symlink(tiny_world_model_dir, tmp_path / "model")

    t0 = time.monotonic()
    run_ranks(Path(__file__), tmp_path, WORLD)
    got = torch.load(tmp_path / "hsdp.pt", weights_only=False)
    print(f"\n[hsdp] 4 gloo ranks, mesh {got['mesh']} {got['names']}: {time.monotonic() - t0:.1f}s")
    assert got["mesh"] == MESH and got["names"] == ("replicate", "shard")

    torch.manual_seed(0)
    ref = PolicyTrainer(model, CFG, total_steps=2)
    stats = ref.train_step(samples, policy_version=0)
    assert stats["perf/grad_norm"] > CFG.optim.grad_clip  # clipping engaged: the norm matters
    assert got["stats"]["perf/grad_norm"] == pytest.approx(stats["perf/grad_norm"], rel=1e-5)
    start = load_model(str(tiny_world_model_dir)).state_dict()
    for name, p in ref.model.state_dict().items():
        torch.testing.assert_close(got["params"][name], p, atol=1e-5, rtol=0, msg=name)
    assert max(float((p - start[n]).abs().max()) for n, p in ref.model.state_dict().items()) > 1e-4


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
