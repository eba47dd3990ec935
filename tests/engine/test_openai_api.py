"""`asearch engine serve`'s OpenAI API, driven by the official `openai` client, the project's own
`OpenAIChatClient` / `OpenAIChatEngine`, and raw HTTP.

One real server subprocess (`launch_engine_server`) serves a tiny model built here, as "tiny". Its answers
are checked against `/generate` on the same server with the same seed: the chat template, the sampling
settings and the log-probs must give exactly the tokens the SGLang route gives. The model's EOS row is
zeroed in a sharp output layer, so a choice ends only at max_tokens or a stop the test asks for. Nothing
here assumes how fast the machine is: the streaming test freezes the engine mid-stream (a pause) instead
of racing it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from asearch.engine.server.app import launch_engine_server  # noqa: E402
from asearch.engine.server.openai_api import TextTracker  # noqa: E402

SERVED = "tiny"
MESSAGES = [{"role": "system", "content": "the river"}, {"role": "user", "content": "the mayor of city 7?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """(directory, tokenizer) of a random tiny Qwen2 with a word-level tokenizer and a ChatML template, whose
    EOS is never sampled."""
    from asearch.models.tiny import build_tiny_model, save_tiny, train_word_tokenizer

    torch.set_num_threads(1)
    texts = [
        f"the {w} of city {i} is near the river {w}"
        for i in range(60)
        for w in ("capital", "mayor", "bridge")
    ]
    # every piece of the chat template and MESSAGES is a word, so a prompt decoded to text encodes back to itself
    texts.append("system\nthe river\nuser\nthe mayor of city 7?\nassistant\n")
    tok = train_word_tokenizer(texts)  # word tokens: the model writes words, which stop strings can name
    model = build_tiny_model(
        tok, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, tie=False, seed=3
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        # logits of std ~4: peaked but not greedy; EOS at logit 0 has probability ~1e-6 per token
        model.lm_head.weight.mul_(5.0)
        model.lm_head.weight[tok.eos_token_id] = 0.0
    return save_tiny(model.eval(), tok, tmp_path_factory.mktemp("openai-tiny") / "model"), tok


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("openai-server") / "server.log"
    sup, url = launch_engine_server(
        tiny[0], log_path=log, threads=1, max_seq_len=2048, served_model_name=SERVED
    )
    try:
        yield url
    finally:
        sup.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def generate(url: str, ids: list[int], **sp) -> dict:
    """The SGLang route on the same server: the reference for what the OpenAI routes must produce."""
    body = {"input_ids": ids, "sampling_params": sp, "return_logprob": True}
    return httpx.post(f"{url}/generate", json=body, timeout=120).json()


def info(url: str) -> dict:
    return httpx.get(f"{url}/get_server_info", timeout=30).json()


def test_models_lists_the_served_name(client) -> None:
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).owned_by == "asearch"
    with pytest.raises(openai.NotFoundError, match="does not exist: this server serves 'tiny'"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)


def test_chat_uses_the_template_and_matches_generate(client, server, tiny) -> None:
    _, tok = tiny
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = client.chat.completions.create(
        model=SERVED, messages=MESSAGES, max_tokens=12, temperature=0.8, top_p=0.9, seed=7, logprobs=True
    )
    ref = generate(server, ids, max_new_tokens=12, temperature=0.8, top_p=0.9, sampling_seed=7)
    out = ref["output_ids"]
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content == tok.decode(
        out, skip_special_tokens=True
    )
    assert choice.finish_reason == "length" and r.model == SERVED and r.object == "chat.completion"
    logprobs = [e[0] for e in ref["meta_info"]["output_token_logprobs"]]
    assert [e.logprob for e in choice.logprobs.content] == pytest.approx(logprobs, abs=1e-5)
    assert [e.token for e in choice.logprobs.content] == [tok.decode([t]) for t in out]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(ids),
        12,
        len(ids) + 12,
    )
    # text parts are joined; max_completion_tokens wins over max_tokens
    parts = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": MESSAGES[1]["content"]}]}]
    again = client.chat.completions.create(
        model=SERVED,
        messages=parts,
        max_tokens=40,
        max_completion_tokens=12,
        temperature=0.8,
        top_p=0.9,
        seed=7,
    )
    assert again.choices[0].message.content == choice.message.content


def test_completions_take_text_token_and_batch_prompts(client, server, tiny) -> None:
    _, tok = tiny
    text = "the bridge of city 3 is"
    ids = tok.encode(text)
    ref = generate(server, ids, max_new_tokens=6, sampling_seed=2)["output_ids"]
    r = client.completions.create(model=SERVED, prompt=text, max_tokens=6, seed=2, logprobs=0)
    assert (
        r.choices[0].text == tok.decode(ref, skip_special_tokens=True)
        and r.choices[0].finish_reason == "length"
    )
    assert r.choices[0].logprobs.tokens == [tok.decode([t]) for t in ref]
    offsets = r.choices[0].logprobs.text_offset
    assert offsets[0] == 0 and offsets[-1] == len(tok.decode(ref[:-1]))
    by_ids = client.completions.create(model=SERVED, prompt=ids, max_tokens=6, seed=2)
    assert by_ids.choices[0].text == r.choices[0].text
    # a batch of two prompts, n=2 each: choices numbered prompt by prompt, prompt tokens counted once each
    batch = client.completions.create(model=SERVED, prompt=[text, ids[:4]], n=2, max_tokens=6, seed=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == r.choices[0].text
    assert batch.usage.prompt_tokens == len(ids) + 4 and batch.usage.completion_tokens == 4 * 6


def test_n_choices_are_seeded_apart_and_their_usage_adds_up(client, server, tiny) -> None:
    _, tok = tiny
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = client.chat.completions.create(model=SERVED, messages=MESSAGES, n=3, max_tokens=10, seed=40)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for j, choice in enumerate(r.choices):  # choice j is the request with seed + j
        out = generate(server, ids, max_new_tokens=10, sampling_seed=40 + j)["output_ids"]
        assert choice.message.content == tok.decode(out, skip_special_tokens=True)
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 30


def test_stop_strings_end_the_text_before_them(client, server, tiny) -> None:
    _, tok = tiny
    full = client.completions.create(model=SERVED, prompt="the mayor", max_tokens=40, seed=5).choices[0].text
    words = full.split()
    word = next(w for w in words[2:] if w.isalpha() and len(w) > 1)
    cut = full[: full.index(word)]
    for stop in (word, [f"zz{word}zz", word]):  # a string and a list
        r = client.completions.create(model=SERVED, prompt="the mayor", max_tokens=40, seed=5, stop=stop)
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    raw = httpx.post(
        f"{server}/v1/completions",
        json={"prompt": "the mayor", "max_tokens": 40, "seed": 5, "stop": word},
        timeout=120,
    ).json()
    assert raw["choices"][0]["stop_reason"] == word  # vLLM's field: OpenAIChatEngine puts the stop back
    # a stop token (vLLM's stop_token_ids) ends the choice and is left out of the text
    ids = tok.encode("the mayor")
    out = generate(server, ids, max_new_tokens=40, sampling_seed=5)["output_ids"]
    r = client.completions.create(
        model=SERVED, prompt=ids, max_tokens=40, seed=5, extra_body={"stop_token_ids": [out[3]]}
    )
    first = out.index(out[3])
    assert (
        r.choices[0].text == tok.decode(out[:first], skip_special_tokens=True)
        and r.choices[0].finish_reason == "stop"
    )
    assert r.usage.completion_tokens == first + 1


def test_streamed_chat_adds_up_to_the_answer_with_usage(client, server, tiny) -> None:
    whole = client.chat.completions.create(model=SERVED, messages=MESSAGES, n=2, max_tokens=30, seed=9)
    word = next(w for w in whole.choices[0].message.content.split()[1:] if w.isalpha() and len(w) > 1)
    for stop in (None, [word]):
        ref = client.chat.completions.create(
            model=SERVED, messages=MESSAGES, n=2, max_tokens=30, seed=9, stop=stop
        )
        stream = client.chat.completions.create(
            model=SERVED,
            messages=MESSAGES,
            n=2,
            max_tokens=30,
            seed=9,
            stop=stop,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        texts, finish = ["", ""], [None, None]
        for ch in chunks[:-1]:
            assert ch.object == "chat.completion.chunk" and ch.usage is None
            for c in ch.choices:
                texts[c.index] += c.delta.content or ""
                finish[c.index] = c.finish_reason or finish[c.index]
        assert texts == [c.message.content for c in ref.choices]
        assert finish == [c.finish_reason for c in ref.choices]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == ref.usage.model_dump()
        assert len(chunks) > 6  # deltas, not one block
    assert ref.choices[0].finish_reason == "stop" and word not in ref.choices[0].message.content


def test_stream_is_incremental_survives_an_abort_and_stops_when_the_client_leaves(
    client, server, tiny
) -> None:
    """Text arrives while the request is still in the engine; a pause that aborts it is invisible (the
    request is resent with its tokens so far); closing the stream ends the generation."""
    n = 1000
    stream = client.chat.completions.create(
        model=SERVED, messages=MESSAGES, max_tokens=n, seed=1, logprobs=True, stream=True
    )
    chunks = iter(stream)
    first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
    httpx.post(f"{server}/pause_generation", json={"mode": "in_place"}, timeout=30)
    held = info(server)
    assert held["inflight"] == 1 and first.choices[0].finish_reason is None  # text before the end
    httpx.post(f"{server}/pause_generation", json={"mode": "abort"}, timeout=30)
    after = info(server)
    assert after["aborted_by_pause"] >= held["aborted_by_pause"] + 1 and after["inflight"] == 0
    httpx.post(f"{server}/continue_generation", json={}, timeout=30)
    rest = list(chunks)
    tokens = len(first.choices[0].logprobs.content) + sum(
        len(c.choices[0].logprobs.content) for c in rest if c.choices and c.choices[0].logprobs
    )
    assert tokens == n and rest[-1].choices[0].finish_reason == "length"

    before = info(server)["internal_states"][0]["requests_aborted"]
    stream = client.chat.completions.create(
        model=SERVED, messages=MESSAGES, max_tokens=n, seed=2, stream=True
    )
    next(c for c in stream if c.choices and c.choices[0].delta.content)
    stream.close()

    async def until_gone() -> dict:
        deadline = asyncio.get_running_loop().time() + 60
        while (now := info(server))["inflight"] or now["internal_states"][0]["requests_aborted"] == before:
            assert asyncio.get_running_loop().time() < deadline, now
            await asyncio.sleep(0.01)
        return now

    asyncio.run(until_gone())  # the engine aborted the request: it no longer runs for nobody


def test_concurrent_requests_share_the_engines_batch(server) -> None:
    """Eight requests at once decode together (the engine batches them), not one after another."""

    async def go():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0) as c:
            return await asyncio.gather(
                *(
                    c.completions.create(model=SERVED, prompt="the city", max_tokens=64, seed=i)
                    for i in range(8)
                )
            )

    before = info(server)["internal_states"][0]
    answers = asyncio.run(go())
    after = info(server)["internal_states"][0]
    tokens = after["tokens_generated"] - before["tokens_generated"]
    steps = after["decode_steps"] - before["decode_steps"]
    assert [a.usage.completion_tokens for a in answers] == [64] * 8 and tokens == 8 * 64
    assert tokens / steps > 2, (tokens, steps)  # one at a time would be 1 token per step


def test_bad_requests_are_400s_in_openais_shape(client, server) -> None:
    for kwargs, message in (
        ({"messages": [], "max_tokens": 2}, "messages must be a non-empty list"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"messages": MESSAGES, "temperature": -1}, "temperature must be a number >= 0"),
        ({"messages": MESSAGES, "presence_penalty": 0.5}, "penalties are not supported"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 3}, "top_logprobs is not supported"),
        ({"messages": MESSAGES, "stop": [1, 2]}, "stop must be a string or a list of strings"),
        ({"messages": [{"role": "user", "content": "x " * 3000}]}, "context is 2048 tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
    ):
        with pytest.raises(openai.BadRequestError, match=message):
            client.chat.completions.create(model=SERVED, **kwargs)
    with pytest.raises(openai.BadRequestError, match="only the sampled token's log-prob"):
        client.completions.create(model=SERVED, prompt="the", logprobs=2)
    r = httpx.post(f"{server}/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(f"{server}/v1/completions", json={"prompt": [10**6]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "out of range" in r.text


def test_the_projects_openai_client_and_engine_work_against_it(server, tiny) -> None:
    """`OpenAIChatClient` (judges, synthesis) and engine kind `openai` (`ask --engine openai`): a token
    prompt that ends inside an assistant turn is continued, and the stop string is put back."""
    from asearch.engine.registry import EngineConfig, build_engine
    from asearch.engine.remote.openai_chat import OpenAIChatClient
    from asearch.engine.types import GenerateRequest, SamplingParams

    model_dir, tok = tiny
    opened = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) + "the"
    ids = tok.encode(opened)
    out = generate(server, ids, max_new_tokens=30, sampling_seed=4, temperature=0.5)["output_ids"]
    text = tok.decode(out, skip_special_tokens=True)
    word = next(w for w in text.split()[1:] if w.isalpha() and len(w) > 1)

    async def go():
        async with OpenAIChatClient(f"{server}/v1", SERVED, retries=0) as judge:
            chat = await judge.chat(MESSAGES, max_tokens=5, temperature=0.0)
        engine, _ = build_engine(
            EngineConfig(kind="openai", base_url=server, model=SERVED, tokenizer=str(model_dir))
        )
        try:
            sampling = SamplingParams(temperature=0.5, max_new_tokens=30, stop=[word], seed=4)
            resp = await engine.generate(GenerateRequest(input_ids=ids, sampling=sampling))
        finally:
            await engine.close()
        return chat, resp

    chat, resp = asyncio.run(go())
    assert chat.finish_reason == "length" and chat.usage["completion_tokens"] == 5 and chat.text
    assert resp.stop_reason == "stop" and resp.text == text[: text.index(word)] + word


def test_a_model_without_a_chat_template_answers_chat_with_a_400(tiny, tmp_path: Path) -> None:
    from asearch.engine.local.inprocess import InProcessEngineConfig
    from asearch.engine.server.app import build_server, create_app
    from asearch.retrieval.server import serve_in_thread

    plain = tmp_path / "plain"
    shutil.copytree(tiny[0], plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    server = build_server(plain, cfg=InProcessEngineConfig(max_seq_len=64), served_model_name="plain")
    assert not server.engine.tokenizer.chat_template
    with serve_in_thread(create_app(server)) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="'plain' has no chat template") as err:
            c.chat.completions.create(model="plain", messages=MESSAGES, max_tokens=2)
        assert err.value.body["param"] == "messages"
        assert c.completions.create(model="plain", prompt="the", max_tokens=3).usage.completion_tokens == 3


def test_text_tracker_holds_back_a_possible_stop_and_waits_for_whole_characters() -> None:
    class Bytes:  # a tokenizer whose tokens are single UTF-8 bytes
        def decode(self, ids, **_):
            return bytes(ids).decode("utf-8", errors="replace")

    t = TextTracker(Bytes(), ["END", "é!"])
    pieces = []
    for b in b"abE":
        t.push(b)
        pieces.append(t.take())
    assert pieces == ["a", "b", ""]  # "E" could start "END"
    t.push(ord("x"))
    assert t.take() == "Ex"
    e_acute = "é".encode()
    t.push(e_acute[0])
    assert t.take() == "" and t.text == "abEx"  # half a character waits
    t.push(e_acute[1])
    assert t.take() == ""  # "é" could start "é!"
    for b in b"!tail":
        t.push(b)
    t.finish()
    assert t.take() == "" and t.content == "abEx" and t.matched == "é!"
