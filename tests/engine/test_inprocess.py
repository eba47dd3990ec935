"""The in-process engine against the transformers forward pass of the same tiny Qwen2.

Every log-prob the engine reports is recomputed from a full forward over prompt + output; weight
updates are checked token by token against the model that produced each token.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time

import pytest
import torch

from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
from asearch.engine.types import Engine, GenerateRequest, SamplingParams
from asearch.errors import ConfigError

torch.set_num_threads(1)

CORPUS = [
    "Paris is the capital and largest city of France.",
    "The Eiffel Tower was built for the 1889 World's Fair in Paris.",
    "search(query) returns the top-k snippets with their urls; access(url) returns the page text.",
    "Marie Curie was born in Warsaw in 1867 and worked in Paris.",
] * 30


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    return make_tokenizer(CORPUS, vocab_size=360)


@pytest.fixture(scope="module")
def model(tokenizer, make_tiny_model):
    return make_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def model_b(tokenizer, make_tiny_model):
    """A second set of weights for update tests: same shapes, different values."""
    return make_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2, seed=1)


def make_engine(model, tokenizer=None, **cfg) -> InProcessEngine:
    return InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(**{"max_seq_len": 512, **cfg}))


def prompts(tokenizer, n: int) -> list[list[int]]:
    texts = ["Paris is", "The Eiffel", "search(query) returns", "Marie Curie was born in", "Question:"]
    return [tokenizer.encode(f"{texts[i % len(texts)]} {i}", add_special_tokens=False) for i in range(n)]


def full_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model at every position of `ids`: row t predicts ids[t + 1]."""
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def reference_filtered_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """The sampling distribution as documented, computed the slow obvious way (one full sort)."""
    scaled = logits / temperature
    values, order = scaled.sort(descending=True)
    if top_k:
        values[top_k:] = float("-inf")
    probs = torch.softmax(values, dim=-1)
    values[(probs.cumsum(-1) - probs) >= top_p] = float("-inf")
    return torch.log_softmax(torch.full_like(values, float("-inf")).scatter(0, order, values), dim=-1)


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- exactness


def test_engine_satisfies_protocol(model):
    async def main():
        engine = make_engine(model)
        try:
            assert isinstance(engine, Engine)
            assert engine.version == 0
        finally:
            await engine.close()

    run(main())


def test_logprobs_match_full_forward_at_temperature_one(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer)
        try:
            reqs = [
                GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=24, seed=i))
                for i, p in enumerate(prompts(tokenizer, 6))
            ]
            return reqs, await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.close()

    reqs, responses = run(main())
    for req, resp in zip(reqs, responses, strict=True):
        assert resp.stop_reason == "length" and resp.output_len == 24
        assert resp.output_versions == [0] * 24
        assert resp.input_len == len(req.input_ids)
        lp = full_logprobs(model, req.input_ids + resp.output_ids)
        p = len(req.input_ids)
        expected = [lp[p - 1 + j, tok].item() for j, tok in enumerate(resp.output_ids)]
        assert resp.output_logprobs == pytest.approx(expected, abs=2e-5)
        assert resp.text == tokenizer.decode(resp.output_ids)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.3, 20, 1.0), (0.8, 0, 0.9), (1.0, 30, 0.8)]
)
def test_logprobs_are_those_of_the_filtered_sampling_distribution(
    model, tokenizer, temperature, top_k, top_p
):
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=20, seed=7)

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            return await asyncio.gather(
                *(
                    engine.generate(GenerateRequest(input_ids=p, sampling=copy.copy(sampling)))
                    for p in prompts(tokenizer, 4)
                )
            )
        finally:
            await engine.close()

    for p, resp in zip(prompts(tokenizer, 4), run(main()), strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([p + resp.output_ids])).logits[0].float()
        for j, tok in enumerate(resp.output_ids):
            ref = reference_filtered_logprobs(logits[len(p) - 1 + j], temperature, top_k, top_p)
            assert ref[tok].item() > float("-inf"), "sampled a token outside top-k/top-p"
            assert resp.output_logprobs[j] == pytest.approx(ref[tok].item(), abs=2e-5)


def test_greedy_logprob_is_model_logprob_of_argmax(model, tokenizer):
    p = prompts(tokenizer, 1)[0]

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            return await engine.generate(
                GenerateRequest(input_ids=p, sampling=SamplingParams(temperature=0.0, max_new_tokens=12))
            )
        finally:
            await engine.close()

    resp = run(main())
    lp = full_logprobs(model, p + resp.output_ids)
    for j, tok in enumerate(resp.output_ids):
        assert tok == int(lp[len(p) - 1 + j].argmax())
        assert resp.output_logprobs[j] == pytest.approx(lp[len(p) - 1 + j, tok].item(), abs=2e-5)


