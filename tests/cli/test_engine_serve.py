"""`asearch engine serve` (cli/engine.py) takes the in-process engine's `engine.*` options as `asearch train` does, and
a launched rollout server of kind sglang gets every one of the run's options through the kind's typed serve hook."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearch.cli.engine import serve_options
from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.registry import ServerLaunch, engine_kind
from asearch.engine.supervisor import SupervisorConfig
from asearch.errors import ConfigError


def test_serve_takes_engine_overrides_and_the_older_flags() -> None:
    cfg = serve_options("m", ["engine.max_batch=8", "--threads", "2", "--prefill-chunk=128", "engine.dtype=float32"])
    assert (cfg.max_batch, cfg.threads, cfg.prefill_chunk, cfg.dtype) == (8, 2, 128, "float32")
    assert serve_options("m", []) == InProcessEngineConfig()  # the in-process engine's defaults
    with pytest.raises(ConfigError, match="did you mean 'engine.max_batch'"):
        serve_options("m", ["engine.max_bach=8"])
    with pytest.raises(ConfigError, match="engine.KEY=VALUE"):
        serve_options("m", ["max_batch=8"])


def test_a_launched_rollout_server_gets_every_engine_option(tmp_path: Path) -> None:
    """prefill_chunk and max_prefill_tokens reached no server launcher=local started before the hook passed
    the whole options model: the server's argv, read back as `asearch engine serve` reads it, is the run's."""
    run_engine = InProcessEngineConfig(
        max_batch=16, max_seq_len=4096, prefill_chunk=256, max_prefill_tokens=2048, dtype="float32", threads=4,
        prefix_cache_mb=0.0, cuda_graphs=False,
    )  # fmt: skip
    launch = ServerLaunch("models/tiny", 2, run_engine, None, 10, tmp_path / "log", SupervisorConfig(), threads=1)
    serve = engine_kind("sglang").serve
    assert serve is not None
    sup, url = serve(launch)
    argv = sup.command
    assert argv[1:6] == ["-m", "asearch", "engine", "serve", "models/tiny"] and url.startswith("http://127.0.0.1:")
    options = [a for a in argv[6:] if a.startswith("engine.")]
    served = serve_options("models/tiny", options)
    assert served == run_engine.model_copy(update={"threads": 1, "seed": 12})  # the allocation's threads, seed + index
    assert "--exit-with-parent" in argv and argv[argv.index("--weight-version") + 1] == "0"
