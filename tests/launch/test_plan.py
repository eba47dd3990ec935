"""The memory plan (`asearch plan`, asearch.launch.plan): shapes from configs and names, the components of a
trainer rank and a rollout server, the knobs it names when a config does not fit, its calibration against a
measured train step and engine step, and `asearch train` refusing before anything starts."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearch.cli.app import app
from asearch.config import load_config
from asearch.errors import ConfigError
from asearch.launch import plan as planning
from asearch.launch.plan import KNOWN_SHAPES, model_shape, plan_for, shape_from_config
from asearch.launch.train import TrainConfig
from asearch.rl.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
SEVEN_B = ROOT / "configs" / "train-qwen2.5-7b-2x8h100.yaml"
# Without the chunked head (trainer.logprob_chunk, issue 34's item 1) FSDP ranks keep 32k x 152k float32 logits
# and the 7B setting fits nowhere: these tests wait for it.
needs_chunked_head = pytest.mark.skipif(
    "logprob_chunk" not in TrainerConfig.model_fields,
    reason="trainer.logprob_chunk not there yet",
)


def _bench():
    spec = importlib.util.spec_from_file_location("plan_calibration", ROOT / "bench" / "plan_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_known_shapes_match_the_published_numbers() -> None:
    seven, half = model_shape("Qwen/Qwen2.5-7B-Instruct"), model_shape("Qwen2.5-0.5B")
    assert round(seven.params / 1e9, 2) == 7.62 and seven.kv_bytes_per_token(2) == 57_344  # docs: 15.2 GB bf16
    assert round(half.params / 1e6) == 494 and half.kv_bytes_per_token(2) == 12_288
    assert round(model_shape("meta-llama/Meta-Llama-3-8B").params / 1e9, 2) == 8.03
    assert round(model_shape("Qwen/Qwen3-8B").params / 1e9, 2) == 8.19


def test_shape_from_a_directory_wins_and_unknown_names_are_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 192, "tie_word_embeddings": True,
    }))  # fmt: skip
    shape = model_shape(str(tmp_path))
    assert (shape.vocab, shape.layers, shape.kv_heads, shape.dim, shape.tie_embeddings) == (1000, 3, 2, 16, True)
    assert model_shape("runs/demo-seed3/model-sft") == KNOWN_SHAPES["asearch-demo-tiny"]  # before the demo ran
    with pytest.raises(ConfigError, match="not a known shape"):
        model_shape("someone/unknown-model")


def test_the_demo_shape_is_the_demos_model() -> None:
    from asearch.demo.pipeline import DemoConfig

    demo, tiny = DemoConfig(), KNOWN_SHAPES["asearch-demo-tiny"]
    assert (tiny.hidden, tiny.layers, tiny.heads, tiny.vocab, tiny.max_positions) == (
        demo.hidden, demo.layers, demo.heads, demo.vocab_size, demo.max_positions)  # fmt: skip


def test_a_real_model_config_gives_the_real_parameter_count() -> None:
    bench = _bench()
    shape = bench.SHAPES["small"][0]
    model = bench.random_model(shape, __import__("torch").device("cpu"))
    assert shape_from_config(model.config).params == shape.params == sum(p.numel() for p in model.parameters())


@needs_chunked_head
def test_7b_on_2x8_h100_fits_and_the_rectangle_kv_cache_does_not() -> None:
    cfg = load_config(TrainConfig, SEVEN_B)
    plan = plan_for(cfg, override_gb=80)
    assert plan.fits and [p.name for p in plan.pools] == ["trainer rank", "rollout server"]
    assert [p.count for p in plan.pools] == [8, 8]
    # the in-process engine behind `asearch engine serve` keeps a max_batch x 32k rectangle: 64 slots are 112 GiB
    too_big = load_config(TrainConfig, SEVEN_B, ["rollout_servers.kind=sglang", "engine.max_batch=64"])
    plan = plan_for(too_big, override_gb=80)
    assert plan.fits is False and plan.pools[1].fits is False
    (batch,) = [f for f in plan.fixes if f.startswith("engine.max_batch <= ")]
    fixed = load_config(TrainConfig, SEVEN_B, ["rollout_servers.kind=sglang", f"engine.max_batch={batch.split()[-1]}"])
    assert plan_for(fixed, override_gb=80).fits


@needs_chunked_head
def test_a_trainer_that_does_not_fit_names_its_knobs() -> None:
    one_rank = load_config(TrainConfig, SEVEN_B, ["allocation.trainer_ranks=1", "trainer.activation_checkpointing=false"])
    plan = plan_for(one_rank, override_gb=80)
    assert plan.fits is False and plan.pools[0].fits is False
    (both,) = plan.fixes  # no knob alone: checkpointing, then the ranks that fit with it
    assert both.startswith("trainer.activation_checkpointing=true and allocation.trainer_ranks >= "), both
    assert f"would fit with: {both}" in plan.render()
    ranks = both.rsplit(" ", 1)[-1]
    fixed = load_config(TrainConfig, SEVEN_B, [f"allocation.trainer_ranks={ranks}", "trainer.activation_checkpointing=true"])
    assert plan_for(fixed, override_gb=80).fits
    fewer = load_config(TrainConfig, SEVEN_B, [f"allocation.trainer_ranks={int(ranks) // 2}", "trainer.activation_checkpointing=true"])
    assert plan_for(fewer, override_gb=80).fits is False


def test_plan_cli_prints_the_table_and_exits_1_when_it_does_not_fit() -> None:
    res = CliRunner().invoke(app, ["plan", "train-world-tiny"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "this process: trainer + in-process engine" in res.output and "engine: KV cache (128 x 1,024 tokens)" in res.output
    res = CliRunner().invoke(app, ["plan", "train-world-tiny", "--device-memory-gb", "0.2"])
    assert res.exit_code == 1 and "DOES NOT FIT" in res.output and "would fit with: " in res.output


def test_train_refuses_before_anything_starts(tmp_path, monkeypatch) -> None:
    from asearch.launch import train as training
    from asearch.runs import RunDir

    def started(*_a, **_k):
        raise AssertionError("started something before the memory check")

    for name in ("make_launcher", "load_records", "_open_workflows", "_start_trainer"):
        monkeypatch.setattr(training, name, started)
    monkeypatch.setattr("asearch.models.loading.load_tokenizer", started)
    cfg = load_config(TrainConfig, ROOT / "configs" / "train-world-tiny-local.yaml", ["device_memory_gb=0.8"])
    with pytest.raises(ConfigError, match=r"does not fit in memory \(nothing was started\): .*engine.max_batch <= ") as err:
        asyncio.run(training.train(cfg, run=RunDir(tmp_path / "run")))
    assert "this machine: trainer + 2 rollout servers" in str(err.value)
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "logs").exists()


def test_train_cli_refuses_before_the_run_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4, "intermediate_size": 128}))  # fmt: skip
    (tmp_path / "q.jsonl").write_text('{"question": "q", "golds": ["a"]}\n')
    res = CliRunner().invoke(app, ["train", "train-world-tiny", f"model={model}", "data=q.jsonl", "heldout.dataset=null",
                                   "device_memory_gb=0.1", "--out", "run"])  # fmt: skip
    assert isinstance(res.exception, ConfigError) and "would fit with" in str(res.exception), res.output
    assert not (tmp_path / "run").exists()


def test_plan_within_20_percent_of_measured_train_steps_and_an_engine_step() -> None:
    bench = _bench()
    shape, rows, row = bench.SHAPES["small"]
    measured = [
        bench.measure_train_step(shape, rows, row),
        bench.measure_train_step(shape, rows, row, checkpointing=True),
        bench.measure_train_step(shape, rows, row, lora_r=16),
        bench.measure_train_step(shape, rows, row, kl_coef=0.01),
        bench.measure_train_step(shape, rows, row, attention="eager"),
        bench.measure_engine_step(shape, max_batch=16, max_seq_len=2 * row),
    ]
    for m in measured:
        assert abs(m["predicted"] / m["measured"] - 1) <= 0.20, m


def test_the_tracker_counts_what_lives() -> None:
    import torch

    tracker = _bench().LiveTensorBytes()
    with tracker:
        a = torch.zeros(1000)  # 4,000 B
        b = torch.zeros(500)
        del a
        c = torch.zeros(250)
    assert tracker.peak == 6000 and tracker.current == 3000
    del b, c


def test_device_memory_is_the_knob_then_the_gpu_then_ram() -> None:
    import torch

    cfg = load_config(TrainConfig, SEVEN_B)
    assert planning.device_memory(cfg, cuda=True)[0] == 80 * planning.GiB  # device_memory_gb: 80
    on_ray = load_config(TrainConfig, SEVEN_B, ["device_memory_gb=null"])
    assert planning.device_memory(on_ray, cuda=True) == (None, planning.device_memory(on_ray, cuda=False)[1])
    assert "launcher=ray places the trainer" in planning.device_memory(on_ray, cuda=True)[1]  # not this machine's
    here = load_config(TrainConfig, ROOT / "configs" / "train-world-tiny.yaml")
    size, where = planning.device_memory(here, cuda=True)
    assert (size is None) == (not torch.cuda.is_available()) and ("no GPU here" in where) == (size is None)
    assert planning.device_memory(here, cuda=False)[1].endswith("(this machine's RAM)")
