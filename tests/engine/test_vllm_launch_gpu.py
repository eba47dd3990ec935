"""The vLLM launcher's settings per device, checked on the command line and environment it builds (no GPU
and no server needed): CUDA settings (bfloat16, CUDA graphs, GPU memory share, tensor parallelism, a GPU of
its own per rollout server) only on cuda, the CPU ones (float32, --enforce-eager, VLLM_CPU_*) only on cpu,
and 'auto' read from the vLLM interpreter's installed build."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.remote.pool import RolloutServersConfig
from asearch.engine.remote.vllm import (
    WORKER_EXTENSION,
    WORKER_EXTENSION_DIR,
    VLLMServerConfig,
    installed_vllm_version,
    server_gpus,
    vllm_device,
    vllm_server_command,
    vllm_server_env,
    vllm_server_supervisor,
)
from asearch.engine.supervisor import SupervisorConfig
from asearch.errors import RemoteError
from asearch.launch.local import rollout_server_supervisor
from asearch.launch.spec import Allocation

ROOT = Path(__file__).resolve().parents[2]
CPU_ONLY_VARS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING")


def flag(cmd: list[str], name: str) -> str | None:
    """The value after `name` in `cmd`, or None when the flag is absent."""
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_cuda_command_has_gpu_settings_and_no_cpu_ones() -> None:
    server = VLLMServerConfig(device="cuda", gpu_memory_utilization=0.55, tensor_parallel_size=2)
    cmd = vllm_server_command("models/m", port=8001, python="vllm-py", server=server, max_model_len=4096)
    assert cmd[:3] == ["vllm-py", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(cmd, "--dtype") == "bfloat16"
    assert "--enforce-eager" not in cmd  # CUDA graphs
    assert flag(cmd, "--gpu-memory-utilization") == "0.55" and flag(cmd, "--tensor-parallel-size") == "2"
    assert "--distributed-executor-backend" not in cmd  # vLLM picks uni for one GPU, mp for several
    assert flag(cmd, "--max-model-len") == "4096" and flag(cmd, "--model") == "models/m"
    assert flag(cmd, "--worker-extension-cls") == WORKER_EXTENSION
    assert flag(cmd, "--logprobs-mode") == "processed_logprobs" and flag(cmd, "--generation-config") == "vllm"
    env = vllm_server_env(device="cuda")
    assert not set(CPU_ONLY_VARS) & set(env)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(WORKER_EXTENSION_DIR)


def test_cpu_command_has_cpu_settings_and_no_gpu_ones() -> None:
    cmd = vllm_server_command("m", port=8002, python="vllm-py", server=VLLMServerConfig(device="cpu"))
    assert flag(cmd, "--dtype") == "float32" and "--enforce-eager" in cmd
    assert flag(cmd, "--distributed-executor-backend") == "uni"
    assert "--gpu-memory-utilization" not in cmd and "--tensor-parallel-size" not in cmd
    assert flag(cmd, "--worker-extension-cls") == WORKER_EXTENSION
    env = vllm_server_env(device="cpu", kv_cache_gib=3, omp_threads_bind="2-3")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_SERVER_DEV_MODE"] == "1"


def test_explicit_settings_win_over_the_device_defaults() -> None:
    on_gpu = VLLMServerConfig(
        device="cuda", dtype="float16", enforce_eager=True, extra_args=["--max-num-seqs", "8"]
    )
    cmd = vllm_server_command("m", port=1, python="py", server=on_gpu, extra_args=["--seed", "3"])
    assert flag(cmd, "--dtype") == "float16" and "--enforce-eager" in cmd
    assert cmd[-4:] == ["--max-num-seqs", "8", "--seed", "3"]
    on_cpu = VLLMServerConfig(device="cpu", dtype="bfloat16", enforce_eager=False)
    cmd = vllm_server_command("m", port=1, python="py", server=on_cpu)
    assert flag(cmd, "--dtype") == "bfloat16" and "--enforce-eager" not in cmd


def test_server_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMServerConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="device"):
        VLLMServerConfig(device="tpu")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        RolloutServersConfig(kind="vllm", vllm={"tensor_parallel_size": 0})


def _fake_distribution(root: Path, name: str, version: str) -> Path:
    """A real installed-package record (dist-info) that importlib.metadata reads like pip's."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize(
    ("name", "version", "device"),
    [("vllm", "0.11.0", "cuda"), ("vllm", "0.11.0+cpu", "cpu"), ("vllm-cpu", "0.32.0", "cpu")],
)
def test_auto_device_follows_the_installed_build(name, version, device, tmp_path, monkeypatch) -> None:
    """'auto' reads the vLLM distribution of the interpreter (a real python with a real dist-info on its
    path; its version's "+cpu" or the vllm-cpu name mean cpu, as in vLLM's own platform check)."""
    monkeypatch.setenv("PYTHONPATH", str(_fake_distribution(tmp_path, name, version)))
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    installed_vllm_version.cache_clear()
    try:
        assert vllm_device("auto", sys.executable) == device
        assert vllm_device("cpu", sys.executable) == "cpu" and vllm_device("cuda", sys.executable) == "cuda"
        cmd = vllm_server_command("m", port=1, python=sys.executable)
        assert flag(cmd, "--dtype") == ("bfloat16" if device == "cuda" else "float32")
        monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # vLLM's own override
        assert vllm_device("auto", sys.executable) == "cpu"
    finally:
        installed_vllm_version.cache_clear()