def test_batched_greedy_equals_sequential_greedy(model, tokenizer):
    ps = prompts(tokenizer, 10)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=30)

    async def main():
        engine = make_engine(model, tokenizer, max_batch=8)  # 10 requests: two wait and join mid-decode
        try:
            sequential = [
                await engine.generate(GenerateRequest(input_ids=p, sampling=copy.copy(greedy))) for p in ps
            ]
            steps_before = engine.stats()["decode_steps"]
            batched = await asyncio.gather(
                *(engine.generate(GenerateRequest(input_ids=p, sampling=copy.copy(greedy))) for p in ps)
            )
            return sequential, batched, engine.stats()["decode_steps"] - steps_before
        finally:
            await engine.close()

    sequential, batched, batched_steps = run(main())
    for s, b in zip(sequential, batched, strict=True):
        assert s.output_ids == b.output_ids
        assert s.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)
    assert batched_steps < 10 * 30 / 2  # really batched: sequential decoding takes 300 steps


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(model, tokenizer):
    ps = prompts(tokenizer, 5)

    def req(seed):
        return GenerateRequest(
            input_ids=ps[0], sampling=SamplingParams(temperature=1.0, max_new_tokens=25, seed=seed)
        )

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            alone = await engine.generate(req(42))
            others = [
                GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=25)) for p in ps[1:]
            ]
            together = await asyncio.gather(engine.generate(req(42)), *(engine.generate(r) for r in others))
            other_seed = await engine.generate(req(43))
            return alone, together[0], other_seed
        finally:
            await engine.close()

    alone, batched, other = run(main())
    assert alone.output_ids == batched.output_ids
    assert alone.output_ids != other.output_ids


# --------------------------------------------------------------------------- stopping


def test_stop_token_ids_and_stop_strings(model, tokenizer):
    p = prompts(tokenizer, 1)[0]

    def greedy(**kw):
        return GenerateRequest(input_ids=p, sampling=SamplingParams(temperature=0.0, max_new_tokens=40, **kw))

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            free = await engine.generate(greedy())
            stop_tok = free.output_ids[5]
            by_id = await engine.generate(greedy(stop_token_ids=[stop_tok]))
            stop_str = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
            by_str = await engine.generate(greedy(stop=[stop_str]))
            return free, stop_tok, by_id, stop_str, by_str
        finally:
            await engine.close()

    free, stop_tok, by_id, stop_str, by_str = run(main())
    assert free.stop_reason == "length" and free.output_len == 40
    first = free.output_ids.index(stop_tok)
    assert by_id.stop_reason == "stop"
    assert by_id.output_ids == free.output_ids[: first + 1]  # the stop token is included
    assert len(stop_str) == 3
    assert by_str.stop_reason == "stop"
    assert stop_str in by_str.text
    assert stop_str not in tokenizer.decode(
        by_str.output_ids[:-1]
    )  # stopped at the first token completing it
    assert by_str.output_ids == free.output_ids[: by_str.output_len]


def test_eos_stops_generation(model, tokenizer):
    """Make eos the likeliest token by boosting its logit row, then generation ends on it at once."""
    boosted = copy.deepcopy(model)
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        boosted.lm_head.weight[eos] = boosted.model.norm.weight * 50  # huge dot product with any normed state
    p = prompts(tokenizer, 1)[0]

    async def main():
        engine = make_engine(boosted, tokenizer)
        try:
            return await engine.generate(
                GenerateRequest(
                    input_ids=p, sampling=SamplingParams(max_new_tokens=30, stop_token_ids=[eos], seed=1)
                )
            )
        finally:
            await engine.close()

    resp = run(main())
    assert resp.stop_reason == "stop" and resp.output_ids[-1] == eos
    assert resp.output_len < 30


