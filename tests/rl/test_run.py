"""`asearch train` end to end in a real subprocess: checkpoints, kill -9, resume. Nothing is trained twice,
nothing is lost, the staleness accounting and the bound survive the restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
WORLD = "world:seed=1,entities=200"
B, N, ETA = 2, 2, 2


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen2 whose tokenizer knows the world's pages (random: rewards are all 0, so the
    test keeps zero-variance groups to make steps; learning is the demo's job, not this test's)."""
    from asearch.corpus.world import WorldCorpus
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    texts = (d.title + "\n" + d.text for d in WorldCorpus(1, 200).documents())
    tok = train_bpe_tokenizer(texts, vocab_size=400)
    model = build_tiny_model(tok, hidden=32, layers=1, heads=2, max_positions=512, seed=0)
    return save_tiny(model, tok, tmp_path_factory.mktemp("tiny") / "model")


def _cmd(model: Path, out: Path, steps: int) -> list[str]:
    return [
        sys.executable, "-m", "asearch", "train", str(ROOT / "configs" / "train-world-tiny.yaml"),
        f"model={model}", f"out={out}", f"steps={steps}", "checkpoint_every=2", "keep_checkpoints=2",
        f"data={WORLD},n=30", f"tools.corpus={WORLD}", "heldout.dataset=null", "max_rl_seconds=null",
        f"rollout.batch_size={B}", f"rollout.group_size={N}", f"rollout.max_staleness={ETA}",
        "rollout.max_concurrent=4", "rollout.drop_zero_variance=false",
        "agent.max_turns=2", "agent.max_new_tokens=6", "engine.max_seq_len=512", "agent.max_context_tokens=512",
        "log_trajectories_every=1",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def test_kill_9_then_resume_trains_every_step_once_and_loses_nothing(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "run"
    # 1. a run that would go on for long; killed with SIGKILL once its second checkpoint exists
    proc = subprocess.Popen(_cmd(tiny_model_dir, out, 1000), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    try:
        while not (out / "checkpoints" / "step_4" / "state.json").exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint step_4 in 300 s"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    steps_before_kill = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    ckpts = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*") if (p / "state.json").exists())
    resume_from = ckpts[-1]
    assert 4 <= resume_from < 10, ckpts

    # 2. the same command (10 steps now) resumes from the last checkpoint and finishes
    done = subprocess.run(_cmd(tiny_model_dir, out, 10), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = (done.stdout + done.stderr).replace("\n", "")
    assert "resumed from" in said and f"step_{resume_from} (step {resume_from}," in said, said[-2000:]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, 11)), f"before kill {steps_before_kill}, after resume {steps}"
    # the wall clock continues across the restart instead of starting again at 0
    assert all(a["wall_s"] <= b["wall_s"] for a, b in zip(rows, rows[1:], strict=False))
    # the staleness bound held in every trained batch, before and after the kill
    assert max(r["rollout/staleness_max"] for r in rows) <= ETA
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["policy_version"] == 10

    # 3. the accounting at the end: every question taken from the data stream was trained, rejected, is
    # queued or will be redone; the admission counter is exactly v * B + queued (not reset by the restart)
    state = json.loads((out / "checkpoints" / "step_10" / "state.json").read_text())
    ctl = state["controller"]
    assert ctl["staleness"]["version"] == 10
    assert ctl["staleness"]["accepted"] == 10 * B + len(ctl["ready"])
    assert ctl["data_position"] == 10 * B + sum(ctl["rejected"].values()) + len(ctl["ready"]) + len(ctl["redo"])
    # every logged trajectory (one group per step) has its n samples and a reward
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted({t["step"] for t in trajs}) == list(range(1, 11))
    assert all(t["reward"] is not None for t in trajs) and len(trajs) == 10 * N
