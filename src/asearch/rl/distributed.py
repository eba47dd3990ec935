"""Data-parallel policy training with FSDP2: the same PPO step as `PolicyTrainer`, over N processes.

    torchrun --nproc-per-node N -m asearch.rl.distributed --model DIR --steps 3 --out OUT

Every process gets the same batch of samples (rank 0's, via `broadcast_samples`). Each minibatch is
split across ranks by token count; a rank computes the decoupled PPO loss of its share, normalised by
the loss-mask tokens of the *whole* minibatch (all-reduced), and FSDP sums (not averages) the gradients,
so the update equals the single-process one. Parameters, gradients and AdamW state are sharded
(`torch.distributed.fsdp.fully_shard` on every decoder layer, then the root); on GPU the forward and
backward run in bf16 with fp32 master weights and fp32 gradient reduction.

`PolicyTrainer.train_step` is the one PPO step; this module overrides its hooks: which samples a rank
computes (`_shard`), equal micro-batch counts on every rank (`_micro_batches`: a rank out of samples
runs a zero-loss stand-in, because every forward and backward joins collectives), sums over ranks
(`_all_sum`) and the global grad norm of sharded gradients (`_clip_grad_norm`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from asearch.errors import ConfigError
from asearch.net import free_port
from asearch.rl.trainer import (
    TRAINER_STATE_FILE,
    PolicyTrainer,
    Sample,
    TrainerConfig,
    enable_activation_checkpointing,
    frozen_copy,
    write_hf_dir,
)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(
    backend: str | None = None, store: dist.Store | None = None, timeout_s: float | None = None
) -> DistEnv:
    """Join (or create) the default process group from torchrun's environment variables.

    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; without them, a group of one process on a
    free local port. `store`: the rendezvous store (rank 0's, listening since its port was chosen, or a client
    of it), used instead of MASTER_ADDR/MASTER_PORT; every rank must pass one or none. Backend: NCCL when CUDA is
    available (one GPU per process, cuda:LOCAL_RANK; a process that sees a single GPU, as a Ray actor with its own
    CUDA_VISIBLE_DEVICES does, uses cuda:0), else gloo on CPU. `timeout_s`: how long a collective may wait for
    its peers before it fails (torch's default when None).
    """
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if world_size == 1 and store is None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing and store is None:
        raise RuntimeError(f"WORLD_SIZE={world_size} but {', '.join(missing)} unset: launch with torchrun")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        index = 0 if torch.cuda.device_count() == 1 else local_rank
        if index >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but this process sees {torch.cuda.device_count()} GPU(s) "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")  # fmt: skip
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        rendezvous: dict[str, Any] = {"store": store} if store is not None else {"init_method": "env://"}
        if timeout_s is not None:
            rendezvous["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world_size, **rendezvous)
    return DistEnv(rank, world_size, local_rank, device)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM (its `_no_split_modules` classes)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__}: no decoder layers found (_no_split_modules={names or None})"
        )
    return layers


def shard_model(
    model: torch.nn.Module, env: DistEnv, *, bf16: bool | None = None, mesh_shape: tuple[int, int] | None = None
) -> torch.nn.Module:
    """FSDP2 in place: each decoder layer is one unit, the root (embeddings, final norm, LM head) another.

    Rank 0's weights are the model's on every rank: the others may build it on the meta device (`empty_model`)
    and receive them here, so no rank but 0 ever holds a full copy. `mesh_shape` (replicate, shard): HSDP,
    parameters sharded over the ranks of a row (a node) and replicated across rows; None: sharded over all.

    `bf16` (default: on GPU) computes in bfloat16 and reduces gradients in float32; the parameters the
    optimizer updates stay float32. Gradients are summed over ranks, not averaged: the PPO loss is
    already normalised by the global token count.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    bf16 = env.device.type == "cuda" if bf16 is None else bf16
    mesh = _mesh(env, mesh_shape)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kwargs: dict[str, Any] = {"mesh": mesh} | ({"mp_policy": mp} if mp else {})
    full = model.state_dict() if env.is_main else {}  # references to rank 0's weights: broadcast after sharding
    on_meta = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    if not on_meta:
        model.to(env.device)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    _weights_from_rank0(model, full, env, on_meta)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has neither AVG nor PREMUL_SUM
    return model


def _mesh(env: DistEnv, mesh_shape: tuple[int, int] | None) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if mesh_shape is None:
        return init_device_mesh(env.device.type, (env.world_size,))
    if mesh_shape[0] * mesh_shape[1] != env.world_size:
        raise ValueError(f"mesh {mesh_shape} does not cover the {env.world_size} ranks")
    return init_device_mesh(env.device.type, tuple(mesh_shape), mesh_dim_names=("replicate", "shard"))


def _weights_from_rank0(model: torch.nn.Module, full: dict[str, torch.Tensor], env: DistEnv, on_meta: bool) -> None:
    """Every rank's shards from rank 0's full state dict (the others pass {}), and every buffer from rank 0's:
    non-persistent ones (rotary frequencies) are in no state dict and are garbage after `to_empty`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if on_meta:
        model.to_empty(device=env.device)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=opts)  # type: ignore[arg-type]  # torch: an invariant dict of its value union
    for buf in model.buffers():
        dist.broadcast(buf.data, src=0)


class DistributedPolicyTrainer(PolicyTrainer):
    """`PolicyTrainer` over every process of the default group; construct it on every rank (after
    `init_distributed`) and call every method on every rank with the same arguments."""

    def __init__(
        self,
        model: Any,
        cfg: TrainerConfig,
        *,
        env: DistEnv | None = None,
        bf16: bool | None = None,
        temperature: float = 1.0,
        total_steps: int = 1,
        mesh_shape: tuple[int, int] | None = None,
    ):
        if cfg.lora.enabled:
            raise ConfigError("trainer.lora with FSDP trainer ranks is not supported: train LoRA in one process (launcher none or local)")
        self.env = env or init_distributed()
        self.mesh_shape = mesh_shape
        if bf16 is None and cfg.param_dtype == "bfloat16":  # float32 shards (the master copy), gathered in bf16
            bf16 = True
        reference = shard_model(frozen_copy(model), self.env, bf16=bf16, mesh_shape=mesh_shape) if cfg.loss.kl_coef > 0 else None
        if cfg.checkpointing_on(self.env.device):
            enable_activation_checkpointing(model)  # before sharding, so FSDP wraps the checkpointed layers
        shard_model(model, self.env, bf16=bf16, mesh_shape=mesh_shape)
        super().__init__(model, cfg, temperature=temperature, total_steps=total_steps, reference=reference)

    # ---- the PolicyTrainer hooks

    def _shard(self, samples: Sequence[Sample], idx: list[int]) -> list[int]:
        """Longest first, each sample to the rank with the fewest tokens so far (same answer on every rank)."""
        load = [0] * self.env.world_size
        mine = set()
        for i in sorted(idx, key=lambda i: (-len(samples[i].token_ids), i)):
            r = min(range(len(load)), key=lambda r: (load[r], r))
            load[r] += len(samples[i].token_ids)
            if r == self.env.rank:
                mine.add(i)
        return [i for i in idx if i in mine]

    def _micro_batches(self, samples: Sequence[Sample], idx: list[int]) -> list[list[int]]:
        batches = super()._micro_batches(samples, idx)
        n = torch.tensor([len(batches)], dtype=torch.int64, device=self._comm_device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return batches + [[] for _ in range(int(n.item()) - len(batches))]

    def _all_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t)
        return t.tolist()

    @torch.no_grad()
    def _clip_grad_norm(self) -> float:
        """The norm of the whole gradient from the squared norms of every rank's disjoint shards (HSDP: of the
        ranks of one mesh row; the rows hold copies)."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        sq = torch.zeros((), dtype=torch.float64, device=self.env.device)
        for g in local:
            sq += g.double().pow(2).sum()
        dist.all_reduce(sq, group=self._shard_group(grads))
        norm = sq.sqrt()
        coef = (self.cfg.optim.grad_clip / (norm + 1e-6)).clamp(max=1.0)
        for g in local:
            g.mul_(coef.to(g.dtype))
        return float(norm)

    def _shard_group(self, grads: list[Any]) -> Any:
        """The process group of this rank's mesh row under HSDP; None (every rank) under a 1-D mesh."""
        if self.mesh_shape is None or not grads:
            return None
        return grads[0].device_mesh.get_group("shard")

    def _world_size(self) -> int:
        return self.env.world_size

    @property
    def _comm_device(self) -> torch.device:
        return self.env.device  # gloo: CPU tensors; NCCL: CUDA tensors

    # ---- weights and checkpoints (collective: call on every rank)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded model state dict on CPU, on rank 0 ({} elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=opts))

    def save_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None, dtype: str | None = None) -> Path:
        """Rank 0 writes the full model as a Hugging Face directory (tensors in `dtype` if given); every rank
        returns once it is there."""
        state = self.full_state_dict()
        if self.env.is_main:
            write_hf_dir(self.model, directory, tokenizer=tokenizer, state_dict=state, dtype=dtype)
        dist.barrier()
        return Path(directory)

    def state_dict(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state on rank 0, independent of the world size."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=opts)
        _clone_scalars(cast(dict[str, Any], optim_sd).get("state", {}))  # the live 'step' counters otherwise
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "rng": self.rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """`state` from `state_dict()` (on rank 0; other ranks may pass the same or the scalars only)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
        main = self.env.is_main
        # two calls: set_state_dict takes an empty model dict (the other ranks') for "optimizer only"
        set_model_state_dict(self.model, state["model"] if main else {}, options=opts)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"] if main else {}, options=opts)
        _clone_scalars(self.optimizer.state)  # rank 0 got the caller's 'step' tensors, not copies
        self._load_scalars(state)

    def _load_scalars(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.rng.setstate(state["rng"])

    def save_checkpoint(self, directory: Path) -> None:
        """Each rank writes its own shard of the model and optimizer (torch.distributed.checkpoint) into
        `directory/shards`, rank 0 the scheduler, step and rng; no process holds the whole state. Every rank
        must see `directory` (one machine, or a shared filesystem)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=Path(directory) / SHARDS_DIR)
        if self.env.is_main:
            scalars = {"scheduler": self.scheduler.state_dict(), "step": self.step, "rng": self.rng.getstate()}
            torch.save(scalars, Path(directory) / SCALARS_FILE)
        dist.barrier()

    def load_checkpoint(self, directory: Path) -> None:
        """What `save_checkpoint` wrote, resharded to this world size by torch.distributed.checkpoint; or a
        whole-state `trainer.pt` (a one-process trainer's, or a checkpoint from before sharding), read by rank 0."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        directory = Path(directory)
        if not (directory / SHARDS_DIR).is_dir():
            whole = directory / TRAINER_STATE_FILE
            if self.env.is_main:
                self.load_state_dict(torch.load(whole, map_location="cpu", weights_only=False))
            else:
                self.load_state_dict(_scalars_from(whole))
            return
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=directory / SHARDS_DIR)
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        self._load_scalars(torch.load(directory / SCALARS_FILE, map_location="cpu", weights_only=False))


# A sharded checkpoint: the ranks' shards (torch.distributed.checkpoint) and rank 0's scalar state beside them.
SHARDS_DIR = "shards"
SCALARS_FILE = "trainer_scalars.pt"


def _scalars_from(whole: Path) -> dict[str, Any]:
    """The scheduler, step and rng of a whole-state file (a rank other than 0 needs only these)."""
    state = torch.load(whole, map_location="cpu", weights_only=False, mmap=True)  # the tensors stay on disk
    return {"model": {}, "optimizer": {}} | {k: state[k] for k in ("scheduler", "step", "rng")}


def _clone_scalars(optim_state: dict) -> None:
    for st in optim_state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() == 0:
                st[k] = v.clone()


def broadcast_samples(samples: Sequence[Sample] | None, env: DistEnv, src: int = 0) -> list[Sample]:
    """Rank `src`'s batch on every rank (the others pass None)."""
    box: list[Any] = [list(samples or ()) if env.rank == src else None]
    dist.broadcast_object_list(box, src=src, device=env.device if env.device.type == "cuda" else None)
    return box[0]


