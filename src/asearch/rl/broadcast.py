"""The trainer's end of collective weight sync: rank 0 hosts a weight group's rendezvous, joins the group
with the rollout servers and broadcasts the policy to them, one tensor at a time in the order of
`weight_shapes()` (the servers receive the same list, cut into buckets, over HTTP: `asearch.engine.weight_group`).

`PolicyTrainer` (one process) and `DistributedPolicyTrainer` (FSDP ranks) get these methods from
`BroadcastsWeights`. On FSDP every rank calls `broadcast_weights`: each parameter is gathered in turn (a
collective on the default group), and rank 0 casts it and broadcasts it on the weight group, so no rank
ever holds the whole model. The other ranks host nothing and join nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from asearch.engine.weight_group import (
    GroupAddress,
    WeightGroup,
    host_store,
    open_group,
    parse_dtype,
    reach_address,
)
from asearch.models.lora import is_lora, merged_state_dict

log = logging.getLogger(__name__)


def sync_items(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of what a server loads, in a fixed order, each storage once (a tied LM head shares
    the embedding's, so only the embedding goes); LoRA: merged. FSDP: sharded tensors (DTensors)."""
    if is_lora(model):  # one process: the merged tensors are plain ones
        seen: set[int] = set()
        for name, tensor in merged_state_dict(model).items():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                yield name, tensor
        return
    # named_parameters lists a shared Parameter once, by the same name on every FSDP rank
    unique = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    for name, tensor in model.state_dict().items():
        if name in unique:
            yield name, tensor


def _is_sender() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


class BroadcastsWeights:
    """Mixed into the trainers (`self.model`); every method is called on every FSDP rank."""

    model: Any
    _weight_store: Any = None
    _weight_group: WeightGroup | None = None

    def weight_shapes(self) -> list[tuple[str, list[int]]]:
        """(name, shape) of every tensor `broadcast_weights` sends, in order (full shapes, also on FSDP)."""
        return [(name, list(t.shape)) for name, t in sync_items(self.model)]

    def weight_backend(self) -> str:
        """The weight group's backend: nccl when the policy is on a GPU, else gloo."""
        return "nccl" if next(self.model.parameters()).device.type == "cuda" else "gloo"

    def open_weight_store(
        self, server_urls: Sequence[str], timeout_s: float = 600.0
    ) -> tuple[str, int] | None:
        """Rank 0: host the weight group's rendezvous at the address the servers reach this machine by;
        returns (address, port). None on the other ranks."""
        if not _is_sender():
            return None
        self.leave_weight_group()
        host = reach_address(server_urls)
        self._weight_store = host_store(host, timeout_s=timeout_s)
        return host, int(self._weight_store.port)

    def join_weight_group(self, address: GroupAddress, timeout_s: float = 600.0) -> None:
        """Rank 0 joins as the group's rank 0; returns once every server has joined (they join meanwhile)."""
        if not _is_sender():
            return
        t0 = time.perf_counter()
        self._weight_group = open_group(
            address.master_address, address.master_port, 0, address.world_size, group_name=address.group_name,
            backend=address.backend, timeout_s=timeout_s, store=self._weight_store,
        )  # fmt: skip
        log.info(
            "weight group %s formed: %d members, %s, %s:%d, %.2fs", address.group_name, address.world_size,
            address.backend, address.master_address, address.master_port, time.perf_counter() - t0,
        )  # fmt: skip

    def broadcast_weights(self, dtype: str = "bfloat16") -> int:
        """Send the policy on the weight group in `dtype`, one broadcast a tensor in `weight_shapes()` order;
        returns the bytes sent (0 on ranks other than 0). FSDP: every rank gathers each parameter in turn, and
        goes on gathering after the group failed (the error is raised at the end): a rank that stopped half way
        would leave the others waiting in a gather."""
        sender = _is_sender()
        if sender and self._weight_group is None:
            raise RuntimeError("broadcast_weights before join_weight_group")
        wire = parse_dtype(dtype)
        sent, error = 0, None
        # (work, tensor) pairs: the next tensor is cast while one is on the wire
        in_flight: list[tuple[Any, torch.Tensor]] = []
        with torch.no_grad():
            for _, tensor in sync_items(self.model):
                # FSDP: gathering a parameter is a collective of every rank
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                if not sender or error is not None:
                    continue
                try:
                    sent += self._send(full, wire, in_flight)
                except Exception as e:  # noqa: BLE001 - raised once every rank has gathered every tensor
                    error = e
        try:
            if error is None and self._weight_group is not None:
                self._weight_group.wait([work for work, _ in in_flight])
                for _, out in in_flight:
                    self._weight_group.recycle(out)
        except Exception as e:  # noqa: BLE001
            error = e
        if error is not None:
            raise error
        return sent

    def _send(self, full: torch.Tensor, wire: torch.dtype, in_flight: list[tuple[Any, torch.Tensor]]) -> int:
        """Cast `full` into a buffer of the group's and start its broadcast, keeping at most two in flight (their
        buffers go back to the group); the bytes it puts on the wire."""
        group = self._weight_group
        assert group is not None
        out = group.buffer(full.shape, wire, "cuda" if group.backend == "nccl" else "cpu")
        out.copy_(full.detach())
        in_flight.append((group.start_broadcast(out), out))
        if len(in_flight) > 2:
            work, done = in_flight.pop(0)
            group.wait([work])
            group.recycle(done)
        return out.numel() * out.element_size()

    def broadcast_weights_or_leave(self, dtype: str = "bfloat16") -> int:
        """`broadcast_weights`; when it fails (a server left), rank 0 leaves the group first: closing its end
        makes the other servers' pending receives fail at once instead of waiting out the timeout."""
        try:
            return self.broadcast_weights(dtype)
        except Exception as e:
            self.leave_weight_group()
            # a traceback keeps the failed call's pending works, and they keep the group's sockets open
            raise RuntimeError(f"weight broadcast failed: {type(e).__name__}: {e}") from None

    def leave_weight_group(self) -> None:
        group, self._weight_group = self._weight_group, None
        if group is not None:
            group.close()
        self._weight_store = None
