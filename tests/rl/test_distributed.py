"""FSDP2 data-parallel trainer on 2 CPU processes (gloo) equals the single-process PolicyTrainer.

The test launches this file twice as a script, with torchrun's environment variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and compares what rank 0 writes with `PolicyTrainer` run here.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from asearch.rl.loss import LossConfig
from asearch.rl.trainer import OptimConfig, PolicyTrainer, Sample, TrainerConfig, sequence_logprobs

WORLD = 2
# Two minibatches (two optimizer steps per train step), micro-batches that differ in number between
# the ranks (the rank with fewer runs zero-loss stand-ins), clipping that engages, warmup + cosine, decay,
# and the KL penalty (its sharded reference policy).
CFG = TrainerConfig(
    n_minibatches=2,
    token_budget=64,
    optim=OptimConfig(lr=1e-3, weight_decay=0.1, grad_clip=0.05, warmup_steps=1, schedule="cosine"),
    loss=LossConfig(kl_coef=0.5),
)
TOTAL_STEPS = 4
LENGTHS = [30, 60, 28, 45, 26, 20, 24]  # 7 samples; with budget 64 the ranks get unequal micro-batch counts


def _samples(model, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        out.append(Sample(ids, mask, [0.0] * n, [0] * n, advantage=[1.0, -0.5, 0.3, -1.0, 0.8, -0.2, 0.6][i]))
    with torch.no_grad():  # behaviour = current policy, perturbed: off-policy weights away from 1
        for s in out:
            lp = sequence_logprobs(model, [s], temperature=1.0)[0]
            noise = torch.randn(len(lp), generator=g) * 0.1
            s.behav_logprobs = [
                v + e if m else 0.0 for v, e, m in zip(lp.tolist(), noise.tolist(), s.loss_mask, strict=True)
            ]
    return out


# ---------------------------------------------------------------------- the worker (a rank)


def _worker(tmp: Path) -> None:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from asearch.models.loading import empty_model
    from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed

    env = init_distributed()
    samples = [Sample(**d) for d in json.loads((tmp / "samples.json").read_text())]

    def fresh() -> DistributedPolicyTrainer:  # rank 1 builds on the meta device and receives rank 0's weights
        model = AutoModelForCausalLM.from_pretrained(tmp / "model", dtype=torch.float32) if env.is_main else empty_model(tmp / "model")
        return DistributedPolicyTrainer(model, CFG, env=env, total_steps=TOTAL_STEPS)

    trainer = fresh()
    noops = 0
    inner = trainer._micro_batches

    def counting(samples_, idx):
        nonlocal noops
        batches = inner(samples_, idx)
        noops += sum(not b for b in batches)
        return batches

    trainer._micro_batches = counting
    out: dict = {"steps": []}
    for step in range(2):
        stats = trainer.train_step(samples, policy_version=step)
        grads = {n: p.grad.full_tensor() for n, p in trainer.model.named_parameters() if p.grad is not None}
        out["steps"].append({"stats": stats, "grads": grads, "params": trainer.full_state_dict()})
        if step == 0:
            ckpt = trainer.state_dict()
            (tmp / "sharded").mkdir(exist_ok=True)
            trainer.save_checkpoint(tmp / "sharded")  # each rank its shard
            out["digest_saved"] = trainer.weights_digest()  # a collective: each rank sums its shards
    trainer.save_hf(tmp / "saved")
    # a checkpoint taken after step 1, loaded into a fresh trainer, gives the same step 2
    resumed = fresh()
    resumed.load_state_dict(ckpt)
    resumed.train_step(samples, policy_version=1)
    out["resumed_params"] = resumed.full_state_dict()
    from_shards = fresh()
    from_shards.load_checkpoint(tmp / "sharded")
    out["digest_loaded"] = from_shards.weights_digest()
    from_shards.train_step(samples, policy_version=1)
    out["sharded_resumed_params"] = from_shards.full_state_dict()
    out["shard_files"] = sorted(p.name for p in (tmp / "sharded" / "shards").iterdir())
    out["noops"] = trainer._all_sum([float(noops)])[0]
    if env.is_main:
        torch.save(out, tmp / "dist.pt")
    torch.distributed.barrier()  # both ranks tear down together: one left alone in teardown can abort at exit
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_policy):
    from asearch.models.tiny import save_tiny

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("dist")
    tok, model = tiny_policy  # tied embeddings
    save_tiny(model, tok, tmp / "model")
    samples = _samples(model, len(tok))
    (tmp / "samples.json").write_text(json.dumps([s.__dict__ for s in samples]))
    return tmp, model, samples


def test_two_ranks_equal_one_process(setup, run_ranks) -> None:
    tmp, model, samples = setup
    took = run_ranks(Path(__file__), tmp, WORLD)
    dist_out = torch.load(tmp / "dist.pt", weights_only=False)
    print(
        f"\n[dist] 2 gloo ranks: {took:.1f}s (process start included); {dist_out['noops']:.0f} stand-in micro-batches"
    )
    assert dist_out["noops"] > 0  # the uneven-shard path ran

    ref = PolicyTrainer(copy.deepcopy(model), CFG, total_steps=TOTAL_STEPS)
    worst = {"grad": 0.0, "param": 0.0}
    for step in range(2):
        stats = ref.train_step(samples, policy_version=step)
        if step == 0:  # the digest of the sharded weights is the whole model's, and the loaded shards have it
            assert dist_out["digest_saved"] == pytest.approx(ref.weights_digest(), rel=1e-4)
            assert dist_out["digest_loaded"] == pytest.approx(dist_out["digest_saved"], rel=1e-12)
        got = dist_out["steps"][step]
        assert stats["perf/grad_norm"] > CFG.optim.grad_clip  # clipping engaged
        assert got["stats"]["perf/grad_norm"] == pytest.approx(stats["perf/grad_norm"], rel=1e-5)
        assert got["stats"]["perf/lr"] == pytest.approx(stats["perf/lr"], rel=1e-9)
        assert got["stats"]["perf/train_samples"] == len(samples)
        assert got["stats"]["loss/kl"] > 0  # after the step's first update the policy has left its reference
        names = {n for n, p in ref.model.named_parameters() if p.grad is not None}
        assert names == set(got["grads"])
        for n, p in ref.model.named_parameters():
            worst["grad"] = max(worst["grad"], (got["grads"][n] - p.grad).abs().max().item())
            torch.testing.assert_close(
                got["grads"][n], p.grad, atol=1e-5, rtol=1e-4, msg=f"grad {n} step {step + 1}"
            )
        state = ref.model.state_dict()
        for n, v in got["params"].items():
            worst["param"] = max(worst["param"], (v - state[n]).abs().max().item())
            torch.testing.assert_close(v, state[n], atol=1e-5, rtol=0, msg=f"param {n} step {step + 1}")
    print(f"[dist] largest difference to one process: grad {worst['grad']:.1e}, weight {worst['param']:.1e}")
    assert (
        max((dist_out["steps"][1]["params"][n] - v).abs().max().item() for n, v in model.state_dict().items())
        > 1e-4
    )

    final = ref.model.state_dict()
    for n, v in dist_out["resumed_params"].items():
        torch.testing.assert_close(v, final[n], atol=1e-5, rtol=0, msg=f"resumed {n}")
    # the sharded checkpoint (each rank wrote its own part) resumes to the same step 2
    assert any(f.endswith(".distcp") for f in dist_out["shard_files"]), dist_out["shard_files"]
    for n, v in dist_out["sharded_resumed_params"].items():
        torch.testing.assert_close(v, final[n], atol=1e-5, rtol=0, msg=f"resumed from shards {n}")

    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp / "saved", dtype=torch.float32)
    assert saved.config.architectures == ["Qwen2ForCausalLM"]
    for n, v in saved.state_dict().items():
        torch.testing.assert_close(v, final[n], atol=1e-5, rtol=0, msg=f"saved {n}")


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