def test_auto_device_of_an_interpreter_without_vllm_says_how_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # this venv has no vllm distribution
    installed_vllm_version.cache_clear()
    try:
        with pytest.raises(RemoteError, match=r"has no vLLM .*install_vllm_cpu\.sh.*ASEARCH_VLLM_PYTHON"):
            vllm_device("auto", sys.executable)
    finally:
        installed_vllm_version.cache_clear()


def test_auto_device_of_the_vllm_cpu_venv() -> None:
    python = os.environ.get("ASEARCH_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(f"no vLLM python at {python} (scripts/install_vllm_cpu.sh creates it)")
    installed_vllm_version.cache_clear()
    assert "cpu" in installed_vllm_version(python) and vllm_device("auto", python) == "cpu"


def test_each_rollout_server_gets_gpus_of_its_own() -> None:
    assert [server_gpus(i, 1, None) for i in range(3)] == ["0", "1", "2"]
    assert [server_gpus(i, 2, None) for i in range(2)] == ["0,1", "2,3"]
    assert [server_gpus(i, 2, "4, 5,6,7") for i in range(2)] == ["4,5", "6,7"]
    assert server_gpus(1, 1, "3") == "3"  # a Ray actor sees only the GPU it reserved


def _rollout_server(
    tmp_path: Path, index: int, vllm: dict, engine: InProcessEngineConfig
) -> tuple[list, dict]:
    """(command, env) of rollout server `index` as the local and ray launchers build it (not started)."""
    servers = RolloutServersConfig(kind="vllm", model_name="policy", vllm=vllm)
    allocation = Allocation(rollout_servers=2, server_threads=1)
    sup, url = rollout_server_supervisor(
        "models/policy", index, allocation, servers, engine, seed=0, log_path=tmp_path / "r.log",
        cfg=SupervisorConfig(), cores=2,
    )  # fmt: skip
    assert url.startswith("http://127.0.0.1:") and flag(sup.command, "--served-model-name") == "policy"
    return sup.command, sup.env


def test_launched_rollout_servers_on_cuda_and_on_cpu(tmp_path, monkeypatch) -> None:
    """rollout_servers.vllm reaches the servers a launcher starts: on cuda each gets its own GPUs and CUDA
    settings, on cpu its own core and the CPU settings; the in-process engine's dtype, when set, wins."""
    monkeypatch.setenv("ASEARCH_VLLM_PYTHON", sys.executable)  # only written into the command: never run
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engine = InProcessEngineConfig(max_seq_len=2048)
    cmd, env = _rollout_server(tmp_path, 1, {"device": "cuda", "tensor_parallel_size": 2}, engine)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and not set(CPU_ONLY_VARS) & set(env)
    assert flag(cmd, "--dtype") == "bfloat16" and "--enforce-eager" not in cmd
    assert flag(cmd, "--tensor-parallel-size") == "2" and flag(cmd, "--max-model-len") == "2048"

    cmd, env = _rollout_server(tmp_path, 1, {"device": "cpu", "kv_cache_gib": 2}, engine)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in env and "--gpu-memory-utilization" not in cmd
    assert flag(cmd, "--dtype") == "float32" and "--enforce-eager" in cmd

    bf16 = InProcessEngineConfig(max_seq_len=2048, dtype="bfloat16")
    cmd, _ = _rollout_server(tmp_path, 0, {"device": "cpu"}, bf16)
    assert flag(cmd, "--dtype") == "bfloat16"
    cmd, _ = _rollout_server(tmp_path, 0, {"device": "cuda", "dtype": "float16"}, bf16)
    assert flag(cmd, "--dtype") == "float16"  # the server's own setting first


def test_supervisor_resolves_auto_once_so_command_and_env_agree(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_fake_distribution(tmp_path / "site", "vllm", "0.11.0")))
    installed_vllm_version.cache_clear()
    try:
        sup, _ = vllm_server_supervisor("m", log_path=tmp_path / "l.log", python=sys.executable, port=9)
        assert flag(sup.command, "--gpu-memory-utilization") == "0.9"
        assert not set(CPU_ONLY_VARS) & set(sup.env)
    finally:
        installed_vllm_version.cache_clear()


def test_worker_extension_finds_modules_that_share_weights() -> None:
    """The extension re-processes exactly the modules holding a shared Parameter (a tied LM head and its
    embedding), none in an untied model. It imports nothing of asearch: vLLM's interpreter loads it."""
    torch = pytest.importorskip("torch")
    from asearch.engine.vllm_ext.asearch_vllm_ext import modules_sharing_parameters

    source = (WORKER_EXTENSION_DIR / "asearch_vllm_ext.py").read_text()
    assert "asearch." not in source.replace("asearch_", "")

    class Tiny(torch.nn.Module):
        def __init__(self, tie: bool):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.body = torch.nn.Linear(4, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            if tie:
                self.lm_head.weight = self.embed.weight

    assert [name for name, _ in modules_sharing_parameters(Tiny(tie=True))] == ["embed", "lm_head"]
    assert modules_sharing_parameters(Tiny(tie=False)) == []