def test_length_limits(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer, max_seq_len=40)
        try:
            capped = await engine.generate(
                GenerateRequest(input_ids=[5] * 30, sampling=SamplingParams(max_new_tokens=100))
            )
            too_long = await engine.generate(
                GenerateRequest(input_ids=[5] * 40, sampling=SamplingParams(max_new_tokens=5))
            )
            zero = await engine.generate(
                GenerateRequest(input_ids=[5] * 3, sampling=SamplingParams(max_new_tokens=0))
            )
            return capped, too_long, zero, engine.stats()
        finally:
            await engine.close()

    capped, too_long, zero, stats = run(main())
    assert capped.stop_reason == "length" and capped.output_len == 10  # 30 + 10 = max_seq_len
    assert too_long.stop_reason == "length" and too_long.output_ids == []
    assert zero.stop_reason == "length" and zero.output_ids == []
    assert stats["prompts_too_long"] == 1


def test_invalid_requests_raise(model, tokenizer):
    async def main():
        engine = make_engine(model)  # no tokenizer
        try:
            with pytest.raises(ValueError, match="empty"):
                await engine.generate(GenerateRequest(input_ids=[]))
            with pytest.raises(ValueError, match="out of range"):
                await engine.generate(GenerateRequest(input_ids=[1, 10**6]))
            with pytest.raises(ValueError, match="top_p must be in"):
                await engine.generate(GenerateRequest(input_ids=[1], sampling=SamplingParams(top_p=0.0)))
            with pytest.raises(ValueError, match="need an engine tokenizer"):
                await engine.generate(GenerateRequest(input_ids=[1], sampling=SamplingParams(stop=["x"])))
        finally:
            await engine.close()

    run(main())


def test_messages_request_uses_chat_template(model, tokenizer):
    messages = [{"role": "user", "content": "Capital of France?"}]

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            return await engine.generate(
                GenerateRequest(messages=messages, sampling=SamplingParams(max_new_tokens=3))
            )
        finally:
            await engine.close()

    resp = run(main())
    expected = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert resp.input_len == len(expected) and resp.output_len == 3


# --------------------------------------------------------------------------- concurrency


def test_64_concurrent_requests_complete_and_loop_stays_responsive(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer, max_batch=64)
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.005)

        tick_task = asyncio.create_task(ticker())
        try:
            ps = prompts(tokenizer, 64)
            t0 = time.perf_counter()
            responses = await asyncio.gather(
                *(
                    engine.generate(
                        GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=96, seed=i))
                    )
                    for i, p in enumerate(ps)
                )
            )
            elapsed = time.perf_counter() - t0
            stop.set()
            await tick_task
            return responses, ticks, elapsed, engine.stats()
        finally:
            await engine.close()

    responses, ticks, elapsed, stats = run(main())
    assert all(r.output_len == 96 and r.stop_reason == "length" for r in responses)
    assert stats["tokens_generated"] == 64 * 96 and stats["active"] == 0
    assert stats["mean_batch_size"] > 16
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    # The ticker wakes every 5 ms while decoding runs in the engine thread; a blocked loop would show
    # one gap as long as the whole generation.
    assert len(ticks) >= max(3, 0.25 * elapsed / 0.005)
    assert max(gaps) < max(0.2, elapsed / 2), (max(gaps), elapsed)


def test_pause_holds_decoding_and_resume_continues(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer)
        try:
            await engine.pause()
            task = asyncio.create_task(
                engine.generate(
                    GenerateRequest(
                        input_ids=prompts(tokenizer, 1)[0], sampling=SamplingParams(max_new_tokens=10)
                    )
                )
            )
            await asyncio.sleep(0.2)
            assert not task.done()
            assert engine.stats()["tokens_generated"] == 0 and engine.stats()["waiting"] == 1
            await engine.resume()
            resp = await asyncio.wait_for(task, 30)
            return resp
        finally:
            await engine.close()

    assert run(main()).output_len == 10


def test_cancelling_the_caller_aborts_the_request_and_frees_its_slot(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer, max_batch=1, max_seq_len=2048)
        try:
            long = asyncio.create_task(
                engine.generate(
                    GenerateRequest(
                        input_ids=prompts(tokenizer, 1)[0], sampling=SamplingParams(max_new_tokens=100_000)
                    )
                )
            )
            while engine.stats()["tokens_generated"] < 3:
                await asyncio.sleep(0.001)
            long.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long
            # the only slot must be free again: a new request completes
            short = await asyncio.wait_for(
                engine.generate(
                    GenerateRequest(
                        input_ids=prompts(tokenizer, 2)[1], sampling=SamplingParams(max_new_tokens=5)
                    )
                ),
                30,
            )
            return short, engine.stats()
        finally:
            await engine.close()

    short, stats = run(main())
    assert short.output_len == 5
    assert stats["requests_aborted"] == 1 and stats["active"] == 0


