"""Engine registry: one `EngineConfig` (a kind plus that kind's options) for every command.

    engine: {kind: inprocess, model: smollm2-135m-instruct, max_batch: 8}
    engine: {kind: openai, base_url: http://127.0.0.1:8000/v1, model: policy, timeout_s: 60}

    engine, tokenizer = build_engine(cfg)      # what ask, eval, synth and train start from
    member = make_engine(cfg, supervisors=[sup])   # the engine alone (a rollout-pool member)

A kind's options sit flat beside `kind`, `model` and `base_url`, and are validated against the options
model the kind registered (`cfg.options` returns it typed); an unknown key names the nearest valid one.
A kind is one module of `asearch.engine` or of its subpackages (`local`, `remote`, `server`) that calls
`@register_engine(...)` on its build function; every such module is imported on the first lookup, so a new
engine is one new file. A kind whose servers a launcher starts gives `serve` (a `ServeHook`: the server of
one `ServerLaunch`) and, when its servers take options of their own, `server_options` (a `ServerOptions`
model: the section `rollout_servers.<section>`). Engine modules must stay cheap to import (torch,
transformers inside functions): `--help` lists the kinds.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import Field, PrivateAttr, SerializationInfo, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from asearch.config import Config
from asearch.engine.types import Engine, Tokenizer
from asearch.registry import Registry

if TYPE_CHECKING:
    from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig

BuildFn = Callable[..., Any]  # (cfg: EngineConfig, **context) -> an Engine


class ServerOptions(Config):
    """Base of the options of a kind's launched servers (`rollout_servers.<section>`, e.g. `rollout_servers.vllm`)."""

    def gpus_per_server(self) -> int:
        """GPUs one server spans (its tensor-parallel size); a launcher reserves that many for it."""
        return 1


@dataclass(frozen=True)
class ServerLaunch:
    """Rollout server `index` of a run, as a launcher asks a kind's `serve` hook for it."""

    model: str  # the policy's directory (or name) the server loads
    index: int
    engine: Any  # the run's InProcessEngineConfig (not imported: inprocess imports this module): length, dtype, ...
    options: ServerOptions | None  # the kind's section of rollout_servers (None: the kind has none)
    seed: int  # the run's; a server samples seed + index
    log_path: Path
    supervisor: SupervisorConfig
    threads: int = 1  # allocation.server_threads
    host: str = "127.0.0.1"
    served_model_name: str = "policy"
    cores: int | None = None  # CPU cores of this machine a CPU server binds within (None: os.cpu_count())


class ServeHook(Protocol):
    """A kind's server for one launch: its supervisor (not started) and its base URL."""

    def __call__(self, launch: ServerLaunch) -> tuple[ServerSupervisor, str]: ...


@dataclass(frozen=True)
class EngineKind:
    """A registered engine kind: its options model and how to build it from an `EngineConfig`."""

    name: str
    options: type[Config]
    build: BuildFn
    summary: str  # one line for --help and docs
    needs_url: bool  # a remote kind: engine.base_url is required
    rollouts: bool = False  # token ids, log-probs and weight updates: RL can sample from its servers
    serve: ServeHook | None = None  # builds one of its servers on this machine (launcher=local / ray)
    server_options: type[ServerOptions] | None = None  # its servers' options, `rollout_servers.<server_section>`
    server_section: str = ""  # the key of those options (default: the kind's name)


# Only the modules that register a kind are imported (found by their source), so listing the kinds for
# --help does not import helper modules such as the torch decoder.
ENGINES: Registry[EngineKind] = Registry("engine kind", "asearch.engine", wants=lambda source: "@register_engine(" in source)


def register_engine(
    kind: str,
    *,
    options: type[Config],
    summary: str,
    needs_url: bool = False,
    rollouts: bool = False,
    serve: ServeHook | None = None,
    server_options: type[ServerOptions] | None = None,
    server_section: str | None = None,
) -> Callable[[BuildFn], BuildFn]:
    """Register the decorated `build(cfg: EngineConfig, **context) -> Engine` as engine `kind`.

    `options` is the kind's pydantic options model (its fields sit flat under `engine:`). `context`
    carries live objects only a caller has (e.g. `supervisors=` for vllm); a build ignores the rest.
    `rollouts`: its servers can be RL rollout servers (token ids, log-probs, weight updates). `serve`,
    for a kind whose servers the launchers can start, returns the supervisor (not started) and base URL
    of the server a `ServerLaunch` describes (see `launch/local.py`); `server_options`, the model of those
    servers' own options, validated under `rollout_servers.<server_section>` (default: `kind`).
    """
    reserved = set(options.model_fields) & set(EngineConfig.model_fields)
    if reserved:
        raise TypeError(f"engine kind {kind!r}: options may not be named {sorted(reserved)} (EngineConfig's own)")

    def add(build: BuildFn) -> BuildFn:
        section = server_section or kind
        spec = EngineKind(kind, options, build, summary, needs_url, rollouts, serve, server_options, section)
        ENGINES.add(kind, spec, origin=build)
        return build

    return add


def engine_kinds(*, rollouts: bool = False) -> list[str]:
    """The kinds `EngineConfig.kind` accepts, sorted; with `rollouts`, those RL can sample from on servers."""
    return [k for k, spec in ENGINES.items() if spec.rollouts or not rollouts]


