"""Engine kind `openai` (`OpenAIChatEngine` with a tokenizer) under the agent loop, against a loopback chat
server that plays a model: token prompts read back into chat messages, a partial assistant turn
continued, the stop string the server cut put back, built from an `EngineConfig`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.registry import EngineConfig, build_engine, make_engine
from asearch.engine.remote.openai_chat import (
    ChatResult,
    OpenAIChatClient,
    OpenAIChatEngine,
    _restore_stop,
    api_root,
)
from asearch.engine.types import GenerateRequest, SamplingParams
from asearch.errors import ConfigError

pytest.importorskip("torch")

QUESTION = "Where was Ada Varn born?"
PAGES = [
    {"id": "ada", "title": "Ada Varn", "text": "Ada Varn is a painter. Ada Varn was born in Oslen."},
    {"id": "bo", "title": "Bo Lind", "text": "Bo Lind is a sailor from Kesk."},
]


class ChatModel:
    """/v1/chat/completions answered by `policy(messages) -> model output`, cut at the first stop string the
    way chat servers do (the stop string is dropped); `name_stop` adds vLLM's `stop_reason` field."""

    def __init__(self, policy: Callable[[list[dict]], str], *, name_stop: bool = False):
        self.policy, self.bodies = policy, []
        self.app = app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.bodies.append(body)
            text, finish, matched = self.policy(body["messages"]), "stop", None
            cuts = [(text.find(s), s) for s in body.get("stop", []) if s in text]
            if cuts:
                at, matched = min(cuts)
                text = text[:at]
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if name_stop:
                choice["stop_reason"] = matched
            usage = {"prompt_tokens": 7, "completion_tokens": 3}
            return JSONResponse({"id": "c", "choices": [choice], "usage": usage})


