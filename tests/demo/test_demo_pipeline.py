"""`asearch demo` end to end at toy sizes: every stage runs and every promised file is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")


TOY = [
    "world_entities=150", "heldout_entities=150", "train_questions=30", "rl_questions=6", "heldout_questions=9",
    "heldout_during_rl=3", "expert_episodes=30", "vocab_size=400", "hidden=32", "layers=1", "heads=2",
    "sft.steps=3", "sft.batch_size=4", "train_worlds=2", "rl.max_rl_seconds=15", "rl.steps=2", "rl.heldout.every_s=1",
    "setup_threads=1", "rl.rollout.batch_size=1", "rl.rollout.group_size=2", "rl.rollout.max_concurrent=2",
    "rl.agent.max_turns=3",
    "rl.rollout.drop_zero_variance=false",  # an untrained toy model earns 0 everywhere: keep its groups
]  # fmt: skip


def _demo(out: Path, *overrides: str, seed: int = 3) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "asearch", "demo", "--seed", str(seed), "--out", str(out), *TOY, *overrides],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize(("tokenizer", "rl_seconds"), [("bpe", "15"), ("word", "null")])
def test_demo_writes_summary_plot_report_and_rl_run(tmp_path: Path, tokenizer: str, rl_seconds: str) -> None:
    """Both tokenizers; RL bounded by steps and time, or by steps alone (`rl.max_rl_seconds=null`)."""
    out = tmp_path / "demo"
    done = _demo(out, f"tokenizer={tokenizer}", f"rl.max_rl_seconds={rl_seconds}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    bound = "2 steps or 15s" if rl_seconds == "15" else "2 steps\n"
    assert f"asynchronous RL for up to {bound}" in done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in ("seed", "heldout_acc_before", "heldout_acc_after", "rl_wall_seconds", "wall_seconds"):
        assert key in summary, key
    assert summary["seed"] == 3 and 0 <= summary["heldout_acc_before"] <= 1 and 0 <= summary["heldout_acc_after"] <= 1
    assert 0 < summary["rl_wall_seconds"] <= summary["wall_seconds"]
    assert (out / "curve.png").read_bytes().startswith(b"\x89PNG")
    report = (out / "report.md").read_text()
    assert f"{summary['heldout_acc_before']:.3f}" in report and "curve.png" in report
    assert (out / "model-sft" / "config.json").exists() and (out / "rl" / "metrics.jsonl").exists()
    assert "30 expert episodes on 2 world(s)" in done.stdout + done.stderr
    # the held-out questions come from another world than the training ones (no shared names)
    train = [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (out / "data" / "heldout.jsonl").read_text().splitlines()]
    assert train and held and not {q["question"] for q in train} & {q["question"] for q in held}
    # RL asks questions the expert (SFT) episodes never did
    rl = [json.loads(line) for line in (out / "data" / "rl.jsonl").read_text().splitlines()]
    asked = lambda qs: {(q["metadata"]["corpus"], q["question"]) for q in qs}  # noqa: E731
    assert len(rl) == 2 * 6 and not asked(rl) & asked(train)
    assert f"{tokenizer} tokenizer" in done.stdout + done.stderr


def test_an_interrupted_demo_resumes_from_its_supervised_start(tmp_path: Path) -> None:
    """A run killed during RL keeps its supervised start: the same command skips worlds, expert and SFT, and RL
    resumes from its checkpoint. Other settings on that directory are refused; a finished run is not redone."""
    out = tmp_path / "demo"
    first = _demo(out, "setup_threads=2")  # the set-up in two worker processes
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    sft_state = json.loads((out / "model-sft" / "sft.json").read_text())
    assert {"setup_seconds", "sft_seconds", "heldout_acc_before"} <= set(sft_state)
    (out / "summary.json").unlink()  # as if killed after its RL checkpoint, before the end
    again = _demo(out, "setup_threads=2")
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    assert "resuming" in said and "expert episodes" not in said and "sft step" not in said
    assert "resumed from" in said  # RL: from rl/checkpoints
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] is True and summary["heldout_acc_before"] == sft_state["heldout_acc_before"]
    finished = _demo(out, "setup_threads=2")
    assert finished.returncode == 0 and "finished run" in finished.stdout + finished.stderr
    other = _demo(out, "setup_threads=2", "p_skip=0.5")
    assert other.returncode != 0 and "p_skip: 0.6 -> 0.5" in other.stdout + other.stderr


def test_split_per_hop_takes_the_last_questions_of_each_hop_count() -> None:
    from asearch.demo.pipeline import _split_per_hop
    from asearch.demo.worlds import world_records

    recs = world_records(1, 300, 12, (1, 2, 3), "t", names=9)
    rest, last = _split_per_hop(recs, 1)
    assert [r.metadata["hops"] for r in last] == [1, 2, 3] and len(rest) == 9
    assert {r.question for r in rest}.isdisjoint({r.question for r in last}) and len({r.question for r in recs}) == 12
    assert _split_per_hop(recs, 10)[0] == []  # fewer than asked: all of them go to the second part


def test_demo_worlds_can_share_one_name_pool() -> None:
    """`names=N`: the training and held-out questions point at worlds that draw names from world N."""
    from asearch.demo.worlds import world_records

    train = world_records(1, 300, 9, (1, 2, 3), "t", names=9)
    held = world_records(128, 300, 9, (1, 2, 3), "h", names=9)
    assert {r.metadata["corpus"] for r in train} == {"world:seed=1,entities=300,names=9"}
    assert {r.metadata["corpus"] for r in held} == {"world:seed=128,entities=300,names=9"}
    assert len(train) == len(held) == 9


def test_name_answers_keeps_only_questions_answered_by_an_entity() -> None:
    """`name_answers`: every question's last hop is a relation (its answer a page's title), hops stay balanced."""
    from asearch.corpus.world import RELATIONS
    from asearch.demo.worlds import world_records

    recs = world_records(1, 600, 30, (1, 2, 3), "t", names=9, pages="facts", name_answers=True)
    assert len(recs) == 30 and sorted({r.metadata["hops"] for r in recs}) == [1, 2, 3]
    assert all(r.metadata["path"][-1] in RELATIONS and not r.golds[0][:1].isdigit() for r in recs)
    every = world_records(1, 600, 30, (1, 2, 3), "t", names=9, pages="facts")
    assert any(r.metadata["path"][-1] not in RELATIONS for r in every)  # attribute answers without it


def test_the_long_preset_trains_access_and_reading_turns(tmp_path: Path) -> None:
    """`--preset long` at toy sizes: long pages opened with access and read chunk by chunk in RL too, and the
    summary, report and viewer files carry the long-horizon figures."""
    out = tmp_path / "long"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    toy = [o for o in TOY if not o.startswith(("rl.agent.max_turns", "world_entities", "heldout_entities"))]
    done = subprocess.run(
        [sys.executable, "-m", "asearch", "demo", "--preset", "long", "--seed", "3", "--out", str(out), *toy,
         "world_entities=400", "heldout_entities=400", "train_questions=12", "heldout_questions=12", "expert_episodes=24",
         "rl.agent.max_turns=12", "rl.tools.search.topk=2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {"heldout_mean_turns_after", "heldout_access_rate_correct", "horizon", "horizon_before"} <= set(summary)
    assert set(summary["horizon"]["accuracy_by_hops"]) == {"1", "2", "3", "4", "5", "6"}
    assert (out / "horizon.png").read_bytes().startswith(b"\x89PNG")
    assert "(long preset)" in (out / "report.md").read_text()
    rows = [json.loads(line) for line in (out / "heldout_after.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all("compactions" in r for r in rows)
    config = (out / "rl" / "config.yaml").read_text()
    assert "chunks_per_call: 1" in config and "reading_turns: true" in config and "compact_when: full" in config
    steps = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in steps if "rollout/reward_mean" in m]
    assert trained and all({"rollout/tool_calls/accesses", "rollout/read_turns_mean", "rollout/compactions_mean"} <= set(m) for m in trained)


def test_the_demo_trains_a_given_pretrained_model_with_lora(tmp_path: Path, save_world_model) -> None:
    """`model=DIR` (what `--preset smollm2` does with SmolLM2): that model and its tokenizer are warm-started and
    trained instead of a tiny one, here with LoRA in SFT and RL; the run ends with a loadable policy directory
    holding the merged weights and the adapters, and RL checkpoints hold the adapters alone."""
    pytest.importorskip("peft")
    given = save_world_model(tmp_path / "given", hidden=32, heads=2, max_positions=512)
    out = tmp_path / "demo"
    done = _demo(out, f"model={given}", "sft.lora.r=2", "rl.trainer.lora.r=2")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert f"{given}: its tokenizer" in said and "bpe tokenizer" not in said
    import torch

    from asearch.models.loading import load_model

    sft_model = load_model(out / "model-sft")
    start = load_model(given)
    assert sft_model.config.hidden_size == 32 and not any("lora" in n for n, _ in sft_model.named_parameters())
    assert not torch.equal(sft_model.model.layers[0].self_attn.q_proj.weight, start.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(sft_model.model.embed_tokens.weight, start.model.embed_tokens.weight)  # not a LoRA target
    policy = out / "rl" / "policy"
    assert (policy / "adapter" / "adapter_model.safetensors").is_file()
    load_model(policy)  # the merged weights load as a plain model
    (ckpt,) = [p for p in sorted((out / "rl" / "checkpoints").glob("step_*"))][-1:]
    state = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    assert state["model"] and all("lora_" in k for k in state["model"])


def test_a_run_directory_resumes_only_under_its_own_settings(tmp_path: Path) -> None:
    """A setting added since the run started is taken at its default; a changed or unknown one refuses,
    naming the key."""
    import yaml

    from asearch.demo.pipeline import DemoConfig, _check_resumable
    from asearch.errors import ConfigError

    cfg = DemoConfig(out=tmp_path)
    dump = cfg.model_dump(mode="json")
    del dump["phrasing"], dump["rl"]["agent"]["stop_repeats"]  # as written before these settings existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(dump))
    _check_resumable(tmp_path, cfg)
    with pytest.raises(ConfigError, match=r"phrasing: 'natural' -> 'keys'"):
        _check_resumable(tmp_path, cfg.model_copy(update={"phrasing": "keys"}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**dump, "renamed_setting": 3}))
    with pytest.raises(ConfigError, match=r"renamed_setting: 3 -> None"):
        _check_resumable(tmp_path, cfg)
