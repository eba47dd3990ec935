"""Collective weight sync, the parts both ends share: the group a trainer and its rollout servers join, and
the update plan (which tensors, in which dtype, grouped into buckets of a set size).

    trainer rank 0                                   each rollout server (HTTP handler, in a thread)
    store = host_store(address)        ──HTTP──▶     POST /init_weights_update_group {master_address,
    open_group(..., rank=0, store)   ◀──joins──      master_port, rank_offset, world_size, group_name, backend}
    per bucket: one broadcast a tensor ──────▶       POST /update_weights_from_distributed {names, dtypes,
                                                     shapes, group_name[, weight_version on the last bucket]}

The HTTP bodies are SGLang's (`init_weights_update_group`, `update_weights_from_distributed`), which
`asearch engine serve` speaks too; vLLM gets the same through its worker extension (`collective_rpc`). The
group code itself is torch-only (`vllm_ext/asearch_weight_group.py`) so vLLM's worker runs it too.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import torch

    from asearch.engine.vllm_ext.asearch_weight_group import (
        BACKENDS,
        WeightGroup,
        WeightGroupError,
        dtype_name,
        host_store,
        open_group,
        parse_dtype,
        receive_tensors,
        signal_abort,
    )

# The torch-only group code, imported on first use: the engine clients import this module for `Bucket` and
# `GroupAddress`, and listing the engine kinds must not import torch.
_GROUP_NAMES = frozenset(
    {
        "BACKENDS", "WeightGroup", "WeightGroupError", "dtype_name", "host_store", "open_group", "parse_dtype",
        "receive_tensors", "signal_abort",
    }  # fmt: skip
)


def __getattr__(name: str) -> Any:
    if name in _GROUP_NAMES:
        from asearch.engine.vllm_ext import asearch_weight_group

        return getattr(asearch_weight_group, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BACKENDS",
    "Bucket",
    "GroupAddress",
    "WeightGroup",
    "WeightGroupError",
    "dtype_name",
    "host_store",
    "open_group",
    "parse_dtype",
    "plan_buckets",
    "reach_address",
    "receive_tensors",
    "signal_abort",
]


@dataclass
class Bucket:
    """One update message: the tensors one `update_weights_from_distributed` call receives, in order."""

    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    nbytes: int = 0

    def body(self, group_name: str) -> dict:
        return {"names": self.names, "dtypes": self.dtypes, "shapes": self.shapes, "group_name": group_name}


@dataclass(frozen=True)
class GroupAddress:
    """What a server needs to join: the trainer's rendezvous, the group's size, name and backend."""

    master_address: str
    master_port: int
    world_size: int
    group_name: str
    backend: str
    timeout_s: float = 600.0  # joining, and how long a member waits with no broadcast finishing

    def body(self, rank_offset: int) -> dict:
        return {
            "master_address": self.master_address,
            "master_port": self.master_port,
            "rank_offset": rank_offset,
            "world_size": self.world_size,
            "group_name": self.group_name,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }


def plan_buckets(
    shapes: Iterable[tuple[str, Sequence[int]]], *, bucket_bytes: int, dtype: torch.dtype | None = None
) -> list[Bucket]:
    """(name, shape) pairs, in the order they are sent, cut into buckets of at most `bucket_bytes` of `dtype`
    (default bfloat16; a tensor larger than that is a bucket of its own)."""
    import torch

    from asearch.engine.vllm_ext.asearch_weight_group import dtype_name

    dtype = dtype or torch.bfloat16
    size = torch.empty((), dtype=dtype).element_size()
    buckets: list[Bucket] = []
    current = Bucket()
    for name, shape in shapes:
        nbytes = size * int(torch.Size(shape).numel())
        if current.names and current.nbytes + nbytes > bucket_bytes:
            buckets.append(current)
            current = Bucket()
        current.names.append(name)
        current.dtypes.append(dtype_name(dtype))
        current.shapes.append([int(s) for s in shape])
        current.nbytes += nbytes
    if current.names:
        buckets.append(current)
    return buckets


def reach_address(urls: Sequence[str]) -> str:
    """The address of this machine that the servers at `urls` reach it by: 127.0.0.1 when they are on
    loopback, else the source address of a route to the first one (no packet is sent)."""
    hosts = [urlsplit(u).hostname or "127.0.0.1" for u in urls]
    if all(h in ("127.0.0.1", "localhost", "::1") for h in hosts):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((hosts[0], 9))
        return s.getsockname()[0]
