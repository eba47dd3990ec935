"""`asearch engine serve MODEL`: the in-process engine as a server (generation in its own process) that speaks
SGLang's native protocol (a trainer's rollouts) and OpenAI's API (judges, synthesis, any OpenAI client)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import Field
from rich.markup import escape
from rich.panel import Panel

from asearch.cli.console import console, overrides_argument
from asearch.config import Config, load_config
from asearch.engine.registry import EngineConfig
from asearch.errors import ConfigError

if TYPE_CHECKING:
    from asearch.engine.local.inprocess import InProcessEngineConfig

app = typer.Typer(help="Inference engines: serve a model to a trainer or an agent.", no_args_is_help=True)


class ServeConfig(Config):
    """What `asearch engine serve` reads its `engine.KEY=VALUE` arguments into."""

    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The in-process engine it serves (kind inprocess) and its options."
    )


@app.command("kinds")
def kinds() -> None:
    """List the engine kinds `engine.kind` accepts (the engine registry) and what each runs."""
    from asearch.engine.registry import engine_kind, engine_kinds

    for kind in engine_kinds():
        spec = engine_kind(kind)
        server = " (needs engine.base_url)" if spec.needs_url else ""
        console.print(f"[bold]{kind}[/bold]{server}: {escape(spec.summary)}", soft_wrap=True)


@app.command("serve", context_settings={"ignore_unknown_options": True})
def serve(
    model: Annotated[
        str, typer.Argument(help="Model directory, Hugging Face name or alias (smollm2-135m-instruct).")
    ],
    overrides: Annotated[list[str] | None, overrides_argument("engine.max_batch=64 engine.prefill_chunk=256")] = None,
    host: Annotated[
        str, typer.Option(help="Bind address; non-loopback exposes unauthenticated weight updates.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")] = 30000,
    weight_version: Annotated[
        str, typer.Option(help="Label of the initial weights (meta_info.weight_version).")
    ] = "default",
    served_model_name: Annotated[
        str | None,
        typer.Option(help="The model name OpenAI requests use (/v1/models lists it; another name answers 404). "
                     "Default: MODEL as given."),
    ] = None,
    exit_with_parent: Annotated[
        bool,
        typer.Option(help="Exit when the process that started this server dies (launchers set it, so a "
                     "trainer killed with SIGKILL leaves no server behind)."),
    ] = False,
) -> None:
    """Serve MODEL with the in-process engine behind SGLang's native API (/generate, /update_weights_from_disk,
    ...) and OpenAI's (/v1/chat/completions, /v1/completions, /v1/models).

    Its options are the in-process engine's `engine.*` keys, as `asearch train` and `eval` take them
    (engine.threads, engine.max_batch, engine.max_seq_len, engine.prefill_chunk, engine.device, engine.dtype, ...;
    docs/engines.md); `--max-batch 64` reads as `engine.max_batch=64`. Talk to it with
    `asearch.engine.remote.sglang.SGLangEngine(url)`, or any OpenAI client at URL/v1; see docs/engines-remote.md.
    """
    import os

    import torch

    from asearch.engine.server.app import build_server, run_engine_server
    from asearch.net import free_port, is_loopback

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = serve_options(model, overrides or [])
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    torch.set_num_threads(cfg.threads)
    port = port or free_port(host)
    with console.status(f"loading {escape(model)}"):
        server = build_server(model, cfg=cfg, weight_version=weight_version, served_model_name=served_model_name)
    if not is_loopback(host):
        console.print(
            Panel(
                f"Binding to [bold]{escape(host)}[/bold]: the server has no authentication, so anyone who can "
                "reach this machine can generate with the model and replace its weights from any path.\n"
                "Use --host 127.0.0.1 (the default) unless other machines must connect.",
                title="WARNING: not a loopback address",
                border_style="red",
            )
        )
    url = f"http://{host}:{port}"
    console.print(
        f"[bold green]asearch engine server[/bold green] (SGLang protocol) at [bold]{escape(url)}[/bold]: "
        f"{escape(model)}, {cfg.threads} thread(s), max_batch {cfg.max_batch}, weight_version {escape(weight_version)}",
        soft_wrap=True,
    )
    console.print(
        f"OpenAI API at [bold]{escape(url)}/v1[/bold] as model [bold]{escape(server.served_model_name)}[/bold]",
        soft_wrap=True,
    )
    if exit_with_parent:
        _exit_with_parent()
    run_engine_server(server, host=host, port=port)


def serve_options(model: str, args: Sequence[str]) -> InProcessEngineConfig:
    """The in-process options of `asearch engine serve` from `engine.KEY=VALUE` arguments, validated as
    `asearch train` validates `engine:` (an unknown key names the nearest); a flag `--key-name VALUE` (or
    `--key-name=VALUE`) reads as `engine.key_name=VALUE`."""
    overrides, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and not rest:
                raise ConfigError(f"{arg} needs a value")
            arg = f"engine.{key.replace('-', '_')}={value if eq else rest.pop(0)}"
        if not arg.startswith("engine."):
            raise ConfigError(f"asearch engine serve takes engine.KEY=VALUE options (e.g. engine.max_batch=64), got {arg!r}")
        overrides.append(arg)
    cfg = load_config(ServeConfig, None, overrides, base={"engine": {"kind": "inprocess", "model": model}})
    if cfg.engine.kind != "inprocess":
        raise ConfigError(f"asearch engine serve runs the in-process engine: drop engine.kind={cfg.engine.kind}")
    return cfg.engine.options  # type: ignore[no-any-return]


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """A watchdog thread: when the parent dies this process is re-parented (getppid changes); then stop
    like on Ctrl-C (SIGTERM: the server shuts down cleanly), and hard-exit if that takes over 10 s."""
    import os
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        logging.getLogger("asearch.engine.server.app").warning("parent process %d is gone: shutting down", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