def engine_kind(kind: str) -> EngineKind:
    """The registration of `kind`; a ConfigError naming the nearest kind if there is none."""
    return ENGINES.get(kind)


def engine_kinds_help() -> str:
    """`kind: summary` for every kind, one per line (for --help and error messages)."""
    return "\n".join(f"{k}: {engine_kind(k).summary}" for k in engine_kinds())


class EngineConfig(Config):
    """Which engine runs the model: a kind, the model, the server (remote kinds), and the kind's options.

    The options are the fields of the kind's options model, given flat (`engine.max_batch=8` for
    inprocess, `engine.timeout_s=60` for openai); `options` returns them as that model.
    """

    kind: str = Field(
        "inprocess",
        description="inprocess | vllm | sglang | openai | scripted (any registered kind; "
        "`asearch ask --help` lists them).",
    )
    model: str = Field(
        "smollm2-135m-instruct",
        description="HF name, local directory, or built-in alias (smollm2-135m-instruct); for a server, "
        "the name it serves the model under. The tokenizer comes from here too (openai: see `tokenizer`).",
    )
    base_url: str | None = Field(
        None,
        description="The server of a remote kind: http://host:port for vllm / sglang; the API root for "
        "openai (http://host:port gets /v1 added).",
    )
    _options: Config = PrivateAttr()

    @model_validator(mode="wrap")
    @classmethod
    def _split_options(cls, data: Any, handler: Any) -> EngineConfig:
        """Validate the keys that are not EngineConfig's own against the kind's options model."""
        if not isinstance(data, dict):
            return handler(data)  # an EngineConfig already (assignment, model_copy)
        own = {k: v for k, v in data.items() if k in cls.model_fields}
        rest = {k: v for k, v in data.items() if k not in cls.model_fields}
        kind = own.get("kind", cls.model_fields["kind"].default)
        spec = ENGINES.find(kind) if isinstance(kind, str) else None
        if spec is None:
            raise PydanticCustomError("engine_kind", ENGINES.unknown(str(kind)))
        rest = _legacy_inprocess(kind, rest)
        unknown = [k for k in rest if k not in spec.options.model_fields]
        if unknown:
            raise PydanticCustomError("engine_option", _unknown_option(spec, unknown[0]))
        options = spec.options.model_validate(rest)
        cfg = handler(own)
        if spec.needs_url and not cfg.base_url:
            raise PydanticCustomError(
                "engine_url", f"engine.kind={kind!r} needs engine.base_url (the server's http://host:port)"
            )
        if cfg.base_url and not spec.needs_url:  # e.g. --base-url without --engine: say so, do not ignore it
            remote = ", ".join(k for k, s in ENGINES.items() if s.needs_url)
            raise PydanticCustomError(
                "engine_url", f"engine.base_url is set but kind {kind!r} uses no server: set engine.kind ({remote})"
            )
        cfg._options = options
        return cfg

    @model_serializer(mode="wrap")
    def _flat_options(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        out = handler(self)
        out.update(
            self._options.model_dump(
                mode=info.mode,
                exclude_unset=info.exclude_unset,
                exclude_defaults=info.exclude_defaults,
                exclude_none=info.exclude_none,
            )
        )
        return out

    @property
    def options(self) -> Any:
        """The kind's options model (e.g. `InProcessEngineConfig` for kind inprocess)."""
        return self._options


def _legacy_inprocess(kind: str, rest: dict[str, Any]) -> dict[str, Any]:
    """Older configs nested the in-process options as `engine.inprocess.X`: read them as `engine.X`."""
    if "inprocess" not in rest:
        return rest
    rest = dict(rest)
    legacy = rest.pop("inprocess")
    if kind != "inprocess":
        raise PydanticCustomError(
            "engine_option", f"engine.inprocess is for kind inprocess (got kind {kind!r}); give options flat"
        )
    if isinstance(legacy, Config):
        legacy = legacy.model_dump(exclude_unset=True)
    return {**(legacy or {}), **rest}


def _unknown_option(spec: EngineKind, key: str) -> str:
    valid = [*EngineConfig.model_fields, *spec.options.model_fields]
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean 'engine.{near[0]}'?" if near else ""
    return f"unknown key 'engine.{key}' for engine kind {spec.name!r}{hint} (valid here: {', '.join(valid)})"


def make_engine(cfg: EngineConfig, **context: Any) -> Engine:
    """The engine `cfg` describes, without a tokenizer (e.g. one member of a rollout pool)."""
    return engine_kind(cfg.kind).build(cfg, **context)


def build_engine(cfg: EngineConfig, **context: Any) -> tuple[Engine, Tokenizer]:
    """(engine, tokenizer): the engine's own tokenizer when it has one, else that of `cfg.model`.
    Heavy imports happen here, not at module import."""
    engine = make_engine(cfg, **context)
    tokenizer: Tokenizer | None = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        from asearch.models.loading import load_tokenizer

        tokenizer = cast(Tokenizer, load_tokenizer(cfg.model))  # HF types decode as str | list[str]: one list, one str
    return engine, tokenizer
