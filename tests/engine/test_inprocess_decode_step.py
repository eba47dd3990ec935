"""The in-process engine's decode step: the batch-wide sampler against the plain algorithm it replaced, the
stop-string pre-check against checking every token, one forward for a step's decode rows, and the CUDA-graph
path (padding buckets, spare slot, weights updated in place) run eagerly on the CPU."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest
import torch

from asearch.engine.local import decoder as decoder_mod
from asearch.engine.local import inprocess as inprocess_mod
from asearch.engine.local.decoder import (
    DecodeGraphs,
    DecoderSpec,
    DecoderWeights,
    RoPE,
    SlotKVCache,
    bucket,
    forward,
)
from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
from asearch.engine.local.sampling import RowSampling, filter_logits, sample
from asearch.engine.types import GenerateRequest, SamplingParams
from asearch.models import build_tiny_model

torch.set_num_threads(1)

CORPUS = [
    "Paris is the capital of France; <search>query</search> finds pages, <answer>x</answer> ends.",
    "Zürich und München liegen im Süden; café, naïve, 東京 and 北京 are cities.",
] * 40


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    return make_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture(scope="module")
def model(tokenizer, make_tiny_model):
    return make_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2)


def reference_sample(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[list[int], list[float]]:
    """The sampler written plainly, row by row: log_softmax of the filtered, scaled logits; an inverse-CDF
    draw on exp(log-probs).cumsum with one uniform per row; greedy rows the argmax of the model's log-softmax."""
    B, V = logits.shape
    greedy = all(r.temperature == 0.0 for r in rows)
    tokens, lps = [], []
    for b, r in enumerate(rows):
        model_lp = torch.log_softmax(logits[b : b + 1], -1)
        if r.temperature == 0.0:
            if not greedy:
                r.rng.random()  # every row of a batch with sampled rows draws its uniform
            t = int(model_lp.argmax())
            tokens.append(t)
            lps.append(float(model_lp[0, t]))
            continue
        scaled = logits[b : b + 1] if r.temperature == 1.0 else logits[b : b + 1] / torch.tensor([r.temperature])[:, None]
        if r.top_k > 0 or r.top_p < 1.0:
            scaled = filter_logits(scaled, torch.tensor([r.top_k]), torch.tensor([r.top_p]))
        lp = torch.log_softmax(scaled, -1)
        cdf = lp.exp().cumsum(-1)
        u = torch.tensor([r.rng.random()], dtype=torch.float32)[:, None] * cdf[:, -1:]
        t = int(torch.searchsorted(cdf, u, right=True).clamp(max=V - 1))
        tokens.append(t)
        lps.append(float(lp[0, t]))
    return tokens, lps


@pytest.mark.parametrize("mix", ["greedy", "sampled", "mixed"])
def test_sampler_equals_the_plain_row_by_row_algorithm_exactly(mix):
    g = torch.Generator().manual_seed(3)
    settings = {
        "greedy": [(0.0, 0, 1.0)],
        "sampled": [(1.0, 0, 1.0)],
        "mixed": [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 20, 1.0), (0.9, 0, 0.8), (1.2, 50, 0.95)],
    }[mix]
    for step in range(5):
        logits = torch.randn(12, 700, generator=g) * 3
        params = [settings[i % len(settings)] for i in range(12)]
        rows = [RowSampling(t, k, p, random.Random(step * 100 + i)) for i, (t, k, p) in enumerate(params)]
        ref_rows = [RowSampling(t, k, p, random.Random(step * 100 + i)) for i, (t, k, p) in enumerate(params)]
        assert sample(logits, rows) == reference_sample(logits, ref_rows)


