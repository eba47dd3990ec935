"""A torch.distributed group of its own, between a trainer and its rollout servers, for weight broadcasts.

Torch only: vLLM's worker imports this file too (with vLLM's torch, nothing of asearch), and asearch
imports it as `asearch.engine.vllm_ext.asearch_weight_group`.

The group is never the default process group (trainer ranks already use that one for FSDP): it is a
`ProcessGroupGloo` (CPU) or `ProcessGroupNCCL` (CUDA) built on a TCPStore that the trainer's rank 0
hosts, under a `PrefixStore` named after the group. Building it blocks until every member has joined,
so the trainer builds its end while the servers' HTTP handlers build theirs (each in a thread).
Members: rank 0 is the trainer, a server with tensor-parallel size tp takes ranks
rank_offset .. rank_offset + tp - 1. Each tensor of an update is one broadcast from rank 0, in the order
the update's metadata lists it (SGLang's `update_weights_from_distributed` does the same).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


def parse_dtype(name: str) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16 (metadata names dtypes as strings)."""
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class WeightGroup:
    """This process's end of a weight-broadcast group."""

    name: str
    rank: int
    world_size: int
    backend: str
    process_group: Any
    store: Any  # kept alive as long as the group: the group's members talk through it

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0 sends `tensor`; every other member receives into its `tensor` (same shape and dtype)."""
        self.start_broadcast(tensor).wait()

    def start_broadcast(self, tensor: torch.Tensor) -> Any:
        """`broadcast` without waiting: returns the work to `wait()` on (keep `tensor` alive until then)."""
        return self.process_group.broadcast(tensor, 0)

    def close(self) -> None:
        """Leave the group (the process group before its store: the other order aborts the process)."""
        group, self.process_group = self.process_group, None
        if group is not None and hasattr(group, "shutdown"):
            group.shutdown()
        del group
        self.store = None


def host_store(host: str, *, timeout_s: float = 600.0) -> Any:
    """The rendezvous store rank 0 hosts, listening from now on a port the OS picks (`store.port`)."""
    return dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def open_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    group_name: str,
    backend: str = "gloo",
    timeout_s: float = 600.0,
    store: Any = None,
) -> WeightGroup:
    """Join the group `group_name` as `rank` (rank 0 passes the store it hosts); returns once all have joined."""
    if backend not in BACKENDS:
        raise ValueError(f"weight group backend {backend!r}: one of {', '.join(BACKENDS)}")
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_address, int(master_port), is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(f"asearch-weights/{group_name}", store)
    if backend == "gloo":
        group: Any = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)  # torch's stubs: no broadcast
    else:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    # A first broadcast on every member: the group is formed for all of them when this returns.
    probe = torch.zeros(1, device="cuda" if backend == "nccl" else "cpu")
    group.broadcast(probe, 0).wait()
    return WeightGroup(group_name, rank, world_size, backend, group, store)


def receive_tensors(
    group: WeightGroup,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    device: Any,
) -> list[tuple[str, torch.Tensor]]:
    """Receive one update's tensors (one broadcast each, in the order listed) into new tensors on `device` (on
    the CPU for a gloo group: the loader moves them)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes and {len(shapes)} shapes differ")
    device = "cpu" if group.backend == "gloo" else device
    out, works = [], []
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        tensor = torch.empty(tuple(int(s) for s in shape), dtype=parse_dtype(dtype), device=device)
        works.append(group.start_broadcast(tensor))  # all posted at once: no round trip between tensors
        out.append((name, tensor))
    for work in works:
        work.wait()
    return out
