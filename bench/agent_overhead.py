"""Agent-loop overheads on CPU. Section `engine`: the in-process engine's decode tokens/s at several
batch sizes beside plain transformers `model.generate` on the same model, in the same run.

Each batch is B concurrent requests with equal prompts and exactly N new tokens (no stop), timed from
submission to the last response, prefill included; the HF baseline generates the same B x N tokens
with `do_sample=True` and a KV cache. The table goes to stdout and bench/results/agent_overhead.md.

    .venv/bin/python bench/agent_overhead.py                       # tiny model, batch 1/16/64, 128 tokens
    .venv/bin/python bench/agent_overhead.py --models tiny,smollm2 --threads 2

Section `runtime`: turns/s the agent loop drives at 1, 64 and 512 concurrent agents with an instant engine
and in-memory search, against the same engine and tool calls made in a bare loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from asearch.files import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "agent_overhead.md"


# --------------------------------------------------------------------------- models


def tiny_model():
    """The CPU demo's model class: byte-level BPE (2k vocab) + Qwen2 d=128, 4 layers, random weights."""
    from asearch.models import build_tiny_model, train_bpe_tokenizer

    # Any fixed offline text works for the tokenizer; the installed asearch sources are always present.
    src = Path(__file__).resolve().parent.parent / "src" / "asearch"
    texts = [p.read_text() for p in sorted(src.rglob("*.py"))] * 4
    tok = train_bpe_tokenizer(texts, vocab_size=2048)
    return build_tiny_model(tok, hidden=128, layers=4, heads=4, seed=0), tok


def smollm2_model():
    from asearch.models import load_model, load_tokenizer

    return load_model("smollm2-135m-instruct"), load_tokenizer("smollm2-135m-instruct")


MODELS: dict[str, Callable[[], tuple]] = {"tiny": tiny_model, "smollm2": smollm2_model}


# --------------------------------------------------------------------------- measurements


def engine_tokens_per_s(
    model, batch: int, prompt: list[int], new_tokens: int, threads: int
) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process) for `batch` concurrent requests."""
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.types import GenerateRequest, SamplingParams

    cfg = InProcessEngineConfig(
        threads=threads, max_batch=max(batch, 1), max_seq_len=len(prompt) + new_tokens + 1
    )

    async def run() -> tuple[float, float]:
        engine = InProcessEngine(model, cfg=cfg)
        try:

            def req(i: int) -> GenerateRequest:
                return GenerateRequest(
                    input_ids=prompt, sampling=SamplingParams(max_new_tokens=new_tokens, seed=i)
                )

            await engine.generate(
                GenerateRequest(input_ids=prompt, sampling=SamplingParams(max_new_tokens=8))
            )  # warm-up
            t, c = time.perf_counter(), time.process_time()
            responses = await asyncio.gather(*(engine.generate(req(i)) for i in range(batch)))
            elapsed, cpu = time.perf_counter() - t, time.process_time() - c
            assert all(r.output_len == new_tokens for r in responses)
            return batch * new_tokens / elapsed, batch * new_tokens / cpu
        finally:
            await engine.close()

    return asyncio.run(run())


def hf_tokens_per_s(model, batch: int, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    """The same for transformers `generate` (sampling, KV cache) in this thread."""
    ids = torch.tensor([prompt] * batch)
    kw = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
    )
    with torch.inference_mode():
        model.generate(ids[:1], **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
        t, c = time.perf_counter(), time.process_time()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kw)
        elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    assert out.shape == (batch, len(prompt) + new_tokens)
    return batch * new_tokens / elapsed, batch * new_tokens / cpu


def section_engine(args: argparse.Namespace) -> str:
    """In-process engine vs HF generate: tokens/s per batch size, and the batch-16 / batch-1 ratio."""
    torch.set_num_threads(args.threads)
    lines = [
        f"## In-process engine decode throughput ({args.new_tokens} new tokens/request, prompt {args.prompt_tokens} tokens, "
        f"{args.threads} torch thread(s))",
        "",
        "Wall tok/s is what a user sees; tok per CPU-second (process CPU time) is robust to other load on a",
        "shared box. Both include the prefill of the prompts.",
        "",
        "| model | params | batch | engine tok/s | HF generate tok/s | engine / HF | engine tok/CPU-s | HF tok/CPU-s | engine / HF (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name in args.models.split(","):
        model, tok = MODELS[name]()
        model.eval()
        prompt = (tok.encode("The capital of France is Paris. " * 64, add_special_tokens=False) * 4)[
            : args.prompt_tokens
        ]
        per_batch = {}
        nan = (float("nan"), float("nan"))
        for b in args.batches:
            e, e_cpu = engine_tokens_per_s(model, b, prompt, args.new_tokens, args.threads)
            h, h_cpu = hf_tokens_per_s(model, b, prompt, args.new_tokens) if not args.skip_hf else nan
            per_batch[b] = e
            row = (
                f"| {name} | {model.num_parameters() / 1e6:.1f}M | {b} | {e:,.0f} | {h:,.0f} | {e / h:.2f}x "
                f"| {e_cpu:,.0f} | {h_cpu:,.0f} | {e_cpu / h_cpu:.2f}x |"
            )
            lines.append(row)
            print(row, flush=True)
        if 1 in per_batch and 16 in per_batch:
            ratio = per_batch[16] / per_batch[1]
            verdict = "meets" if ratio >= 3 else "MISSES"
            notes.append(f"- {name}: engine batch 16 / batch 1 = {ratio:.1f}x ({verdict} the >= 3x target)")
    return "\n".join([*lines, "", *notes])


class InstantEngine:
    """An engine that answers instantly with a fixed search action: isolates the agent runtime's own cost."""

    def __init__(self, tokenizer):
        from asearch.engine.types import GenerateResponse

        self._ids = tokenizer.encode("<search>capital of Tarnia</search>", add_special_tokens=False)
        self._response = GenerateResponse
        self.version = 0

    async def generate(self, request):
        n = len(self._ids)
        return self._response(list(self._ids), [0.0] * n, [0] * n, "stop", input_len=len(request.input_ids or []))

    async def close(self) -> None:
        return None