def test_close_aborts_in_flight_requests(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer, max_seq_len=2048)
        task = asyncio.create_task(
            engine.generate(
                GenerateRequest(
                    input_ids=prompts(tokenizer, 1)[0], sampling=SamplingParams(max_new_tokens=100_000)
                )
            )
        )
        while engine.stats()["tokens_generated"] < 2:
            await asyncio.sleep(0.001)
        await engine.close()
        resp = await asyncio.wait_for(task, 30)
        with pytest.raises(RuntimeError, match="closed"):
            await engine.generate(GenerateRequest(input_ids=[1]))
        return resp

    resp = run(main())
    assert resp.stop_reason == "abort" and resp.output_len >= 2
    assert len(resp.output_logprobs) == len(resp.output_versions) == resp.output_len


def test_abort_all_returns_partial_responses_and_the_engine_keeps_serving(model, tokenizer):
    async def main():
        engine = make_engine(model, tokenizer, max_seq_len=2048)
        ids = prompts(tokenizer, 2)
        running = asyncio.create_task(
            engine.generate(
                GenerateRequest(input_ids=ids[0], sampling=SamplingParams(max_new_tokens=100_000))
            )
        )
        while engine.stats()["tokens_generated"] < 2:
            await asyncio.sleep(0.001)
        await engine.pause()  # from here nothing decodes: the counts below are exact
        queued = asyncio.create_task(
            engine.generate(GenerateRequest(input_ids=ids[1], sampling=SamplingParams(max_new_tokens=5)))
        )
        await asyncio.sleep(0)  # let it reach the engine's queue
        ended = await engine.abort_all()
        r1, r2 = await asyncio.wait_for(running, 30), await asyncio.wait_for(queued, 30)
        await engine.flush_cache()
        await engine.resume()
        after = await engine.generate(
            GenerateRequest(input_ids=ids[1], sampling=SamplingParams(max_new_tokens=3))
        )
        stats = engine.stats()
        await engine.close()
        return ended, r1, r2, after, stats

    ended, r1, r2, after, stats = run(main())
    assert ended == 2 and stats["requests_aborted"] == 2
    assert r1.stop_reason == "abort" and r1.output_len >= 2 and len(r1.output_logprobs) == r1.output_len
    assert r2.stop_reason == "abort" and r2.output_ids == []
    assert after.stop_reason == "length" and after.output_len == 3


# --------------------------------------------------------------------------- weight updates


def check_two_version_response(prompt, resp, model_a, model_b, new_version=1):
    """Tokens of version 0 follow model_a, later ones model_b (with the KV cache recomputed)."""
    versions = resp.output_versions
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == new_version, versions
    seq = prompt + resp.output_ids
    lp_a, lp_b = full_logprobs(model_a, seq), full_logprobs(model_b, seq)
    for j, (tok, ver) in enumerate(zip(resp.output_ids, versions, strict=True)):
        ref = (lp_a if ver == 0 else lp_b)[len(prompt) - 1 + j, tok].item()
        assert resp.output_logprobs[j] == pytest.approx(ref, abs=2e-5), (j, ver)


@pytest.mark.parametrize("pause_first", [False, True])
def test_update_weights_mid_generation_recomputes_cache(model, model_b, tokenizer, pause_first):
    ps = prompts(tokenizer, 4)

    async def main():
        engine = make_engine(model, tokenizer, update_kv="recompute")
        try:
            tasks = [
                asyncio.create_task(
                    engine.generate(
                        GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=300, seed=i))
                    )
                )
                for i, p in enumerate(ps)
            ]
            while engine.stats()["tokens_generated"] < 4 * 5:
                await asyncio.sleep(0.0005)
            if pause_first:
                await engine.pause()
            await engine.update_weights(model_b.state_dict(), 1)
            assert engine.version == 1
            if pause_first:
                await engine.resume()
            return await asyncio.gather(*tasks), engine.stats()
        finally:
            await engine.close()

    responses, stats = run(main())
    for p, resp in zip(ps, responses, strict=True):
        assert resp.output_len == 300
        check_two_version_response(p, resp, model, model_b)
    assert stats["weight_updates"] == 1 and stats["recomputed_tokens"] > 0