def test_stop_candidates_contain_every_token_that_completes_a_stop_string(model, tokenizer):
    """For random windows and every next token: if a stop string newly appears in the decoded window, the
    token is among the pre-check's candidates (so skipping the others never misses a stop)."""
    engine = InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(max_seq_len=64))
    try:
        rng = random.Random(0)
        vocab = len(tokenizer)
        corpus_ids = tokenizer.encode(" ".join(CORPUS[:2]), add_special_tokens=False)
        for stops in (["</search>", "</answer>"], ["ü"], ["京 and"], [" ends."]):
            cands = engine._stop_candidates(stops)
            assert cands is not None and len(cands) < vocab  # a real filter
            for _ in range(60):
                start = rng.randrange(len(corpus_ids) - 8)
                window = corpus_ids[start : start + rng.randint(0, 8)] + [rng.randrange(vocab) for _ in range(rng.randint(0, 2))]
                before = tokenizer.decode(window, skip_special_tokens=False)
                for t in range(vocab):
                    after = tokenizer.decode([*window, t], skip_special_tokens=False)
                    if any(s in after and s not in before for s in stops):
                        assert t in cands, (stops, window, t, after)
        assert engine._stop_candidates(["bad\ufffd"]) is None
    finally:
        asyncio.run(engine.close())


def test_stop_strings_end_generation_as_when_every_token_is_checked(model, tokenizer, monkeypatch):
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("Paris is", "Zürich und", "<search>", "café")]

    async def run_all():
        engine = InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(max_seq_len=128))
        try:
            reqs = [
                GenerateRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=60, seed=i, stop=["</", "ü", "e "]))
                for i, p in enumerate(prompts * 3)
            ]
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        finally:
            await engine.close()

    filtered = asyncio.run(run_all())
    monkeypatch.setattr(InProcessEngine, "_stop_candidates", lambda self, stops: None)  # check after every token
    checked = asyncio.run(run_all())
    assert [(r.output_ids, r.stop_reason) for r in filtered] == [(r.output_ids, r.stop_reason) for r in checked]
    assert sum(r.stop_reason == "stop" for r in filtered) >= 3


def test_a_step_runs_its_decode_rows_in_one_forward(model, tokenizer, monkeypatch):
    """Ten requests through four slots: later ones join while others decode and long prompts prefill in
    chunks, so prefilling rows sit between decoding ones; still one decode forward a step, and every greedy
    output equals the one decoded alone."""
    decode_forwards: list[int] = []
    real_forward = decoder_mod.forward

    def counting_forward(spec, w, rope, cache, first_slot, tokens, *args, **kw):
        if tokens.shape[1] == 1:
            decode_forwards.append(first_slot)
        return real_forward(spec, w, rope, cache, first_slot, tokens, *args, **kw)

    swaps: list[tuple[int, int]] = []
    real_swap = SlotKVCache.swap
    monkeypatch.setattr(SlotKVCache, "swap", lambda self, a, b, *n: (swaps.append((a, b)), real_swap(self, a, b, *n)))
    rng = random.Random(1)
    prompts = [[rng.randrange(4, len(tokenizer)) for _ in range(rng.choice([3, 40, 90]))] for _ in range(10)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)

    async def main():
        engine = InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(max_batch=4, prefill_chunk=16, max_seq_len=128))
        try:
            alone = [await engine.generate(GenerateRequest(input_ids=p, sampling=copy.copy(greedy))) for p in prompts]
            monkeypatch.setattr(decoder_mod, "forward", counting_forward)
            steps0 = engine.stats()["decode_steps"]

            # Queued while paused, so the step sequence (and so which rows swap) does not hang on timing.
            await engine.pause()
            requests = [GenerateRequest(input_ids=p, sampling=copy.copy(greedy)) for p in prompts]
            tasks = [asyncio.create_task(engine.generate(r)) for r in requests]
            await asyncio.sleep(0)  # every task has queued its request
            await engine.resume()
            together = await asyncio.gather(*tasks)
            return alone, together, engine.stats()["decode_steps"] - steps0
        finally:
            await engine.close()

    alone, together, steps = asyncio.run(main())
    assert swaps  # a decoding row really sat behind a prefilling one
    assert decode_forwards and all(first == 0 for first in decode_forwards)
    assert len(decode_forwards) <= steps
    for a, b in zip(alone, together, strict=True):
        assert a.output_ids == b.output_ids
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)


