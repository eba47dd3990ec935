"""The example agent's warm-up data: the world expert plays the model through the example agent itself (function
calls in the hermes format), on the tiny world with asearch's real search tool. Its episodes answer like the
expert does, call the tool through function calling, and re-render with no prompt mismatch: the calls the model
will be taught come back in later prompts exactly as written."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def _warmup():
    spec = importlib.util.spec_from_file_location("openai_agent_warmup", ROOT / "examples" / "openai_agent" / "warmup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_expert_episodes_through_the_example_agent_are_exact_and_mostly_right(save_world_model, tmp_path) -> None:
    from asearch.engine.chat_tools import CHATML_TOOLS_TEMPLATE
    from asearch.eval.datasets import load_dataset
    from asearch.models.loading import load_tokenizer
    from asearch.tools import ToolsConfig

    warmup = _warmup()
    tok = load_tokenizer(save_world_model(tmp_path / "m", hidden=32, heads=2, max_positions=512))
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    records = [r.model_dump(mode="json") for r in load_dataset("world:seed=1,entities=200,n=24")]
    tools = ToolsConfig.model_validate({"search": {"topk": 2, "max_doc_chars": 400, "show_urls": False, "compact": True}, "access": None})
    trajs = warmup.expert_trajectories(tok, records, tools, p_skip=0.0, p_wrong=0.0)
    assert len(trajs) == 24
    assert sum(t.reward for t in trajs) / len(trajs) >= 0.75  # the expert without its mistakes answers
    assert all(t.counters.get("searches", 0) >= 1 and t.counters.get("tool_calls", 0) >= 1 for t in trajs)
    assert sum(t.counters.get("prompt_mismatches", 0) for t in trajs) == 0
    assert all(len(t.segments) == 1 and t.segments[0].n_generated > 0 for t in trajs)
    end = tok.convert_tokens_to_ids("<|im_end|>")  # the model is taught to end its turns
    assert all(t.segments[0].token_ids.count(end) >= t.num_turns for t in trajs)


def test_warmup_trains_a_fresh_model_of_the_demos_shape(save_world_model, tmp_path) -> None:
    from asearch.config import dump_config
    from asearch.demo.pipeline import DemoConfig
    from asearch.eval.datasets import load_dataset
    from asearch.files import write_jsonl
    from asearch.models.loading import load_tokenizer

    warmup = _warmup()
    demo = tmp_path / "demo"
    save_world_model(demo / "model-sft", hidden=32, heads=2, max_positions=1024)
    records = load_dataset("world:seed=1,entities=200,n=12")
    write_jsonl(demo / "data" / "train.jsonl", (r.to_jsonl_dict() for r in records))
    cfg = DemoConfig.model_validate({"expert_episodes": 16, "sft": {"steps": 2, "batch_size": 4}, "setup_threads": 1})
    dump_config(cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"tools": cfg.rl.tools.model_copy(update={"corpus": "world:seed=1,entities=200"})})}), demo / "config.yaml")
    warmup.main(["--demo", str(demo), "--out", str(tmp_path / "sft"), "--tokenizer", "demo"])
    tok = load_tokenizer(tmp_path / "sft")
    assert "<tool_call>" in tok.chat_template and (tmp_path / "sft" / "config.json").exists()


def test_the_examples_own_tokenizer_knows_its_template_and_renders_exactly() -> None:
    """`fitted_tokenizer`: the demo's BPE recipe (its vocabulary size, its tokenizer world) on the example's own
    text. The template's words become tokens, and the expert's episodes through it still re-render exactly."""
    from asearch.demo.pipeline import DemoConfig
    from asearch.engine.chat_tools import render_call_text
    from asearch.eval.datasets import load_dataset
    from asearch.models.tiny import train_bpe_tokenizer

    warmup = _warmup()
    cfg = DemoConfig.model_validate({"world_entities": 200, "vocab_size": 800})
    assert cfg.rl.tools.access is None  # the demo offers search alone
    tok = warmup.fitted_tokenizer(cfg)
    assert len(tok) == 800 and "<tool_call>" in tok.chat_template
    call = render_call_text([{"name": "search", "arguments": {"query": " Kota Films"}}], "hermes") + "<|im_end|>"
    bytes_only = train_bpe_tokenizer([], vocab_size=800)  # what a tokenizer that never saw the template does: bytes
    assert len(tok(call)["input_ids"]) * 2 < len(bytes_only(call)["input_ids"])
    records = [r.model_dump(mode="json") for r in load_dataset("world:seed=1,entities=200,n=12")]  # not its world
    trajs = warmup.expert_trajectories(tok, records, cfg.rl.tools.model_copy(update={"corpus": "world:seed=1,entities=200"}), p_skip=0.0, p_wrong=0.0)
    assert len(trajs) == 12 and sum(t.counters.get("prompt_mismatches", 0) for t in trajs) == 0
    assert sum(t.reward for t in trajs) / len(trajs) >= 0.75