def kept_kv_logprobs(model_a, model_b, seq: list[int], cached: int) -> torch.Tensor:
    """log_softmax of model_b over seq[cached:] attending to the K/V model_a computed for seq[:cached]."""
    with torch.inference_mode():
        from transformers import DynamicCache

        cache = DynamicCache(config=model_a.config)
        # transformers 5.x renames past_key_values to cache
        name = "cache" if "cache" in inspect.signature(model_b.forward).parameters else "past_key_values"
        model_a(torch.tensor([seq[:cached]]), use_cache=True, **{name: cache})
        logits = model_b(torch.tensor([seq[cached:]]), use_cache=True, **{name: cache}).logits
        return torch.log_softmax(logits[0].float(), dim=-1)


def test_update_weights_keep_kv_goes_on_with_the_old_cache(model, model_b, tokenizer):
    """update_kv keep (PipelineRL's in-flight update): nothing is recomputed; every token after the update is
    sampled by model_b attending to the K/V model_a computed, and the prefix cache survives the update."""
    ps = prompts(tokenizer, 3)

    async def main():
        engine = make_engine(model, tokenizer, update_kv="keep")
        try:
            turn1 = await engine.generate(
                GenerateRequest(ps[2], sampling=SamplingParams(max_new_tokens=6, seed=9), trajectory_id="t")
            )
            await engine.pause()
            tasks = [
                asyncio.create_task(
                    engine.generate(GenerateRequest(p, sampling=SamplingParams(max_new_tokens=40, seed=i)))
                )
                for i, p in enumerate(ps[:2])
            ]
            await engine.resume()
            while engine.stats()["tokens_generated"] < 6 + 2 * 5:
                await asyncio.sleep(0.0005)
            await engine.pause()  # both rows stand still: each has its last token not yet in the cache
            before = engine.stats()["tokens_generated"]
            await engine.update_weights(model_b.state_dict(), 1)
            await engine.resume()
            responses = await asyncio.gather(*tasks)
            turn2 = await engine.generate(
                GenerateRequest(
                    ps[2] + turn1.output_ids + ps[0],
                    sampling=SamplingParams(max_new_tokens=3, seed=10),
                    trajectory_id="t",
                )
            )
            with pytest.raises(ValueError, match="kv must be"):
                await engine.update_weights(model_b.state_dict(), 2, kv="Recompute")
            return responses, before, turn2, engine.stats()
        finally:
            await engine.close()

    responses, before, turn2, stats = run(main())
    assert stats["recomputed_tokens"] == 0 and stats["weight_updates"] == 1
    assert turn2.output_versions == [1] * 3 and turn2.usage["cached_prompt_tokens"] > 0  # the prefix stayed
    assert before == 6 + sum(r.output_versions.count(0) for r in responses)
    for p, resp in zip(ps[:2], responses, strict=True):
        k = resp.output_versions.count(0)  # tokens sampled by model_a
        assert k >= 5 and resp.output_versions == [0] * k + [1] * (40 - k)
        seq = p + resp.output_ids
        lp_a = full_logprobs(model, seq)
        lp_kept = kept_kv_logprobs(model, model_b, seq, len(p) + k - 1)
        lp_b = full_logprobs(model_b, seq)
        for j, tok in enumerate(resp.output_ids):
            if j < k:
                assert resp.output_logprobs[j] == pytest.approx(lp_a[len(p) - 1 + j, tok].item(), abs=2e-5), j
            else:
                assert resp.output_logprobs[j] == pytest.approx(lp_kept[j - k, tok].item(), abs=2e-5), j
        fresh = [lp_b[len(p) - 1 + j, tok].item() for j, tok in enumerate(resp.output_ids) if j >= k]
        assert max(abs(a - b) for a, b in zip(resp.output_logprobs[k:], fresh, strict=True)) > 1e-3


def test_update_weights_from_directory(model, model_b, tokenizer, tmp_path):
    model_b.save_pretrained(tmp_path / "v1")
    p = prompts(tokenizer, 1)[0]

    async def main():
        engine = make_engine(model, tokenizer, update_kv="recompute")
        try:
            task = asyncio.create_task(
                engine.generate(
                    GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=300, seed=3))
                )
            )
            while engine.stats()["tokens_generated"] < 3:
                await asyncio.sleep(0.0005)
            await engine.update_weights(tmp_path / "v1", 1)
            return await task
        finally:
            await engine.close()

    check_two_version_response(p, run(main()), model, model_b)


