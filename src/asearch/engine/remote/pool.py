"""One `Engine` over several rollout servers that serve the same policy (`TrainConfig.rollout_servers`).

    pool = EnginePool([SGLangEngine(url) for url in urls], supervisors=sups)
    resp = await pool.generate(request)         # sticky by trajectory_id, else the least-loaded server
    await pool.update_weights("RUN/weights/v3", 3)   # every live server loads the directory

Routing. Every request of a trajectory goes to the server that served its first turn, whose prefix
cache holds the trajectory's KV. A new trajectory goes to the server with the fewest requests in flight.

Failover. When a request fails on a server (it died or stopped answering), that server leaves the pool
and the request is sent again, from its prompt, to another server. The trajectory keeps its earlier
turns and loses only the tokens of the interrupted turn, so no group is lost and the controller has
nothing to redo. A server rejoins once it answers /health and holds the latest weights: a restarted
server comes back with the weights it was launched with, so the pool loads the latest directory into
it first. With `supervisors` (the launchers pass them) a restart is also seen when no request failed.
Tokens stay honestly tagged meanwhile: a launched server labels its weights (`--weight-version`), and
`SGLangEngine` tags tokens with the label of the weights that made them.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import (
    Field,
    PrivateAttr,
    SerializationInfo,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from asearch.config import Config
from asearch.engine.registry import (
    ENGINES,
    EngineConfig,
    ServerOptions,
    engine_kind,
    engine_kinds,
    make_engine,
)
from asearch.engine.remote.http import RETRY_STATUS, HttpConfig, RemoteHTTPError
from asearch.engine.types import (
    UPDATE_KV_HELP,
    Engine,
    GenerateRequest,
    GenerateResponse,
    UpdateKV,
    WeightSource,
)
from asearch.engine.weight_group import Bucket, GroupAddress
from asearch.errors import RemoteError


class SupervisedServer(Protocol):
    """What the pool reads of a server's supervisor: `ServerSupervisor` here, or a Ray actor's mirror
    (`asearch.launch.ray.RemoteSupervisor`)."""

    starts: int  # launches so far: a change means the server restarted with its launch weights
    restarts: int  # crash restarts
    failed: str | None  # why the supervisor gave up, if it did


log = logging.getLogger(__name__)


class RolloutServersConfig(Config):
    """Generation on rollout servers (their own processes) instead of in the trainer's process."""

    kind: str = Field(
        "sglang",
        description="Engine kind of the servers, one RL can sample from: sglang (SGLang's native API, also "
        "served by `asearch engine serve`) or vllm (vLLM's OpenAI server started with VLLM_SERVER_DEV_MODE=1; "
        "see docs/engines-remote.md), or any such registered kind.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Servers already running (same model). Empty with launcher=local: it starts them.",
    )
    weights: Literal["collective", "disk"] = Field(
        "collective",
        description="How a new version reaches the servers. disk: saved as an HF directory RUN/weights/vN, then "
        "loaded by every server (update_weights_from_disk / reload_weights). collective: the trainer's rank 0 "
        "broadcasts it in buckets over a torch.distributed group the servers join (gloo on CPU, NCCL on CUDA; "
        "SGLang's update_weights_from_distributed, vLLM through asearch's worker extension); a version goes to "
        "disk instead when a server restarted or left the pool, when the group cannot form, and for kinds "
        "without the group methods (docs/rl.md, 'Weight sync').",
    )
    weights_bucket_mb: float = Field(
        512.0, gt=0, description="collective: megabytes of tensors per update message (one HTTP call per bucket)."
    )
    weights_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="collective: the dtype tensors travel in (servers cast to their own)."
    )
    weights_disk_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The dtype of the safetensors in RUN/weights/vN (disk sync, fallback and restarts)."
    )
    weights_backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto",
        description="collective: the group's backend. auto: nccl when the trainer's policy is on a GPU, else gloo; "
        "gloo when the trainer and a server share one GPU (NCCL refuses two ranks on one device).",
    )
    weights_timeout_s: float = Field(
        120.0,
        gt=0,
        description="collective: how long forming the group may take, and how long any member waits with no "
        "broadcast finishing (a frozen peer) before that version goes by disk. A server that dies ends the "
        "version at once: every member is told to leave the group.",
    )
    keep_weights: int = Field(
        2, ge=2, description="Saved versions kept on disk (the latest is what a restarted server loads)."
    )
    model_name: str = Field("policy", description="vLLM's --served-model-name (kind vllm).")
    http: HttpConfig = Field(
        default_factory=lambda: HttpConfig(retries=1, max_concurrency=256),
        description="Per server. Few retries: a failed request moves to another server instead.",
    )
    revive_timeout_s: float = Field(
        600.0, gt=0, description="How long a request waits when no server is up before the run fails."
    )
    update_kv: UpdateKV | None = Field(
        None,
        description=f"{UPDATE_KV_HELP}. Unset: the kind's default (sglang keeps; vllm always recomputes, so keep "
        "with kind vllm is an error)",
    )

    # the options of the servers of every kind that has them, by section (vllm, sglang, ...): `server_options`
    _server_options: dict[str, ServerOptions] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _server_sections(cls, data: Any, handler: Any) -> RolloutServersConfig:
        """A section per kind with server options (`vllm:` for kind vllm, `sglang:` for sglang-server, a new
        kind's own), validated against the options model the kind registered."""
        if not isinstance(data, dict):
            return handler(data)  # a RolloutServersConfig already (assignment, model_copy)
        sections = {spec.server_section: spec.server_options for _, spec in ENGINES.items() if spec.server_options}
        options: dict[str, ServerOptions] = {}
        errors: list[Any] = [_unknown_key((key,), [*cls.model_fields, *sections], data[key]) for key in data
                             if key not in cls.model_fields and key not in sections]  # fmt: skip
        for section, model in sections.items():
            given = data.get(section)
            try:
                options[section] = given if isinstance(given, model) else model.model_validate(given or {})
            except ValidationError as e:
                errors += [_unknown_key((section, *err["loc"]), list(model.model_fields), err["input"])
                           if err["type"] == "extra_forbidden" and len(err["loc"]) == 1
                           else {k: err[k] for k in ("type", "input", "ctx") if k in err} | {"loc": (section, *err["loc"])}
                           for err in e.errors()]  # fmt: skip
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        cfg = handler({k: v for k, v in data.items() if k not in sections})
        cfg._server_options = options
        return cfg

    @model_serializer(mode="wrap")
    def _with_sections(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        for section, options in self._server_options.items():
            out[section] = options.model_dump(mode=info.mode, exclude_unset=info.exclude_unset,
                                              exclude_defaults=info.exclude_defaults, exclude_none=info.exclude_none)  # fmt: skip
        return out

    def server_options(self, kind: str | None = None) -> ServerOptions | None:
        """The options of `kind`'s launched servers (default: this config's kind), None for a kind without any."""
        spec = engine_kind(kind or self.kind)
        return self._server_options.get(spec.server_section) if spec.server_options else None

    @field_validator("kind")
    @classmethod
    def _rollout_kind(cls, kind: str) -> str:
        kinds = engine_kinds(rollouts=True)
        if kind not in kinds:
            raise ValueError(f"rollout servers of kind {kind!r}: RL samples from one of {', '.join(kinds)}")
        return kind

    @model_validator(mode="after")
    def _kind_keeps_kv(self) -> RolloutServersConfig:
        if self.update_kv is not None and "update_kv" not in engine_kind(self.kind).options.model_fields:
            raise ValueError(
                f"update_kv={self.update_kv}: rollout servers of kind {self.kind!r} always recompute (leave it unset); "
                "keep needs sglang"
            )
        return self

    def client_options(self) -> dict[str, Any]:
        """Options of each server's client engine beyond its URL."""
        return {"http": self.http, **({"update_kv": self.update_kv} if self.update_kv is not None else {})}


def _unknown_key(loc: tuple[Any, ...], valid: list[str], given: Any) -> dict[str, Any]:
    """The error of an unknown key of `rollout_servers` (or of one of its server sections), naming the nearest."""
    near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    message = f"unknown key {str(loc[-1])!r}{hint} (valid here: {', '.join(valid)})"
    return {"type": PydanticCustomError("unknown_key", message), "loc": loc, "input": given}


@dataclass(eq=False)
class _Member:
    engine: Any  # an Engine serving one server
    name: str
    supervisor: SupervisedServer | None = None
    up: bool = True
    inflight: int = 0  # requests now on this server
    served: int = 0  # requests answered
    failures: int = 0  # times it left the pool
    moved: int = 0  # requests that failed here and were sent to another server
    updates: int = 0  # weight versions it loaded (pushed by update_weights or on rejoining)
    starts: int = 0  # the supervisor's launch count when it last held the pool's weights
    reviving: asyncio.Task | None = None


class EnginePool:
    """An `Engine` that fans out over engines serving the same policy, one per server."""

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        names: Sequence[str] | None = None,
        supervisors: Sequence[SupervisedServer | None] = (),
        version: int = 0,
        revive_timeout_s: float = 600.0,
        max_sticky: int = 100_000,
    ):
        if not engines:
            raise ValueError("EnginePool needs at least one engine")
        names = list(names) if names is not None else [f"server-{i}" for i in range(len(engines))]
        sups = list(supervisors) or [None] * len(engines)
        if not (len(names) == len(sups) == len(engines)):
            raise ValueError(f"{len(engines)} engines, {len(names)} names and {len(sups)} supervisors differ")
        self.members = [
            _Member(e, n, s, starts=s.starts if s is not None else 0)
            for e, n, s in zip(engines, names, sups, strict=True)
        ]
        self.revive_timeout_s = revive_timeout_s
        self.failovers = 0  # requests sent again to another server after one failed
        self._version = version
        self._latest: WeightSource | None = None  # what a rejoining server must load
        self._disk_behind = False  # the latest version came over the weight group: no directory holds it
        self._group: list[_Member] = []  # the servers in the weight group, in rank order
        self._group_starts: list[int] = []  # their supervisors' launch counts when they joined it
        self._sticky: OrderedDict[str, _Member] = OrderedDict()  # trajectory id -> its server
        self._max_sticky = max_sticky
        self._lock = asyncio.Lock()  # weight updates and rejoins, one at a time
        self._any_up = asyncio.Event()
        self._any_up.set()
        self._paused = False
        self._closing = False

    # ------------------------------------------------------------------ Engine protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        key = request.trajectory_id or request.request_id
        for _ in range(4 * len(self.members)):  # every server may fail once or twice before we give up
            m = await self._pick(key)
            m.inflight += 1
            try:
                resp = await m.engine.generate(request)
            except RemoteError as e:
                refused = (
                    isinstance(e, RemoteHTTPError)
                    and e.status_code is not None
                    and e.status_code < 500
                    and e.status_code not in RETRY_STATUS
                )
                if self._closing or refused:
                    raise  # closing, or a bad request (4xx): another server would refuse it too
                self._lose(m, e)
                m.moved += 1
                self.failovers += 1
                continue
            finally:
                m.inflight -= 1
            m.served += 1
            return resp
        raise RemoteError(f"request {request.request_id} failed on every rollout server; see their logs")

    async def pause(self) -> None:
        self._paused = True
        await self._each("pause")

    async def resume(self) -> None:
        self._paused = False
        await self._each("resume")

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Every live server loads `source`; one that fails leaves the pool and loads it when it rejoins."""
        async with self._lock:
            await self._each("update_weights", source, version, locked=True)
            self._latest, self._version, self._disk_behind = source, version, False

    # ------------------------------------------------------------------ collective weight sync

    def supports_weight_group(self) -> bool:
        """Whether every server's client can join a weight group (`asearch.engine.weight_group`)."""
        return all(hasattr(m.engine, "init_weights_update_group") for m in self.members)

    def weight_group_intact(self) -> bool:
        """Whether every server is up and in the weight group, with the weights it received there (none
        restarted since it joined): then the next version can go over the group."""
        members = self._group
        return (
            len(members) == len(self.members)
            and all(m.up for m in members)
            and all(m.supervisor is None or m.supervisor.starts == s for m, s in zip(members, self._group_starts, strict=True))
        )

    async def init_weights_update_group(self, address: GroupAddress, ranks_per_server: int = 1) -> None:
        """Every server joins the trainer's weight group (rank 0; server k takes ranks 1 + k * ranks_per_server
        onwards); returns once the group is formed, so the trainer joins meanwhile. Needs every server up."""
        async with self._lock:
            down = [m.name for m in self.members if not m.up]
            if down:
                raise RemoteError(f"a weight group needs every rollout server; out of the pool: {', '.join(down)}")
            self._group = []
            await asyncio.gather(
                *(
                    m.engine.init_weights_update_group(address, 1 + k * ranks_per_server, ranks_per_server)
                    for k, m in enumerate(self.members)
                )
            )
            self._group = list(self.members)
            self._group_starts = [m.supervisor.starts if m.supervisor is not None else 0 for m in self.members]

    async def update_weights_from_distributed(self, buckets: Sequence[Bucket], version: int, group_name: str) -> None:
        """Every server in the weight group receives `version` while the trainer broadcasts it. A server that
        restarts later waits out of the pool until a version reaches a directory (the next push goes by disk)."""
        async with self._lock:
            group, failed = list(self._group), []

            async def receive(m: _Member) -> None:
                try:
                    await m.engine.update_weights_from_distributed(buckets, version, group_name)
                except Exception as e:  # noqa: BLE001 - every server must be heard from before the group is given up
                    failed.append(f"{m.name}: {type(e).__name__}: {e}")
                    # every server leaves: one receiving through a lost peer would otherwise wait out its timeout
                    await self.abort_weight_group(group_name, group)
                    if isinstance(e, RemoteError) and not await self._answers(m):
                        self._lose(m, e)

            await asyncio.gather(*(receive(m) for m in group))
            if failed:
                self._group = []
                raise RemoteError(f"weight group {group_name} broke during version {version}: {'; '.join(failed)}")
            for m in group:
                m.updates += 1
            self._version, self._disk_behind = version, True

    async def abort_weight_group(self, group_name: str, members: Sequence[_Member] | None = None) -> None:
        """Every server of the group leaves it now, without the pool's lock (a version being received holds it):
        their receives fail at once instead of waiting for a peer that is gone. Idempotent."""
        members = self._group if members is None else members
        await asyncio.gather(
            *(asyncio.wait_for(m.engine.destroy_weights_update_group(group_name), 10) for m in members),
            return_exceptions=True,
        )

    async def _answers(self, m: _Member) -> bool:
        """Whether `m` answers its health check (a server that refused an update may be alive)."""
        if not hasattr(m.engine, "health"):
            return True
        try:
            return all(await asyncio.wait_for(m.engine.health(), 10))
        except Exception:  # noqa: BLE001 - any failure to answer is an answer
            return False

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """Live servers leave the weight group (one that cannot is left as it is)."""
        async with self._lock:
            live = [m for m in self._group if m.up]
            self._group = []
            await asyncio.gather(*(m.engine.destroy_weights_update_group(group_name) for m in live), return_exceptions=True)

    async def close(self) -> None:
        """Stop sending (requests in flight end with stop_reason 'abort'). Does not stop the servers."""
        self._closing = True
        self._any_up.set()
        for m in self.members:
            if m.reviving is not None:
                m.reviving.cancel()
        await asyncio.gather(*(m.engine.close() for m in self.members), return_exceptions=True)

    def stats(self) -> list[dict[str, Any]]:
        """Per server: up, requests in flight and answered, times it left the pool, requests moved to
        another server, versions loaded (and the current one), crash restarts."""
        return [
            {
                "name": m.name,
                "up": m.up,
                "inflight": m.inflight,
                "served": m.served,
                "failures": m.failures,
                "requests_moved": m.moved,
                "weight_updates": m.updates,
                "version": m.engine.version,
                "restarts": m.supervisor.restarts if m.supervisor is not None else None,
            }
            for m in self.members
        ]

    # ------------------------------------------------------------------ routing

    async def _pick(self, key: str) -> _Member:
        """The trajectory's server while it is up; otherwise the live server with the fewest requests."""
        while True:
            for member in self.members:  # a supervisor relaunched it: it lost the pool's weights
                if member.up and member.supervisor is not None and member.supervisor.starts != member.starts:
                    self._lose(member, "restarted by its supervisor")
            m = self._sticky.get(key)
            if m is not None and m.up:
                self._sticky.move_to_end(key)
                return m
            live = [m for m in self.members if m.up]
            if live:
                m = min(live, key=lambda m: (m.inflight, m.served))
                self._sticky[key] = m
                if len(self._sticky) > self._max_sticky:
                    self._sticky.popitem(last=False)
                return m
            if self._closing:
                raise RemoteError("the engine pool is closed")
            self._any_up.clear()
            try:
                async with asyncio.timeout(self.revive_timeout_s):  # not wait_for: it can swallow a cancel
                    await self._any_up.wait()
            except TimeoutError:
                raise RemoteError(
                    f"no rollout server up for {self.revive_timeout_s:g}s: "
                    + "; ".join(f"{m.name}: {m.failures} failures" for m in self.members)
                    + ". Read the servers' logs."
                ) from None

    async def _each(self, method: str, *args: Any, locked: bool = False) -> None:
        """Call `method` on every live server at once; a server that fails leaves the pool."""
        if not locked:
            async with self._lock:
                return await self._each(method, *args, locked=True)
        live = [m for m in self.members if m.up]
        results = await asyncio.gather(
            *(getattr(m.engine, method)(*args) for m in live), return_exceptions=True
        )
        for m, r in zip(live, results, strict=True):
            if isinstance(r, RemoteError):
                self._lose(m, r)
            elif isinstance(r, BaseException):
                raise r  # not the server's fault (e.g. a bad weights directory): every server would refuse it
            elif method == "update_weights":
                m.updates += 1

    # ------------------------------------------------------------------ failures

    def _lose(self, m: _Member, why: object) -> None:
        """Take `m` out of routing and start bringing it back (health, then the latest weights)."""
        if not m.up or self._closing:
            return
        m.up, m.failures = False, m.failures + 1
        log.warning("%s left the rollout pool (%s); its requests go to the others", m.name, why)
        m.reviving = asyncio.create_task(self._revive(m), name=f"revive-{m.name}")

    async def _revive(self, m: _Member) -> None:
        start = time.monotonic()
        while not self._closing:
            if m.supervisor is not None and m.supervisor.failed:
                log.error("%s stays out of the rollout pool: %s", m.name, m.supervisor.failed)
                return
            healthy = all(await m.engine.health()) if hasattr(m.engine, "health") else True
            if healthy:
                try:
                    async with self._lock:
                        restarted = m.supervisor is None or m.supervisor.starts != m.starts
                        stale = restarted or m.engine.version != self._version
                        if not (stale and self._disk_behind):  # else: wait for a version on disk
                            if m.supervisor is not None:
                                m.starts = m.supervisor.starts
                            if self._latest is not None and stale:
                                await m.engine.update_weights(self._latest, self._version)
                                m.updates += 1
                            if self._paused:
                                await m.engine.pause()
                            m.up = True
                            self._any_up.set()
                    if m.up:
                        log.warning("%s rejoined the rollout pool after %.1fs", m.name, time.monotonic() - start)
                        return
                except RemoteError as e:
                    log.warning("%s: could not rejoin yet (%s)", m.name, e)
                except Exception as e:  # e.g. the weights directory is gone: retrying cannot help
                    log.error("%s stays out of the rollout pool: %s: %s", m.name, type(e).__name__, e)
                    return
            await asyncio.sleep(0.5)


def open_pool(
    cfg: RolloutServersConfig,
    urls: Sequence[str],
    *,
    supervisors: Sequence[SupervisedServer | None] = (),
    version: int = 0,
) -> EnginePool:
    """An `EnginePool` with one engine of kind `cfg.kind` per URL, built through the engine registry
    (servers labelled `version`)."""
    if not urls:
        raise ValueError("rollout_servers: no server URLs (give rollout_servers.urls, or launcher=local)")
    sups = list(supervisors) or [None] * len(urls)
    engines: list[Engine] = [
        make_engine(
            EngineConfig.model_validate(  # the kind's options go flat beside kind and model
                {"kind": cfg.kind, "model": cfg.model_name, "base_url": url, "initial_version": version, **cfg.client_options()}
            ),
            supervisors=[sup] if sup is not None else [],
        )
        for url, sup in zip(urls, sups, strict=True)
    ]
    return EnginePool(
        engines, names=list(urls), supervisors=sups, version=version, revive_timeout_s=cfg.revive_timeout_s
    )
