"""How a new policy version reaches the engine after a train step: `await weights.push(version)`.

- `LiveWeights`: the in-process engine shares this process's policy; it gets the live state dict (it
  pauses its requests, recomputes their KV caches under the new weights and resumes them itself).
- `DiskWeights`: rollout servers load each version from RUN/weights/v{version}, written atomically by
  `trainer.save_hf` (in `dtype`: bfloat16 by default); `engine.update_weights` pauses every server, loads
  it and resumes. The latest `keep` versions stay on disk (a server may still be reading the previous one).
- `CollectiveWeights`: the trainer's rank 0 broadcasts each version over a weight group that every rollout
  server joins (`asearch.rl.broadcast`, `asearch.engine.weight_group`), while the pool sends the servers the
  update's metadata bucket by bucket. A version goes by disk instead while the group is not whole (a server
  restarted or left the pool: it gets that version from disk when it rejoins), and the group is formed
  again, with every server, on the next push.

Each push leaves its seconds and bytes in `metrics()` (`weights/sync_s`, `weights/sync_bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from asearch.engine.remote.pool import EnginePool
from asearch.engine.types import Engine
from asearch.engine.weight_group import Bucket, GroupAddress, parse_dtype, plan_buckets, signal_abort
from asearch.models.lora import merged_state_dict
from asearch.rl.trainer import PolicyTrainer, Trainer

log = logging.getLogger(__name__)


class WeightSync(Protocol):
    async def push(self, version: int) -> None:
        """Make `version` the engine's weights (tokens sampled after it carry that version)."""
        ...


def weight_metrics(weights: object) -> dict[str, float]:
    """The last push's `weights/*` metrics, for a sync that measures them (`DiskWeights`, `CollectiveWeights`)."""
    metrics = getattr(weights, "metrics", None)
    return metrics() if callable(metrics) else {}


@dataclass
class LiveWeights:
    engine: Engine
    trainer: PolicyTrainer

    async def push(self, version: int) -> None:
        await self.engine.update_weights(merged_state_dict(self.trainer.model), version)  # LoRA: merged


@dataclass
class DiskWeights:
    engine: Engine
    trainer: Trainer
    tokenizer: Any  # saved beside every version, so a server can load it as a model directory
    directory: Path  # RUN/weights
    keep: int
    dtype: str | None = "bfloat16"  # of the saved tensors (None: the model's own)
    last: dict[str, float] = field(default_factory=dict)

    async def push(self, version: int) -> None:
        t0 = time.perf_counter()
        path = await asyncio.to_thread(
            self.trainer.save_hf, self.directory / f"v{version}", self.tokenizer, self.dtype
        )
        await self.engine.update_weights(path, version)
        size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
        self.last = {
            "weights/sync_s": time.perf_counter() - t0,
            "weights/sync_bytes": float(size),
            "weights/collective": 0.0,
        }
        saved = {int(p.name[1:]): p for p in self.directory.glob("v[0-9]*")}
        older = sorted(v for v in saved if v < version)
        newer = [v for v in saved if v > version]  # written before a kill, by steps that resume redoes
        for v in older[: max(len(older) - (self.keep - 1), 0)] + newer:
            shutil.rmtree(saved[v], ignore_errors=True)

    def metrics(self) -> dict[str, float]:
        return dict(self.last)


