"""`asearch eval` as a user runs it: the real command in a subprocess, a real (tiny, random) model in the
in-process engine, real BM25 tools over the world, a built-in question set; then --aggregate-only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    import torch

    from asearch.corpus.world import WorldCorpus
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    tok = train_bpe_tokenizer((d.title + "\n" + d.text for d in WorldCorpus(1000, 300).documents()), vocab_size=400)
    return save_tiny(build_tiny_model(tok, hidden=32, layers=1, heads=2, seed=0), tok, tmp_path_factory.mktemp("m") / "tiny")


def _eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "asearch", "eval", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_eval_builtin_world_set_with_a_tiny_model(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = [
        "--dataset", "world:n=6,entities=300,hops=1-2", "--k", "2", "--out", str(out), "--no-progress",
        f"engine.model={tiny_dir}", "tools.corpus=world:seed=1000,entities=300",
        "agent.max_turns=3", "agent.max_new_tokens=8",
    ]  # fmt: skip
    done = _eval(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    results = [json.loads(line) for f in sorted(out.glob("**/*.jsonl")) for line in f.read_text().splitlines()]
    results = [r for r in results if "trajectory" in r]
    assert len(results) == 6 * 2  # every question, every pass, each once
    assert len({(r["id"], r["seed"]) for r in results}) == 12
    for r in results:  # the full trajectory of a real model is kept: tokens, mask, log-probs, versions
        seg = r["trajectory"]["segments"][0]
        assert len(seg["token_ids"]) == len(seg["loss_mask"]) == len(seg["logprobs"]) and sum(seg["loss_mask"]) > 0
        assert any(lp < 0 for lp, m in zip(seg["logprobs"], seg["loss_mask"], strict=True) if m)
    summary = json.loads((out / "summary.json").read_text())
    (ds,) = summary["datasets"].values()
    assert ds["n"] == 6 and ds["incomplete"] == 0
    for metric in ("em", "f1", "cem"):  # Avg@k and Pass@k, each with its bootstrap interval
        for agg in ("avg_at_k", "pass_at_k"):
            m = ds["metrics"][metric][agg]
            assert m["n"] == 6 and m["low"] <= m["mean"] <= m["high"]
    assert (out / "summary.md").exists()

    # --aggregate-only recomputes the same summary from the results on disk, running nothing
    again = _eval(*args, "--aggregate-only", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    strip = lambda s: {k: v for k, v in s.items() if "time" not in k and "wall" not in k}  # noqa: E731
    assert strip(json.loads((out / "summary.json").read_text())) == strip(summary)
