"""SGLangEngine against a loopback server speaking SGLang's native API, backed by a real tiny transformers model.

SGLang cannot run here, so the test server implements the subset the engine uses, with the shapes of
SGLang's code: `/generate` (input_ids, sampling_params, return_logprob -> meta_info.output_token_logprobs
as (logprob, token_id, None), finish_reason {type: stop|length|abort}, weight_version), `/pause_generation`
(abort: running requests return what they have and new ones wait; in_place: running requests freeze),
`/continue_generation`, `/update_weights_from_disk` (reloads safetensors from disk), `/flush_cache`,
`/health`. Log-probs are real: the test checks them against a separate forward pass.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from asearch.engine.http import HttpConfig  # noqa: E402
from asearch.engine.sglang import SGLangEngine, SGLangEngineConfig  # noqa: E402
from asearch.engine.types import GenerateRequest, SamplingParams  # noqa: E402
from asearch.errors import RemoteError  # noqa: E402

PROMPT = [11, 42, 97, 150, 23, 64]
FAST_HTTP = HttpConfig(timeout_s=30, connect_timeout_s=2, retries=2, backoff_base_s=0.01, backoff_max_s=0.05)


class TinySGLang:
    """A one-model server with SGLang's request/response shapes; generation is real (transformers)."""

    def __init__(
        self, model_dir: Path, *, token_delay: float = 0.004, arrival_delays: tuple[float, ...] = ()
    ):
        from transformers import AutoTokenizer, Qwen2ForCausalLM

        self.model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.weight_version = "default"
        self.paused: str | None = None  # None, "abort" or "in_place"
        self.running: dict[str, dict] = {}
        self.log: list[str] = []
        self.token_delay = token_delay
        self.arrival_delays = list(arrival_delays)
        self.app = app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request) -> JSONResponse:
            body = await request.json()
            if self.arrival_delays:  # still "on the wire" for this long
                await asyncio.sleep(self.arrival_delays.pop(0))
            while self.paused:  # like TokenizerManager.is_pause_cond: wait for continue_generation
                await asyncio.sleep(0.002)
            return JSONResponse(await self._generate(body))

        @app.post("/pause_generation")
        async def pause_generation(request: Request) -> dict:
            mode = (await request.json() or {}).get("mode", "abort")
            self.log.append(f"pause:{mode}")
            self.paused = mode
            if mode == "abort":
                for state in self.running.values():
                    state["abort"] = True
                while self.running:  # SGLang polls until nothing holds the model
                    await asyncio.sleep(0.002)
            return {}

        @app.post("/continue_generation")
        async def continue_generation() -> dict:
            self.log.append("continue")
            self.paused = None
            return {}

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> JSONResponse:
            body = await request.json()
            self.log.append(f"update:{Path(body['model_path']).name}")
            assert not self.running, "weights must change only when nothing runs"
            try:
                from safetensors.torch import load_file

                state = load_file(str(Path(body["model_path"]) / "model.safetensors"))
                self.model.load_state_dict(state, strict=False)
            except Exception as e:  # noqa: BLE001 - reported to the client like SGLang does
                return JSONResponse({"success": False, "message": f"Failed to update weights: {e}"}, 400)
            if body.get("weight_version") is not None:
                self.weight_version = body["weight_version"]
            return JSONResponse({"success": True, "message": "Succeeded to update model weights."})

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> dict:
            self.log.append("flush_cache")
            return {}

        @app.get("/health")
        async def health() -> dict:
            return {}

    async def _generate(self, body: dict) -> dict:
        sp = body["sampling_params"]
        ids: list[int] = list(body["input_ids"])
        n_prompt = len(ids)
        out: list[tuple[float, int, None]] = []
        gen = torch.Generator().manual_seed(sp["sampling_seed"]) if "sampling_seed" in sp else None
        state = {"abort": False}
        self.running[body["rid"]] = state
        finish: dict = {"type": "length", "length": sp["max_new_tokens"]}
        try:
            for _ in range(sp["max_new_tokens"]):
                await asyncio.sleep(self.token_delay)
                while self.paused == "in_place" and not state["abort"]:
                    await asyncio.sleep(0.002)
                if state["abort"]:
                    finish = {"type": "abort", "message": "Abort before sampling", "status_code": None}
                    break
                with torch.no_grad():
                    logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                if sp["temperature"] == 0:
                    token = int(logits.argmax())
                    lp = torch.log_softmax(logits, -1)
                else:
                    logits = logits / sp["temperature"]
                    if sp["top_k"] > 0:
                        kth = logits.topk(sp["top_k"]).values[-1]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    lp = torch.log_softmax(logits, -1)  # SGLang's default: after temperature/top-k
                    token = int(torch.multinomial(lp.exp(), 1, generator=gen))
                ids.append(token)
                out.append((float(lp[token]), token, None))
                if token in sp["stop_token_ids"]:
                    finish = {"type": "stop", "matched": token}
                    break
                text = self.tokenizer.decode(ids[n_prompt:])
                hit = next((s for s in sp["stop"] if s in text), None)
                if hit is not None:
                    finish = {"type": "stop", "matched": hit}
                    break
        finally:
            del self.running[body["rid"]]
        out_ids = [t for _, t, _ in out]
        return {
            "text": self.tokenizer.decode(out_ids),
            "output_ids": out_ids,
            "meta_info": {
                "id": body["rid"],
                "finish_reason": finish,
                "prompt_tokens": n_prompt,
                "completion_tokens": len(out_ids),
                "weight_version": self.weight_version,
                "output_token_logprobs": out,
            },
        }