def test_padded_graph_forward_matches_the_plain_forward_and_keeps_padding_in_the_spare_slot(model):
    spec = DecoderSpec.from_config(model.config)
    weights = DecoderWeights.from_state_dict(spec, model.state_dict(), torch.float32)
    rope = RoPE(model.model.rotary_emb.inv_freq, 1.0, 256, torch.float32)
    plain, padded = SlotKVCache(spec, torch.float32, 8, 256), SlotKVCache(spec, torch.float32, 8, 256, spare_slot=True)
    graphs = DecodeGraphs(spec, rope, padded, 8, capture=False)
    g = torch.Generator().manual_seed(0)
    lens = [7, 30, 2, 65, 11]  # five rows: padded to 8, keys to 128
    plain.ensure(8, 128)
    padded.ensure(8, 128)
    for a, b in zip(plain.kv, padded.kv, strict=True):
        a.normal_(generator=g)
        b.normal_(generator=g)
        b[:8] = a
    tokens = torch.randint(0, spec.vocab_size, (5,), generator=g).tolist()
    want = forward(spec, weights, rope, plain, 0, torch.tensor(tokens)[:, None], torch.tensor(lens), None)
    before = [b.clone() for b in padded.kv]
    got = graphs.logits(weights, tokens, lens)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    for a, b, old in zip(plain.kv, padded.kv, before, strict=True):
        assert torch.allclose(a[:5], b[:5], atol=1e-6)  # the rows' new K/V
        assert torch.equal(b[5:8], old[5:8])  # slots past the rows untouched by the padding rows
        assert not torch.equal(b[8], old[8])  # which wrote into the spare slot
    assert (bucket(5, 8), bucket(65, 256, 64), bucket(3, 6)) == (8, 128, 4)


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    """Engines built in this test take the CUDA-graph path on the CPU; a 'capture' records the padded forward
    with the weights object it was given, and its 'replay' runs that again (into the static output), as a
    graph replays the kernels on the tensors it captured."""
    captured: list[tuple[int, int]] = []

    def fake_capture(self, weights, B, L):
        self._forward(weights, B, L)
        captured.append((B, L))

        class Replay:
            def replay(self_inner):
                self._forward(weights, B, L)

        return Replay()

    monkeypatch.setattr(inprocess_mod, "_graphs_wanted", lambda setting, device: setting is not False)
    monkeypatch.setattr(DecodeGraphs, "_capture", fake_capture)
    return captured


def test_graph_path_decodes_like_the_eager_path_and_updates_weights_in_place(model, tokenizer, graphs_on_cpu):
    model_b = build_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2, seed=1)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("Paris is", "Zürich", "<search>q", "a", "café")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=70)  # keys cross 64: two key buckets

    async def run_all(graphs):
        engine = InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(max_seq_len=200, cuda_graphs=graphs))
        try:
            first = await asyncio.gather(*(engine.generate(GenerateRequest(input_ids=p, sampling=greedy)) for p in prompts))
            embed = engine._weights.embed.data_ptr()
            await engine.update_weights(model_b.state_dict(), version=1)
            same_place = engine._weights.embed.data_ptr() == embed
            second = await asyncio.gather(*(engine.generate(GenerateRequest(input_ids=p, sampling=greedy)) for p in prompts))
            return first, second, same_place, engine.stats()["cuda_graphs"]
        finally:
            await engine.close()

    eager = asyncio.run(run_all(False))
    assert not graphs_on_cpu and eager[3] == 0
    graphed = asyncio.run(run_all(True))
    assert graphed[2] and graphed[3] >= 2  # weights copied where the graphs read them; several buckets
    assert {B for B, _ in graphs_on_cpu} >= {8} and all(L >= 64 for _, L in graphs_on_cpu)
    for runs_e, runs_g in zip(eager[:2], graphed[:2], strict=True):
        for e, g in zip(runs_e, runs_g, strict=True):
            assert e.output_ids == g.output_ids
            assert e.output_logprobs == pytest.approx(g.output_logprobs, abs=1e-5)
    assert [r.output_versions[0] for r in graphed[1]] == [1] * len(prompts)
