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
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")
RECEIVE_WINDOW = 8  # broadcasts a callback receive posts ahead, and so the buffers of one shape worth keeping


def parse_dtype(name: str) -> torch.dtype:
    """'bfloat16' or 'torch.bfloat16' -> torch.bfloat16 (metadata names dtypes as strings)."""
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class WeightGroupError(RuntimeError):
    """A broadcast that was aborted, or made no progress for the group's `op_timeout_s`."""


# Groups left while a broadcast was pending: shutting one down would wait for that broadcast (up to the
# process group's own timeout), so they are kept here until their pending work ends on its own.
_ABANDONED: list[Any] = []


@dataclass
class WeightGroup:
    """This process's end of a weight-broadcast group."""

    name: str
    rank: int
    world_size: int
    backend: str
    process_group: Any
    store: Any  # kept alive as long as the group: the group's members talk through it
    op_timeout_s: float = 600.0  # the longest `wait` lets a broadcast go without any finishing
    max_spare: int = RECEIVE_WINDOW  # buffers of one shape kept for reuse
    _aborted: threading.Event = field(default_factory=threading.Event, repr=False)
    _pending: list[Any] = field(default_factory=list, repr=False)
    _store_checked: float = 0.0
    _spare: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def buffer(self, shape: Sequence[int], dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
        """An uninitialised tensor to broadcast from or into: on the CPU one that `recycle` gave back where
        there is one (a new one costs a page fault per 4 KiB, as much as the broadcast's own copy)."""
        shape = tuple(int(s) for s in shape)
        spare = self._spare.get((shape, dtype)) if torch.device(device).type == "cpu" else None
        return spare.pop() if spare else torch.empty(shape, dtype=dtype, device=device)

    def recycle(self, tensor: torch.Tensor) -> None:
        """Give back a `buffer` whose broadcast is over and whose contents nobody reads any more. CPU only (the
        CUDA caching allocator reuses memory by itself); kept until the group closes, `max_spare` a shape."""
        if tensor.device.type != "cpu":
            return
        spare = self._spare.setdefault((tuple(tensor.shape), tensor.dtype), [])
        if len(spare) < self.max_spare:
            spare.append(tensor)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0 sends `tensor`; every other member receives into its `tensor` (same shape and dtype)."""
        self.wait([self.start_broadcast(tensor)])

    def start_broadcast(self, tensor: torch.Tensor) -> Any:
        """`broadcast` without waiting: returns the work to `wait()` on (keep `tensor` alive until then)."""
        if self._aborted.is_set() or self.process_group is None:
            raise WeightGroupError(f"weight group {self.name} was aborted")
        work = self.process_group.broadcast(tensor, 0)
        self._pending.append(work)
        return work

    def wait(self, works: Sequence[Any]) -> None:
        """Wait for `works` in order; raises WeightGroupError once the group is aborted (`abort`, from another
        thread) or `op_timeout_s` pass without one finishing. A member that died fails its peers' broadcasts at
        once, but a member that receives through it would otherwise wait out the process group's timeout."""
        last_progress = time.monotonic()
        for work in works:
            while not work.is_completed():
                if self._aborted.is_set() or self._abort_signalled():
                    raise WeightGroupError(f"weight group {self.name} was aborted")
                if time.monotonic() - last_progress > self.op_timeout_s:
                    raise WeightGroupError(
                        f"weight group {self.name}: no broadcast finished in {self.op_timeout_s:.0f}s"
                    )
                time.sleep(0.001)
            work.wait()  # raises the broadcast's own error (a peer's connection reset)
            last_progress = time.monotonic()
        self._pending = [w for w in self._pending if not w.is_completed()]

    def abort(self) -> None:
        """Make every `wait` on this group, now or later, raise (thread-safe), in this process and, through the
        group's store, in every member's; `close` still has to follow."""
        self._aborted.set()
        try:
            self.store.set(abort_key(self.name), "1")
        except Exception:  # noqa: BLE001 - the store's host is gone: so is the group
            pass

    def _abort_signalled(self) -> bool:
        """Whether some member or the trainer's driver set the group's abort key (asked every 20 ms at most: a
        round trip to rank 0's store); an unreachable store counts as an abort."""
        now = time.monotonic()
        if now - self._store_checked < 0.02 or self.store is None:
            return False
        self._store_checked = now
        try:
            return bool(self.store.check([abort_key(self.name)]))
        except Exception:  # noqa: BLE001
            return True

    def close(self) -> None:
        """Leave the group (the process group before its store: the other order aborts the process). With a
        broadcast still pending the group is abandoned instead, as shutting it down would wait for it."""
        group, self.process_group = self.process_group, None
        self._aborted.set()
        self._spare.clear()
        if group is None:
            return
        if any(not w.is_completed() for w in self._pending):
            _ABANDONED.append((group, self.store, self._pending))
        elif hasattr(group, "shutdown"):
            group.shutdown()
        self._pending = []
        del group
        self.store = None


def abort_key(group_name: str) -> str:
    """The store key whose presence aborts the group's broadcasts in every member."""
    return f"asearch-weights/{group_name}/abort"


def signal_abort(master_address: str, master_port: int, group_name: str, *, timeout_s: float = 5.0) -> None:
    """From any process that can reach rank 0's store (the driver of a Ray run): abort every member's wait."""
    store = dist.TCPStore(
        master_address, int(master_port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
    )
    store.set(abort_key(group_name), "1")


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
    return WeightGroup(group_name, rank, world_size, backend, group, store, op_timeout_s=timeout_s)


def receive_tensors(
    group: WeightGroup,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    device: Any,
    on_tensor: Callable[[str, torch.Tensor], None] | None = None,
    *,
    window: int = RECEIVE_WINDOW,
) -> list[tuple[str, torch.Tensor]]:
    """Receive one update's tensors (one broadcast each, in the order listed) on `device` (on the CPU for a
    gloo group: the loader moves them).

    Without `on_tensor`: into new tensors, all posted at once, and returned. With it: `on_tensor(name,
    tensor)` runs on each as soon as it has arrived, while the later ones are still on the wire, and must
    copy what it keeps: the tensors arrive in buffers the group reuses, `window` posted ahead at a time
    (so a receive holds a window of buffers, not a whole bucket); nothing is returned."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes and {len(shapes)} shapes differ")
    device = "cpu" if group.backend == "gloo" else device
    specs = [(name, parse_dtype(dtype), shape) for name, dtype, shape in zip(names, dtypes, shapes, strict=True)]
    if on_tensor is None:
        out, works = [], []
        for name, dtype, shape in specs:
            tensor = torch.empty(tuple(int(s) for s in shape), dtype=dtype, device=device)
            works.append(group.start_broadcast(tensor))  # all posted at once: no round trip between tensors
            out.append((name, tensor))
        group.wait(works)
        return out
    posted: deque[tuple[Any, torch.Tensor]] = deque()

    def post(k: int) -> None:
        tensor = group.buffer(specs[k][2], specs[k][1], device)
        posted.append((group.start_broadcast(tensor), tensor))

    for k in range(min(window, len(specs))):
        post(k)
    for i, (name, _, _) in enumerate(specs):
        work, tensor = posted.popleft()
        group.wait([work])
        on_tensor(name, tensor)
        group.recycle(tensor)
        if i + window < len(specs):
            post(i + window)
    return []
