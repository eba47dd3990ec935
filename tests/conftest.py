"""Fixtures shared across test packages: a tiny random model for the world, real `asearch train` runs, and a
search index over a handful of hand-written documents."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN_WORLD = "world:seed=1,entities=200"


class CharTokenizer:
    """One token per character (no eos): the part of a HF tokenizer the agent loop and the scripted engine
    use, with no transformers import and no model."""

    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@pytest.fixture(scope="session")
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def make_tokenizer() -> Callable[..., Any]:
    """`make_tokenizer(texts, vocab_size=300)`: a byte-level BPE tokenizer (with the ChatML template) trained on
    `texts`, built once per distinct (texts, vocab_size) in the session: do not change the one you get."""
    from asearch.models.tiny import train_bpe_tokenizer

    built: dict[tuple[tuple[str, ...], int], Any] = {}

    def make(texts: Iterable[str], vocab_size: int = 300) -> Any:
        key = (tuple(texts), vocab_size)
        if key not in built:
            built[key] = train_bpe_tokenizer(list(key[0]), vocab_size=vocab_size)
        return built[key]

    return make


@pytest.fixture(scope="session")
def make_tiny_model() -> Callable[..., Any]:
    """`make_tiny_model(tokenizer, **shape)`: a new random tiny Qwen2 for `tokenizer` (one layer, d=32, two
    heads, seed 0 unless `shape` says otherwise: build_tiny_model's keywords), on one torch thread."""
    pytest.importorskip("torch")
    import torch

    from asearch.models.tiny import build_tiny_model

    def make(tokenizer: Any, **shape: Any) -> Any:
        torch.set_num_threads(1)
        return build_tiny_model(tokenizer, **{"hidden": 32, "layers": 1, "heads": 2, "seed": 0, **shape})

    return make


@pytest.fixture(scope="module")
def tiny_policy(make_tokenizer, make_tiny_model):
    """(tokenizer, a two-layer tiny Qwen2 in eval mode): the trainer tests' policy. Module-scoped: copy the
    model before training it."""
    tok = make_tokenizer(["the cat sat on the mat", "a dog ran in the park"] * 50)
    return tok, make_tiny_model(tok, layers=2).eval()


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny byte-level BPE tokenizer (with the ChatML template) saved alone, no model: for a scripted
    engine's `engine.model` in a command line."""
    pytest.importorskip("torch")
    from asearch.models.tiny import train_bpe_tokenizer

    texts = ["Ada Varn was born in Oslen.", "<search> a</search><answer> b</answer> the world"] * 20
    directory = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(texts, vocab_size=300).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_world_model_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen2 whose tokenizer knows the world's pages. Random: its rewards are all 0, so runs
    made with it keep zero-variance groups to make steps (learning is the demo's job, not these tests')."""
    pytest.importorskip("torch")
    return _save_world_model(tmp_path_factory.mktemp("tiny") / "model", hidden=32, heads=2, max_positions=512)


@pytest.fixture(scope="session")
def save_world_model() -> Callable[..., Path]:
    """`save_world_model(directory, **shape)`: a world model of another shape than `tiny_world_model_dir`."""
    pytest.importorskip("torch")
    return _save_world_model


def _save_world_model(directory: Path, **shape) -> Path:
    """A random one-layer tiny Qwen2 of `shape` (build_tiny_model's keywords) whose tokenizer knows the
    training world's pages, saved as an HF directory."""
    import torch

    from asearch.corpus.world import WorldCorpus
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    texts = (d.title + "\n" + d.text for d in WorldCorpus(1, 200).documents())
    tok = train_bpe_tokenizer(texts, vocab_size=400)
    return save_tiny(build_tiny_model(tok, layers=1, seed=0, **shape), tok, directory)


@pytest.fixture(scope="session")
def train_command() -> Callable[..., list[str]]:
    """`asearch train configs/train-world-tiny.yaml ...` sized to run in seconds on the tiny model."""

    def command(
        model: Path, out: Path, steps: int, *, batch: int = 2, group: int = 2, eta: int = 2
    ) -> list[str]:
        return [
            sys.executable, "-m", "asearch", "train", str(ROOT / "configs" / "train-world-tiny.yaml"),
            f"model={model}", f"out={out}", f"steps={steps}", "checkpoint_every=2", "keep_checkpoints=2",
            f"data={TRAIN_WORLD},n=30", f"tools.corpus={TRAIN_WORLD}", "heldout.dataset=null", "max_rl_seconds=null",
            f"rollout.batch_size={batch}", f"rollout.group_size={group}", f"rollout.max_staleness={eta}",
            "rollout.max_concurrent=4", "rollout.drop_zero_variance=false",
            "agent.max_turns=2", "agent.max_new_tokens=6", "engine.max_seq_len=512", "agent.max_context_tokens=512",
            "log_trajectories_every=1",
        ]  # fmt: skip

    return command


@pytest.fixture(scope="session")
def run_ranks() -> Callable[[Path, Path, int], float]:
    """`run_ranks(script, arg, world)`: `python script arg` as `world` gloo ranks with torchrun's variables, on
    the CPU even on a GPU machine; every rank must exit 0 (its log tail otherwise). Returns the seconds taken."""

    def run(script: Path, arg: Path, world: int) -> float:
        import subprocess
        import time

        from asearch.net import free_port

        port, start = str(free_port()), time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(arg)],
                env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            for r in range(world)
        ]
        try:
            logs = [p.communicate(timeout=400)[0].decode(errors="replace") for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
            assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-4000:]}"
        return time.monotonic() - start

    return run


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """The environment for the asearch subprocesses of a test: one torch thread each, no hub."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


class _MiniCorpus:
    """(title, text) documents as a corpus source, each at https://mini.example/wiki/<Title>."""

    def __init__(self, name: str, docs: list[tuple[str, str]]):
        self.name, self.docs = name, docs

    def documents(self):
        from asearch.corpus.types import Document

        for i, (title, text) in enumerate(self.docs):
            yield Document(id=str(i), title=title, text=text, url=f"https://mini.example/wiki/{title.replace(' ', '_')}")

    def pages(self):
        from asearch.corpus.types import Page

        for d in self.documents():
            yield Page(url=d.url, title=d.title, contents=d.text)

    def fingerprint(self) -> str:
        return f"{self.name}-v1"


def _build_mini_index(out: Path, name: str, docs: list[tuple[str, str]]) -> Path:
    from asearch.retrieval.index import IndexConfig, build_index

    build_index(_MiniCorpus(name, docs), out, IndexConfig(), progress=False)
    return out


@pytest.fixture(scope="session")
def build_mini_index() -> Callable[[Path, str, list[tuple[str, str]]], Path]:
    """`build_mini_index(out, name, docs)`: a BM25 index in `out` over (title, text) documents; returns `out`."""
    return _build_mini_index