def test_bad_weights_are_rejected_and_old_weights_kept(model, tokenizer):
    p = prompts(tokenizer, 1)[0]
    bad = {k: v for k, v in model.state_dict().items() if "layers.1.mlp" not in k}
    wrong_shape = dict(model.state_dict())
    wrong_shape["model.norm.weight"] = torch.ones(7)

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            before = await engine.generate(
                GenerateRequest(input_ids=p, sampling=SamplingParams(temperature=0, max_new_tokens=8))
            )
            with pytest.raises(ConfigError, match="missing"):
                await engine.update_weights(bad, 1)
            with pytest.raises(ConfigError, match="wrong shapes"):
                await engine.update_weights(wrong_shape, 1)
            with pytest.raises(FileNotFoundError):
                await engine.update_weights("/nonexistent/dir", 1)
            after = await engine.generate(
                GenerateRequest(input_ids=p, sampling=SamplingParams(temperature=0, max_new_tokens=8))
            )
            return before, after, engine.version
        finally:
            await engine.close()

    before, after, version = run(main())
    assert version == 0 and before.output_ids == after.output_ids and after.output_versions == [0] * 8


def test_engine_snapshots_weights_until_update(model, tokenizer):
    """Changing the module after building the engine must not change generation (trainer isolation)."""
    mutable = copy.deepcopy(model)
    p = prompts(tokenizer, 1)[0]

    async def main():
        engine = make_engine(mutable, tokenizer)
        try:
            with torch.no_grad():
                for param in mutable.parameters():
                    param.add_(torch.randn_like(param))
            return await engine.generate(
                GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=10, seed=0))
            )
        finally:
            await engine.close()

    resp = run(main())
    lp = full_logprobs(model, p + resp.output_ids)
    assert resp.output_logprobs == pytest.approx(
        [lp[len(p) - 1 + j, t].item() for j, t in enumerate(resp.output_ids)], abs=2e-5
    )


# --------------------------------------------------------------------------- prefix cache across turns


def test_next_turn_reuses_trajectory_prefix_and_stays_exact(model, tokenizer):
    ps = prompts(tokenizer, 3)
    observation = tokenizer.encode(" observation: Paris is in France.", add_special_tokens=False)

    async def main():
        engine = make_engine(model, tokenizer)
        try:
            turn1 = await asyncio.gather(
                *(
                    engine.generate(
                        GenerateRequest(
                            input_ids=p,
                            trajectory_id=f"t{i}",
                            sampling=SamplingParams(max_new_tokens=15, seed=i),
                        )
                    )
                    for i, p in enumerate(ps)
                )
            )
            turn2_inputs = [p + r.output_ids + observation for p, r in zip(ps, turn1, strict=True)]
            turn2 = await asyncio.gather(
                *(
                    engine.generate(
                        GenerateRequest(
                            input_ids=x,
                            trajectory_id=f"t{i}",
                            sampling=SamplingParams(max_new_tokens=15, seed=9),
                        )
                    )
                    for i, x in enumerate(turn2_inputs)
                )
            )
            return turn2_inputs, turn2, engine.stats()
        finally:
            await engine.close()

    inputs, turn2, stats = run(main())
    for x, resp in zip(inputs, turn2, strict=True):
        # every token of turn 1 except the last sampled one (never fed back) had its K/V cached
        assert resp.usage["cached_prompt_tokens"] == len(x) - len(observation) - 1
        lp = full_logprobs(model, x + resp.output_ids)
        assert resp.output_logprobs == pytest.approx(
            [lp[len(x) - 1 + j, t].item() for j, t in enumerate(resp.output_ids)], abs=2e-5
        )
    assert stats["prefix_reused_tokens"] == sum(r.usage["cached_prompt_tokens"] for r in turn2)


def test_long_prompt_is_prefilled_in_chunks_exactly(model, tokenizer):
    long_prompt = sum(prompts(tokenizer, 12), [])  # ~70 tokens, chunk of 16 -> several steps

    async def main():
        engine = make_engine(model, tokenizer, prefill_chunk=16, max_prefill_tokens=32)
        try:
            short_task = asyncio.create_task(
                engine.generate(
                    GenerateRequest(
                        input_ids=prompts(tokenizer, 1)[0], sampling=SamplingParams(max_new_tokens=30, seed=1)
                    )
                )
            )
            resp = await engine.generate(
                GenerateRequest(input_ids=long_prompt, sampling=SamplingParams(max_new_tokens=10, seed=2))
            )
            await short_task
            return resp
        finally:
            await engine.close()

    resp = run(main())
    lp = full_logprobs(model, long_prompt + resp.output_ids)
    p = len(long_prompt)
    assert resp.output_logprobs == pytest.approx(
        [lp[p - 1 + j, t].item() for j, t in enumerate(resp.output_ids)], abs=2e-5
    )
