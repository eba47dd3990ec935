"""bench/correction_study.py: the command of a cell and how a run's metrics become a row (collapse included)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _study():
    spec = importlib.util.spec_from_file_location("correction_study_bench", ROOT / "bench" / "correction_study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _write_run(out: Path, heldout: list[float]) -> None:
    out.mkdir(parents=True)
    rows = []
    for i, acc in enumerate(heldout):
        rows.append({"step": 10 * i, "eval/heldout_acc": acc})
        if i:
            rows.append({"step": 10 * i, "loss/policy": 0.1, "rollout/accuracy": acc, "is/masked_frac": 0.01 * i,
                         "rollout/staleness_mean": 2.0, "wall_s": 5.0 * i})  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_run_that_falls_from_its_best_is_collapsed_and_one_that_holds_is_not(tmp_path):
    study = _study()
    _write_run(tmp_path / "up", [0.4, 0.7, 0.8])
    _write_run(tmp_path / "down", [0.4, 0.8, 0.65])
    up, down = study.read_cell(tmp_path / "up", 0.10), study.read_cell(tmp_path / "down", 0.10)
    assert (up["heldout_start"], up["heldout_best"], up["heldout_last"], up["collapsed"]) == (0.4, 0.8, 0.8, False)
    assert down["collapsed"] and down["steps"] == 20
    assert up["masked_frac"] == 0.015
    assert study.read_cell(tmp_path / "missing", 0.1)["status"] == "no result"
    text = study.table([{"eta": 2, "correction": "tis", **up}, {"eta": 4, "correction": "tis", **down}])
    assert "| 2 | tis | 20 | 0.400 | 0.800 | 0.800 | no |" in text and "| 4 | tis | 20 | 0.400 | 0.800 | 0.650 | yes |" in text


def test_a_cell_trains_at_its_eta_with_a_window_of_groups_and_the_given_overrides(tmp_path):
    study = _study()
    args = study.argparse.Namespace(start=tmp_path, seed=0, steps=30, eval_every=10, window=True, device="cpu",
                                    set=["trainer.optim.lr=2e-3"])  # fmt: skip
    cmd = study.cell_command(args, 4, "seq_mask", tmp_path / "out")
    assert {"rollout.max_staleness=4", "trainer.loss.correction=seq_mask", "rollout.max_concurrent=40", "steps=30",
            "trainer.device=cpu", "trainer.optim.lr=2e-3"} <= set(cmd)  # fmt: skip
    args.window = False
    assert "rollout.max_concurrent=16" in study.cell_command(args, 4, "seq_mask", tmp_path / "out")