@dataclass
class CollectiveWeights:
    """Versions broadcast by the trainer to every server of `engine` over a weight group (see the module)."""

    engine: EnginePool
    trainer: Any  # a trainer with `BroadcastsWeights`' methods (PolicyTrainer, DistributedPolicyTrainer, Ray group)
    disk: DiskWeights  # the fallback, and where a restarted server finds the latest version
    urls: list[str]  # the servers', to find the address they reach the trainer by
    bucket_mb: float = 512.0
    dtype: str = "bfloat16"
    timeout_s: float = 600.0
    ranks_per_server: int = 1  # a server's members of the group (its tensor-parallel size)
    backend: str | None = None  # the group's; None: the trainer's choice (nccl when the policy is on a GPU)
    last: dict[str, float] = field(default_factory=dict)
    max_form_failures: int = 2  # then every version goes by disk, said once in the log
    _group: str | None = None
    _names: itertools.count = field(default_factory=itertools.count)
    _form_failures: int = 0
    _store_address: tuple[str, int] | None = None  # rank 0's rendezvous store: the group's abort key lives there

    async def push(self, version: int) -> None:
        t0 = time.perf_counter()
        if self._group is not None and not self.engine.weight_group_intact():
            log.warning(
                "weight group %s lost a server: version %d goes by disk, the group forms again after",
                self._group,
                version,
            )
            await self.close()
        elif self._group is None and all(m.up for m in self.engine.members) and self._form_failures < self.max_form_failures:
            await self._try_form_group()
        if self._group is None:
            await self.disk.push(version)
            self.last = self.disk.metrics()
            return
        shapes = await asyncio.to_thread(self.trainer.weight_shapes)
        buckets = plan_buckets(
            shapes, bucket_bytes=int(self.bucket_mb * 2**20), dtype=parse_dtype(self.dtype)
        )
        sent, received = await self._send_and_receive(buckets, version, self._group)
        if isinstance(sent, BaseException) or isinstance(received, BaseException):
            error = received if isinstance(received, BaseException) else sent
            log.warning(
                "version %d over weight group %s failed (%s); it goes by disk", version, self._group, error
            )
            with contextlib.suppress(Exception):
                await self.close()
            await self.disk.push(version)
            self.last = self.disk.metrics()
            return
        self.last = {
            "weights/sync_s": time.perf_counter() - t0,
            "weights/sync_bytes": float(sent),
            "weights/collective": 1.0,
        }

    async def _send_and_receive(self, buckets: list[Bucket], version: int, group: str) -> tuple[Any, Any]:
        """The trainer's broadcast beside the servers' receive; when one side fails the other is aborted (else
        it would wait for the failed side until `timeout_s`). Both results, exceptions included."""
        send = asyncio.ensure_future(asyncio.to_thread(self.trainer.broadcast_weights_or_leave, self.dtype))
        receive = asyncio.ensure_future(self.engine.update_weights_from_distributed(buckets, version, group))
        done, pending = await asyncio.wait({send, receive}, return_when=asyncio.FIRST_EXCEPTION)
        if pending and any(t.exception() is not None for t in done):
            await self._abort(group)
        return await asyncio.gather(send, receive, return_exceptions=True)

    async def _abort(self, group: str) -> None:
        """Every member's broadcasts fail now: the group's abort key in rank 0's store (which every member
        polls: the trainer ranks, wherever they run, and vLLM's workers), and each server told to leave."""
        if self._store_address is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(signal_abort, *self._store_address, group)
        await self.engine.abort_weight_group(group)

    async def _try_form_group(self) -> None:
        """`_form_group`; when it fails the version goes by disk, and after `max_form_failures` every version
        does (an automatic backend falls back from nccl to gloo on the next try: NCCL refuses a GPU shared by two
        members)."""
        backend = self.backend or cast(str, await asyncio.to_thread(self.trainer.weight_backend))
        if self.backend is None and self._form_failures and backend == "nccl":
            backend = "gloo"
        try:
            await self._form_group(backend)
        except Exception as e:  # noqa: BLE001 - the disk path still works; the log says why
            self._form_failures += 1
            final = self._form_failures >= self.max_form_failures
            log.warning(
                "weight group (%s) could not form (%s: %s): this version goes by disk%s", backend, type(e).__name__, e,
                "; so will every later one (rollout_servers.weights: disk says so up front)" if final else "",
            )  # fmt: skip

    async def _form_group(self, backend: str) -> None:
        """The trainer hosts the rendezvous, then it and every server join at once (each blocks until all have);
        a server that fails to join ends the wait at once (the trainer's end then times out in its thread)."""
        t0 = time.perf_counter()
        name = f"asearch-weights-{next(self._names)}"
        host, port = await asyncio.to_thread(self.trainer.open_weight_store, self.urls, self.timeout_s)
        self._store_address = (host, port)
        world = 1 + self.ranks_per_server * len(self.engine.members)
        address = GroupAddress(host, port, world, name, backend, self.timeout_s)
        join = asyncio.ensure_future(asyncio.to_thread(self.trainer.join_weight_group, address, self.timeout_s))
        servers = asyncio.ensure_future(self.engine.init_weights_update_group(address, self.ranks_per_server))
        await asyncio.wait({join, servers}, return_when=asyncio.FIRST_EXCEPTION)
        try:
            if servers.done() and servers.exception() is not None:
                join.add_done_callback(lambda f: f.cancelled() or f.exception())  # its timeout, already reported
                raise servers.exception()  # type: ignore[misc]
            await asyncio.gather(join, servers)
        except Exception:
            with contextlib.suppress(Exception):  # whoever joined leaves the half-formed group
                await self.engine.abort_weight_group(name, self.engine.members)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.trainer.leave_weight_group)
            raise
        self._group = name
        log.info(
            "weight group %s: trainer + %d server ranks (%s at %s:%d) in %.2fs",
            name,
            world - 1,
            backend,
            host,
            port,
            time.perf_counter() - t0,
        )

    async def close(self) -> None:
        """Servers and trainer leave the group (the next push forms a new one)."""
        name, self._group = self._group, None
        if name is not None:
            await self.engine.destroy_weights_update_group(name)
            await asyncio.to_thread(self.trainer.leave_weight_group)

    def metrics(self) -> dict[str, float]:
        return dict(self.last)
