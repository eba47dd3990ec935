"""`asearch engine serve MODEL`: the in-process engine as a server (generation in its own process) that speaks
SGLang's native protocol (a trainer's rollouts) and OpenAI's API (judges, synthesis, any OpenAI client)."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import typer
from rich.markup import escape
from rich.panel import Panel

from asearch.cli.console import console

app = typer.Typer(help="Inference engines: serve a model to a trainer or an agent.", no_args_is_help=True)


@app.command("kinds")
def kinds() -> None:
    """List the engine kinds `engine.kind` accepts (the engine registry) and what each runs."""
    from asearch.engine.registry import engine_kind, engine_kinds

    for kind in engine_kinds():
        spec = engine_kind(kind)
        server = " (needs engine.base_url)" if spec.needs_url else ""
        console.print(f"[bold]{kind}[/bold]{server}: {escape(spec.summary)}", soft_wrap=True)


@app.command("serve")
def serve(
    model: Annotated[
        str, typer.Argument(help="Model directory, Hugging Face name or alias (smollm2-135m-instruct).")
    ],
    host: Annotated[
        str, typer.Option(help="Bind address; non-loopback exposes unauthenticated weight updates.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one).")] = 30000,
    threads: Annotated[
        int, typer.Option(min=1, help="torch threads of the decode thread (1 on a shared box).")
    ] = 1,
    max_batch: Annotated[
        int, typer.Option(min=1, help="Requests decoded together; more wait in a queue.")
    ] = 64,
    max_seq_len: Annotated[int, typer.Option(min=2, help="Prompt + output tokens per request.")] = 2048,
    device: Annotated[
        str, typer.Option(help="auto (a CUDA GPU when torch sees one, else the CPU) | cpu | cuda | cuda:N.")
    ] = "auto",
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"],
        typer.Option(help="Weights, activations and KV cache (auto: bfloat16 on a GPU, float32 on a CPU)."),
    ] = "auto",
    prefix_cache_mb: Annotated[
        float, typer.Option(min=0, help="KV kept between turns (0 disables).")
    ] = 256.0,
    seed: Annotated[int, typer.Option(help="Seeds requests that carry no sampling_seed.")] = 0,
    weight_version: Annotated[
        str, typer.Option(help="Label of the initial weights (meta_info.weight_version).")
    ] = "default",
    served_model_name: Annotated[
        str | None,
        typer.Option(
            help="The model name OpenAI requests use (/v1/models lists it; another name answers 404). "
            "Default: MODEL as given."
        ),
    ] = None,
    exit_with_parent: Annotated[
        bool,
        typer.Option(
            help="Exit when the process that started this server dies (launchers set it, so a "
            "trainer killed with SIGKILL leaves no server behind)."
        ),
    ] = False,
) -> None:
    """Serve MODEL with the in-process engine behind SGLang's native API (/generate, /update_weights_from_disk,
    ...) and OpenAI's (/v1/chat/completions, /v1/completions, /v1/models).

    Talk to it with `asearch.engine.sglang.SGLangEngine(url)`, or any OpenAI client at URL/v1; see
    docs/engines-remote.md.
    """
    import os

    import torch

    from asearch.engine.inprocess import InProcessEngineConfig
    from asearch.engine.server import build_server, run_engine_server
    from asearch.net import free_port, is_loopback

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    port = port or free_port(host)
    cfg = InProcessEngineConfig(
        threads=threads,
        max_batch=max_batch,
        max_seq_len=max_seq_len,
        device=device,
        dtype=dtype,
        prefix_cache_mb=prefix_cache_mb,
        seed=seed,
    )
    with console.status(f"loading {escape(model)}"):
        server = build_server(
            model, cfg=cfg, weight_version=weight_version, served_model_name=served_model_name
        )
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
        f"{escape(model)}, {threads} thread(s), max_batch {max_batch}, weight_version {escape(weight_version)}",
        soft_wrap=True,
    )
    console.print(
        f"OpenAI API at [bold]{escape(url)}/v1[/bold] as model [bold]{escape(server.served_model_name)}[/bold]",
        soft_wrap=True,
    )
    if exit_with_parent:
        _exit_with_parent()
    run_engine_server(server, host=host, port=port)


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
        logging.getLogger("asearch.engine.server").warning("parent process %d is gone: shutting down", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