# ---------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    torch.set_num_threads(1)
    texts = [
        f"the {w} of city {i} is near the river {w}"
        for i in range(60)
        for w in ("capital", "mayor", "bridge")
    ]
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    root = tmp_path_factory.mktemp("sglang-models")
    out = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model = build_tiny_model(tok, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # wider than the default init so distributions are peaked and seed-specific
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
        out[name] = (model.eval(), save_tiny(model, tok, root / name), tok)
    return out


@contextmanager
def serving(model_dir: Path, **kw):
    from asearch.retrieval.server import serve_in_thread

    server = TinySGLang(model_dir, **kw)
    with serve_in_thread(server.app) as url:
        yield server, url


def ref_logprobs(
    model, prompt: list[int], out: list[int], temperature: float = 1.0, top_k: int = 0
) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def req(n: int, *, seed: int = 0, **sampling) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=n, seed=seed, **sampling)
    )


def engine(url: str, **cfg) -> SGLangEngine:
    return SGLangEngine(url, cfg=SGLangEngineConfig(http=FAST_HTTP, **cfg))


def close(a: list[float], b: list[float], atol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= atol for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------- tests


def test_generate_returns_real_logprobs_and_honours_stops(models) -> None:
    model, path, tok = models["v0"]
    with serving(path) as (server, url):

        async def go():
            eng = engine(url)
            a, b = await asyncio.gather(
                eng.generate(req(12, seed=1)), eng.generate(req(12, seed=2, temperature=0.7, top_k=8))
            )
            g = a.output_ids
            by_id = await eng.generate(req(12, seed=1, stop_token_ids=[g[4]]))
            k = next(i for i in range(2, len(g)) if tok.decode(g[i : i + 1]).strip().isalpha())
            stop_str = tok.decode(g[k : k + 1]).strip()
            by_str = await eng.generate(req(12, seed=1, stop=[stop_str]))
            await eng.close()
            return a, b, by_id, k, stop_str, by_str

        a, b, by_id, k, stop_str, by_str = asyncio.run(go())
    for r in (a, b):
        assert r.stop_reason == "length" and len(r.output_ids) == len(r.output_logprobs) == 12
        assert r.output_versions == [0] * 12 and r.usage == {"prompt_tokens": 6, "completion_tokens": 12}
    assert close(a.output_logprobs, ref_logprobs(model, PROMPT, a.output_ids))
    assert close(b.output_logprobs, ref_logprobs(model, PROMPT, b.output_ids, 0.7, top_k=8))
    first = a.output_ids.index(a.output_ids[4])
    assert by_id.stop_reason == "stop" and by_id.output_ids == a.output_ids[: first + 1]
    assert by_str.stop_reason == "stop" and stop_str in by_str.text
    assert by_str.output_ids == a.output_ids[: len(by_str.output_ids)] and len(by_str.output_ids) <= k + 1


def test_update_mid_request_aborts_resends_and_switches_logprobs(models) -> None:
    m0, m1 = models["v0"][0], models["v1"][0]
    with serving(models["v0"][1], token_delay=0.01) as (server, url):

        async def go():
            eng = engine(url)
            task = asyncio.create_task(eng.generate(req(60, seed=3)))
            await asyncio.sleep(0.2)
            await eng.update_weights(models["v1"][1], version=1)
            interrupted = await task
            after = await eng.generate(req(8, seed=4))
            await eng.close()
            return interrupted, after, eng

        interrupted, after, eng = asyncio.run(go())
    out, vers = interrupted.output_ids, interrupted.output_versions
    n0 = vers.count(0)
    assert interrupted.stop_reason == "length" and len(out) == 60
    assert 0 < n0 < 60 and vers == [0] * n0 + [1] * (60 - n0)
    assert close(interrupted.output_logprobs[:n0], ref_logprobs(m0, PROMPT, out[:n0]))
    assert close(interrupted.output_logprobs[n0:], ref_logprobs(m1, PROMPT, out)[n0:])  # prefix re-prefilled
    assert after.output_versions == [1] * 8 and close(
        after.output_logprobs, ref_logprobs(m1, PROMPT, after.output_ids)
    )
    assert not close(after.output_logprobs, ref_logprobs(m0, PROMPT, after.output_ids), atol=0.1)
    assert server.log == ["pause:abort", "update:v1", "continue"] and server.weight_version == "1"
    assert eng.version == 1 and eng.stats.resends == 1


def test_request_arriving_during_the_pause_is_tagged_with_the_weights_that_ran_it(models) -> None:
    """Sent under version 0, it reaches the server after the pause, waits there, and runs under version 1:
    the server's weight_version label, not the send-time version, names its tokens."""
    m1 = models["v1"][0]
    with serving(models["v0"][1], token_delay=0.002, arrival_delays=(0.5,)) as (server, url):

        async def go():
            eng = engine(url)
            task = asyncio.create_task(eng.generate(req(6, seed=5)))
            await asyncio.sleep(0.05)
            await eng.update_weights(models["v1"][1], version=1)
            return await task

        resp = asyncio.run(go())
    assert resp.output_versions == [1] * 6
    assert close(resp.output_logprobs, ref_logprobs(m1, PROMPT, resp.output_ids))


def test_pause_freezes_in_place_and_resume_continues(models) -> None:
    model, path, _ = models["v0"]
    with serving(path, token_delay=0.01) as (server, url):

        async def go():
            eng = engine(url)
            task = asyncio.create_task(eng.generate(req(40, seed=6)))
            await asyncio.sleep(0.1)
            await eng.pause()
            waiting = asyncio.create_task(eng.generate(req(3, seed=7)))
            await asyncio.sleep(0.4)
            held = (not task.done(), not waiting.done(), len(server.running))
            await eng.resume()
            await eng.flush_cache()
            return held, await task, await waiting, eng

        held, resp, waiting, eng = asyncio.run(go())
    assert held == (True, True, 1)  # frozen on the server; the new request never left the client
    assert resp.stop_reason == "length" and len(resp.output_ids) == 40 and eng.stats.resends == 0
    assert close(resp.output_logprobs, ref_logprobs(model, PROMPT, resp.output_ids))
    assert len(waiting.output_ids) == 3
    assert server.log == ["pause:in_place", "continue", "flush_cache"]


def test_failed_update_keeps_version_and_resumes(models, tmp_path: Path) -> None:
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with serving(models["v0"][1]) as (server, url):

        async def go():
            eng = engine(url)
            with pytest.raises(
                RemoteError, match="update_weights_from_disk(.|\n)*HTTP 400(.|\n)*Failed to update"
            ):
                await eng.update_weights(bad, version=9)
            return eng.version, await eng.generate(req(4, seed=8))

        version, after = asyncio.run(go())
    assert version == 0 and after.output_versions == [0] * 4 and after.stop_reason == "length"
    assert server.log == ["pause:abort", "update:broken", "continue"]