class InMemoryRetriever:
    """Three fixed hits for any query: search costs nothing but the tool's own plumbing."""

    name = "in-memory"

    def __init__(self):
        from asearch.corpus.types import Passage
        from asearch.retrieval.base import SearchHit

        self.hits = [
            SearchHit(Passage(f"p{i}", f"Doc {i}", "Oslen is a city in Tarnia. " * 4, f"https://x.example/{i}"), 1.0)
            for i in range(3)
        ]

    def search(self, queries, topk):
        return [self.hits[:topk] for _ in queries]


def section_runtime(args: argparse.Namespace) -> str:
    """Agent-loop turns/s with an instant engine and in-memory search, vs the bare engine + tool calls."""
    from asearch.agent import AgentConfig, run_episode
    from asearch.models.tiny import train_bpe_tokenizer
    from asearch.tools import SearchTool, run_tool

    tok = train_bpe_tokenizer(["<search>capital of Tarnia</search> Oslen is a city in Tarnia."] * 50, vocab_size=400)
    engine = InstantEngine(tok)
    tool = SearchTool(InMemoryRetriever(), {"topk": 3})
    turns = args.turns_per_agent
    cfg = AgentConfig(style="search-r1", max_turns=turns, max_context_tokens=10**6)
    lines = [
        f"## Agent runtime turns/s (instant engine, in-memory search, {turns} turns per agent)",
        "",
        "Baseline: the same engine and tool calls in a bare loop (no prompts, parsing, tokenizing or records).",
        "",
        "| agents | runtime turns/s | bare calls turns/s | runtime / bare |",
        "|---|---|---|---|",
    ]
    notes = []

    async def runtime(n):
        t = time.perf_counter()
        trajs = await asyncio.gather(*(run_episode(engine, tok, {"search": tool}, "Where is Oslen?", cfg) for _ in range(n)))
        assert all(tr.num_turns == turns for tr in trajs)
        return n * turns / (time.perf_counter() - t)

    async def bare(n):
        from asearch.engine.types import GenerateRequest

        async def one():
            for _ in range(turns):
                await engine.generate(GenerateRequest(input_ids=[1, 2, 3]))
                await run_tool(tool, "capital of Tarnia")

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n * turns / (time.perf_counter() - t)

    for n in args.agents:
        r = asyncio.run(runtime(n))
        b = asyncio.run(bare(n))
        row = f"| {n} | {r:,.0f} | {b:,.0f} | {r / b:.2f} |"
        lines.append(row)
        print(row, flush=True)
        if n == max(args.agents):
            verdict = "meets" if r >= 5000 else "MISSES"
            notes.append(f"- {n} agents: {r:,.0f} turns/s ({verdict} the >= 5,000 turns/s target)")
    return "\n".join([*lines, "", *notes])


SECTIONS: dict[str, Callable[[argparse.Namespace], str]] = {"engine": section_engine, "runtime": section_runtime}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="engine,runtime", help=f"comma list of {sorted(SECTIONS)}")
    ap.add_argument("--models", default="tiny", help=f"comma list of {sorted(MODELS)}")
    ap.add_argument("--batches", default="1,16,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (2 only when the machine is otherwise idle)"
    )
    ap.add_argument("--skip-hf", action="store_true", help="engine numbers only")
    ap.add_argument("--agents", default="1,64,512", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--turns-per-agent", type=int, default=20)
    args = ap.parse_args()

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    parts = [SECTIONS[s](args) for s in args.sections.split(",")]
    load_after = os.getloadavg()
    header = (
        f"# Agent overhead bench\n\n`{' '.join(sys.argv)}` on {os.cpu_count()} CPUs, torch {torch.__version__}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({time.perf_counter() - t0:.0f} s). "
        "Other processes on a shared box slow every row alike; compare rows within one run.\n"
    )
    report = "\n\n".join([header, *parts]) + "\n"
    print("\n" + report)
    atomic_write_text(RESULTS, report)


if __name__ == "__main__":
    main()
