"""The `sglang-server` rollout kind: the SGLang command line a launcher runs, its refusals before anything starts, and
a launch through the serve hook. SGLang has no CPU build to install here, so the launch runs a stand-in
`sglang.launch_server` (tests/engine/sglang_standin) that parses SGLang's flags and serves the model with
`asearch engine serve` (the same native API)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.registry import ServerLaunch, engine_kind, engine_kinds
from asearch.engine.remote.sglang_server import SGLangServerConfig, serve_sglang_server, sglang_server_command
from asearch.engine.supervisor import SupervisorConfig
from asearch.errors import LaunchError

STANDIN = Path(__file__).parent / "sglang_standin"


def test_the_command_carries_the_run_settings() -> None:
    server = SGLangServerConfig(tp_size=2, mem_fraction_static=0.8, cuda_graphs=False, extra_args=["--attention-backend", "fa3"])
    cmd = sglang_server_command(
        "/m/qwen", port=31000, host="10.0.0.2", server=server, device="cuda", context_length=32768, seed=7,
        served_model_name="policy",
    )  # fmt: skip
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--model-path"] == "/m/qwen" and flags["--host"] == "10.0.0.2" and flags["--port"] == "31000"
    assert flags["--tp-size"] == "2" and flags["--context-length"] == "32768" and flags["--random-seed"] == "7"
    assert flags["--weight-version"] == "0" and flags["--mem-fraction-static"] == "0.8"
    assert "--disable-cuda-graph" in cmd and cmd[-2:] == ["--attention-backend", "fa3"]


def test_it_is_a_registered_rollout_kind() -> None:
    assert "sglang-server" in engine_kinds(rollouts=True)
    assert engine_kind("sglang-server").serve is serve_sglang_server


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_a_machine_without_a_gpu_is_told_which_kind_to_use(tmp_path) -> None:
    with pytest.raises(LaunchError, match="rollout_servers.kind=sglang "):
        serve_sglang_server(ServerLaunch("m", 0, InProcessEngineConfig(), None, 0, tmp_path / "log", SupervisorConfig()))


def test_an_interpreter_without_sglang_is_refused_before_launch(tmp_path) -> None:
    options = SGLangServerConfig(device="cpu", python=sys.executable)
    with pytest.raises(LaunchError, match="cannot import sglang"):
        serve_sglang_server(ServerLaunch("m", 0, InProcessEngineConfig(), options, 0, tmp_path / "log", SupervisorConfig()))


@pytest.mark.server
def test_a_launched_server_serves_version_0_at_the_run_context(tiny_world_model_dir, tmp_path) -> None:
    from asearch.engine.remote.sglang import SGLangEngine
    from asearch.engine.types import GenerateRequest, SamplingParams

    python = tmp_path / "python-with-sglang"  # an interpreter that finds the stand-in package
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{STANDIN}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    argv_log = tmp_path / "argv.jsonl"
    options = SGLangServerConfig(device="cpu", python=str(python), dtype="float32")
    sup, url = serve_sglang_server(ServerLaunch(
        str(tiny_world_model_dir), 1, InProcessEngineConfig(max_seq_len=384), options, 5, tmp_path / "server.log",
        SupervisorConfig(health_timeout_s=120),
    ))  # fmt: skip
    sup.env = {**(sup.env or {}), "SGLANG_STANDIN_ARGV": str(argv_log), "OMP_NUM_THREADS": "1"}
    try:
        sup.start()
        engine = SGLangEngine(url)
        request = GenerateRequest(input_ids=[5, 6, 7, 8], sampling=SamplingParams(max_new_tokens=4, seed=0))
        resp = asyncio.run(engine.generate(request))
        assert len(resp.output_ids) == 4 and set(resp.output_versions) == {0}
    finally:
        sup.stop()
    argv = json.loads(argv_log.read_text().splitlines()[0])
    flags = dict(zip(argv[::2], argv[1::2], strict=False))
    assert flags["--context-length"] == "384" and flags["--random-seed"] == "6" and flags["--device"] == "cpu"
    assert os.path.samefile(flags["--model-path"], tiny_world_model_dir)