@contextmanager
def serving(model: ChatModel) -> Iterator[str]:
    from asearch.retrieval.server import serve_in_thread

    with serve_in_thread(model.app) as url:
        yield url


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny byte-level BPE tokenizer with the ChatML template, saved alone (no model)."""
    from asearch.models.tiny import train_bpe_tokenizer

    texts = [p["title"] + " " + p["text"] for p in PAGES] * 20 + [QUESTION] * 20
    directory = tmp_path_factory.mktemp("chat-tok")
    train_bpe_tokenizer(texts, vocab_size=320).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tok(tok_dir: Path):
    from asearch.models.loading import load_tokenizer

    return load_tokenizer(tok_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chat-corpus") / "pages.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAGES))
    return path


def expert(messages: list[dict]) -> str:
    """A model that searches, then answers from what the search returned (the last user message)."""
    last = messages[-1]["content"] if messages[-1]["role"] == "user" else ""
    if "born in Oslen" in last:
        return "<answer>Oslen</answer> and more text"
    return "<search>Ada Varn born</search> trailing words"


def test_agent_episode_runs_on_a_chat_server_from_its_token_prompts(tok, tok_dir, corpus) -> None:
    from asearch.agent import AgentConfig, run_episode
    from asearch.tools import ToolsConfig, build_tools

    model = ChatModel(expert, name_stop=True)
    tools, closers = build_tools(ToolsConfig(corpus=str(corpus), access=None), progress=False)
    cfg = AgentConfig(style="search-r1", max_turns=4, temperature=0.0)
    with serving(model) as url:

        async def go():
            engine, tokenizer = build_engine(
                EngineConfig(kind="openai", base_url=url, model="served", tokenizer=str(tok_dir))
            )
            try:
                return await run_episode(engine, tokenizer, tools, QUESTION, cfg, trajectory_id="t1")
            finally:
                await engine.close()

        traj = asyncio.run(go())
    for close in closers:
        close()
    assert traj.answer == "Oslen" and [t.action for t in traj.turns] == ["search", "answer"], traj.turns
    first, second = model.bodies
    style = cfg.resolved_style()
    assert first["model"] == "served" and first["user"] == "t1" and first["temperature"] == 0.0
    assert first["messages"] == [
        {"role": "system", "content": style.system_prompt},
        {"role": "user", "content": style.user_template.format(question=QUESTION)},
    ]
    assert first["stop"] == ["</search>", "</answer>"] and "stop_token_ids" not in first
    # the second prompt is the first turn (with the stop string put back) and the search result
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "<search>Ada Varn born</search>"
    assert "born in Oslen" in second["messages"][3]["content"]
    assert traj.turns[0].output_text == "<search>Ada Varn born</search>"
    # the reply re-tokenized: the trajectory holds its tokens (log-prob 0: not the model's own)
    seg = traj.segments[0]
    generated = [t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
    assert tok.decode(generated) == "<search>Ada Varn born</search><answer>Oslen</answer>"


def test_a_partial_assistant_turn_is_continued(tok, tok_dir) -> None:
    model = ChatModel(lambda messages: "Ada Varn</search>")
    opened = tok.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok.encode(opened + "<search>", add_special_tokens=False)
    with serving(model) as url:

        async def go():
            engine = OpenAIChatEngine(
                OpenAIChatClient(f"{url}/v1", "m"),
                tokenizer=tok,
                prefill_fields={"continue_final_message": True, "add_generation_prompt": False},
                extra_body={"repetition_penalty": 1.1},
            )
            sampling = SamplingParams(max_new_tokens=8, stop=["</search>"], stop_token_ids=[1])
            try:
                return await engine.generate(GenerateRequest(input_ids=ids, sampling=sampling))
            finally:
                await engine.close()

        resp = asyncio.run(go())
    (body,) = model.bodies
    assert body["messages"][-1] == {"role": "assistant", "content": "<search>"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["repetition_penalty"] == 1.1 and "stop_token_ids" not in body
    # only the continuation comes back, with the stop string (the server said nothing; it closes <search>)
    assert resp.text == "Ada Varn</search>" and resp.stop_reason == "stop"
    assert tok.decode(resp.output_ids) == resp.text and resp.output_logprobs == [0.0] * len(resp.output_ids)


def test_the_stop_string_is_put_back_only_when_it_can_be_told() -> None:
    def result(text: str, finish: str = "stop", **choice) -> ChatResult:
        return ChatResult(text, {}, 0.0, finish, {"choices": [choice]})

    stops = ["</search>", "</answer>"]
    assert _restore_stop(result("<answer>x", stop_reason="</answer>"), stops, "") == "<answer>x</answer>"
    assert _restore_stop(result("<answer>x", stop_reason=2), stops, "") == "<answer>x"  # a stop token
    assert _restore_stop(result("done", stop_reason=None), stops, "") == "done"  # the model ended its turn
    assert _restore_stop(result("q words"), stops, "<search>") == "q words</search>"  # closes the open tag
    assert _restore_stop(result("<search>a</search> then"), stops, "") == "<search>a</search> then"
    assert _restore_stop(result("<search>cut", "length"), stops, "") == "<search>cut"
    assert _restore_stop(result("x</answer>"), stops, "<answer>") == "x</answer>"


def test_the_api_root_and_the_tokenizer_come_from_the_config(tok_dir, monkeypatch) -> None:
    assert api_root("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_root("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert api_root("https://api.example.com/v1beta") == "https://api.example.com/v1beta"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ASEARCH_TEST_KEY", "sk-secret")
    cfg = EngineConfig(kind="openai", base_url="http://127.0.0.1:1", model="served", api_key_env="ASEARCH_TEST_KEY")
    engine, tokenizer = build_engine(cfg.model_copy(update={"model": str(tok_dir)}))
    assert engine.client.base_url == "http://127.0.0.1:1/v1" and tokenizer is engine.tokenizer
    assert "sk-secret" not in repr(engine.client)
    judge = make_engine(cfg)  # a judge sends messages: its tokenizer ("served" is none) is never loaded
    assert judge.client.model == "served"
    with pytest.raises(ConfigError, match="set engine.tokenizer"):
        _ = judge.tokenizer
    asyncio.run(engine.close())
    asyncio.run(judge.close())