# ---------------------------------------------------------------------------- launcher smoke run


def _random_samples(vocab: int, n: int, longest: int, seed: int) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(longest // 4, longest + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        mask = [0] * (length // 4) + [1] * (length - length // 4)
        behav = (-torch.rand(length, generator=g) * 5).tolist()
        out.append(Sample(ids, mask, behav, [0] * length, advantage=1.0 if i % 2 else -1.0))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Train a model on random samples for a few steps on every rank; print timings; save the result."""
    ap = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m asearch.rl.distributed")
    ap.add_argument("--model", required=True, help="HF directory or name (see asearch.models.loading)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--samples", type=int, default=16, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="longest sequence")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="default: on GPU")
    ap.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None, help="default: on GPU")
    ap.add_argument("--out", help="write the trained model here (HF directory)")
    args = ap.parse_args(argv)

    from asearch.models.loading import load_model, load_tokenizer

    env = init_distributed()
    torch.manual_seed(0)
    model = load_model(args.model)
    tokenizer = load_tokenizer(args.model)
    cfg = TrainerConfig(token_budget=args.token_budget, activation_checkpointing="auto" if args.activation_checkpointing is None else args.activation_checkpointing)
    trainer = DistributedPolicyTrainer(model, cfg, env=env, bf16=args.bf16, total_steps=args.steps)
    batch = _random_samples(model.config.vocab_size, args.samples, args.seq_len, 0) if env.is_main else None
    samples = broadcast_samples(batch, env)
    for step in range(args.steps):
        t0 = time.perf_counter()
        stats = trainer.train_step(samples, policy_version=step)
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if env.is_main:
            print(
                f"step {step}: {took:.2f}s  {stats['perf/train_tokens'] / took:,.0f} tokens/s  "
                f"loss {stats['loss/policy']:+.4f}  grad_norm {stats['perf/grad_norm']:.3f}  "
                f"world {env.world_size}  {env.device.type}",
                flush=True,
            )
    if args.out:
        trainer.save_hf(args.out, tokenizer)
        if env.is_main:
            print(f"saved {args.out}")
    dist.barrier()  # both ranks tear down together: one left alone in teardown can abort at exit
    dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover - exercised through torchrun
    main()
