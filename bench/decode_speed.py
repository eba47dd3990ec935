"""Decode speed of the in-process engine: tokens/s at several batch sizes, this tree against a base commit.

Every request gets the same kind of prompt (`--prompt-len` random token ids) and decodes exactly
`--new-tokens` tokens: no stop token ids (EOS ignored), and the agent's stop strings (`</search>`,
`</answer>`), which a random model does not produce, so they cost their check and nothing else; the
script fails if any response is shorter. Sampling is the rollout setting (temperature 1, a seed per
request); `--greedy` measures argmax decoding instead. Two random Qwen2 shapes:

    demo   the CPU demo's model: hidden 128, 4 layers, 4/2 heads, byte-level BPE of 2,000 tokens
    wide   hidden 512, 4 layers, 8/2 heads, intermediate 1,536, byte-level BPE of 32,000 tokens

decode tok/s is the difference of two runs of the same requests, 2 and `--new-tokens` tokens long (same
prompts, same prefill): the extra tokens over the extra time; end-to-end tok/s counts every token of the long
run from submission; per CPU-second counts the same tokens over the engine decode thread's CPU time (its one
torch thread does all the work), which other load on the box disturbs less than wall time. The last column
compares the first runs of both trees: how many responses have the same tokens, and the largest difference of
their log-probs over the tokens both sampled alike (the engine's C kernels sum in another order than torch's,
so a draw that falls within rounding of a token boundary may differ). Each
(shape, batch) is run `--repeats` times alternating base and new, and the median of each is kept (the box is
shared). Requests are queued while the engine is paused, so the first step admits them all and every run
decodes the same batches. The base runs the same script in a subprocess on a git worktree of `--baseline-rev`.

    flock /tmp/asearch-heavy.lock .venv/bin/python bench/decode_speed.py --shapes demo --repeats 5    # base 1685d1a
    flock /tmp/asearch-heavy.lock .venv/bin/python bench/decode_speed.py --shapes wide --batches 1,64 \
        --out bench/results/decode_speed_wide.md
    .venv/bin/python bench/decode_speed.py --baseline-rev none --batches 1,8         # this tree only
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import ROOT, import_moved, worktree  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "decode_speed.md"
STOP_STRINGS = ["</search>", "</answer>"]
PREFILL_RUN_TOKENS = 2  # the short run of each measurement: prefill and one decode step
SHAPES = {
    "demo": {"vocab": 2000, "hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 384},
    "wide": {"vocab": 32000, "hidden": 512, "layers": 4, "heads": 8, "kv_heads": 2, "intermediate": 1536},
}


def build_models(root: Path, shapes: list[str]) -> dict[str, Path]:
    """Save a random Qwen2 with its own BPE tokenizer per shape under `root` (same seed: same weights)."""
    from asearch.models.tiny import build_tiny_model, save_tiny, train_bpe_tokenizer

    rng = random.Random(0)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(40000)]
    texts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(4000)]
    texts.append(" ".join(STOP_STRINGS))
    out = {}
    for name in shapes:
        s = SHAPES[name]
        tok = train_bpe_tokenizer(texts, vocab_size=s["vocab"])
        model = build_tiny_model(
            tok, hidden=s["hidden"], layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"],
            intermediate=s["intermediate"], max_positions=4096, seed=0,
        )  # fmt: skip
        out[name] = save_tiny(model, tok, root / name)
    return out


# --------------------------------------------------------------------------- one engine, in this process


async def timed_batch(engine, batch: int, new_tokens: int, prompt_len: int, vocab: int, greedy: bool):
    """(wall seconds, decode-thread CPU seconds, responses) for `batch` concurrent requests of `new_tokens` each."""
    from asearch.engine.types import GenerateRequest, SamplingParams

    rng = random.Random(batch)
    reqs = [
        GenerateRequest(
            input_ids=[rng.randrange(8, vocab) for _ in range(prompt_len)],
            sampling=SamplingParams(
                temperature=0.0 if greedy else 1.0, max_new_tokens=new_tokens, stop=STOP_STRINGS, seed=i
            ),
        )
        for i in range(batch)
    ]
    clock = time.pthread_getcpuclockid(engine._thread.ident)  # the engine's decode thread (1 torch thread)
    # Paused while the requests are queued, so the first step admits them all: the same batches every run.
    await engine.pause()
    tasks = [asyncio.create_task(engine.generate(r)) for r in reqs]
    await asyncio.sleep(0)  # each task has queued its request
    t0, c0 = time.perf_counter(), time.clock_gettime(clock)
    await engine.resume()
    resps = await asyncio.gather(*tasks)
    seconds, cpu = time.perf_counter() - t0, time.clock_gettime(clock) - c0
    short = [len(r.output_ids) for r in resps if len(r.output_ids) != new_tokens]
    if short:
        raise SystemExit(f"batch {batch}: {len(short)} responses did not decode {new_tokens} tokens: {short[:5]}")
    return seconds, cpu, resps


async def measure(engine, batch: int, new_tokens: int, prompt_len: int, vocab: int, greedy: bool) -> dict:
    """Decode rate from two runs of the same requests, PREFILL_RUN_TOKENS and `new_tokens` long: their
    difference is decode alone (same prompts, same prefill)."""
    short_s, short_cpu, _ = await timed_batch(engine, batch, PREFILL_RUN_TOKENS, prompt_len, vocab, greedy)
    long_s, long_cpu, resps = await timed_batch(engine, batch, new_tokens, prompt_len, vocab, greedy)
    ids = [t for r in resps for t in r.output_ids]
    logprobs = [x for r in resps for x in r.output_logprobs]
    return {
        "decode_tps": batch * (new_tokens - PREFILL_RUN_TOKENS) / (long_s - short_s),
        "decode_cpu_tps": batch * (new_tokens - PREFILL_RUN_TOKENS) / (long_cpu - short_cpu),
        "e2e_tps": batch * new_tokens / long_s,
        "ids_sha": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12],
        "logprobs_sha": hashlib.sha256(json.dumps(logprobs).encode()).hexdigest()[:12],
        "outputs": [[r.output_ids, r.output_logprobs] for r in resps],
    }


async def run_worker(model_dir: str, batches: list[int], new_tokens: int, prompt_len: int, greedy: bool) -> dict:
    import torch

    import asearch
    inprocess = import_moved("asearch.engine.local.inprocess")  # the base commit's engine when it runs there
    InProcessEngine, InProcessEngineConfig = inprocess.InProcessEngine, inprocess.InProcessEngineConfig

    torch.set_num_threads(1)
    cfg = InProcessEngineConfig(max_batch=max(batches), max_seq_len=prompt_len + new_tokens + 8, threads=1, prefix_cache_mb=0)
    engine = InProcessEngine.from_pretrained(model_dir, cfg=cfg)
    vocab = engine.spec.vocab_size
    try:
        await timed_batch(engine, max(batches), 4, prompt_len, vocab, greedy)  # warm-up; grows the KV cache once
        out = {str(b): await measure(engine, b, new_tokens, prompt_len, vocab, greedy) for b in batches}
    finally:
        await engine.close()
    out["src"] = str(Path(asearch.__file__).parent)
    return out


# --------------------------------------------------------------------------- driver


def run_side(src: Path, model_dir: Path, args: argparse.Namespace, batches: list[int]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, __file__, "--worker", str(model_dir), "--batches", ",".join(map(str, batches)),
        "--new-tokens", str(args.new_tokens), "--prompt-len", str(args.prompt_len),
    ] + (["--greedy"] if args.greedy else [])  # fmt: skip
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result.pop("src")).resolve() != (src / "asearch").resolve():
        raise SystemExit(f"worker imported asearch from the wrong tree (wanted {src})")
    return result


def best(runs: list[dict], batch: int, key: str) -> float:
    """The median over repeats (robust to a run slowed by other load)."""
    return statistics.median(r[str(batch)][key] for r in runs)


def agreement(base: dict, new: dict) -> str:
    """'same responses / all; largest |log-prob difference| over each response's tokens up to its first
    different one'."""
    same, worst = 0, 0.0
    for (ids_a, lps_a), (ids_b, lps_b) in zip(base["outputs"], new["outputs"], strict=True):
        same += ids_a == ids_b
        for ta, tb, la, lb in zip(ids_a, ids_b, lps_a, lps_b, strict=True):
            if ta != tb:
                break
            worst = max(worst, abs(la - lb))
    return f"{same}/{len(base['outputs'])}; {worst:.1e}"


def table(results: dict, batches: list[int], has_base: bool) -> str:
    if not has_base:
        lines = ["| shape | batch | decode tok/s | per CPU-second | end-to-end tok/s |", "|---|---:|---:|---:|---:|"]
        for shape, sides in results.items():
            for b in batches:
                n = sides["new"]
                lines.append(f"| {shape} | {b} | {best(n, b, 'decode_tps'):,.0f} | {best(n, b, 'decode_cpu_tps'):,.0f} | "
                             f"{best(n, b, 'e2e_tps'):,.0f} |")  # fmt: skip
        return "\n".join(lines)
    lines = [
        "| shape | batch | decode tok/s base -> new | ratio | per CPU-second base -> new | ratio | end-to-end ratio | same tokens; max abs log-prob diff |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape, sides in results.items():
        for b in batches:
            new, base = sides["new"], sides["base"]
            cells = []
            for key in ("decode_tps", "decode_cpu_tps"):
                cells += [f"{best(base, b, key):,.0f} -> {best(new, b, key):,.0f}", f"{best(new, b, key) / best(base, b, key):.2f}x"]
            e2e = best(new, b, "e2e_tps") / best(base, b, "e2e_tps")
            lines.append(f"| {shape} | {b} | " + " | ".join(cells) + f" | {e2e:.2f}x | {agreement(base[0][str(b)], new[0][str(b)])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-rev", default="1685d1a", help="commit to compare against ('none': this tree only)")
    ap.add_argument("--shapes", default="demo,wide")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--greedy", action="store_true", help="argmax decoding instead of temperature-1 sampling")
    ap.add_argument("--out", type=Path, default=RESULTS, help="markdown table ('-': none)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker:
        print(json.dumps(asyncio.run(run_worker(args.worker, batches, args.new_tokens, args.prompt_len, args.greedy))))
        return
    has_base = args.baseline_rev != "none"
    base_src = worktree(args.baseline_rev) / "src" if has_base else None
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(Path(tmp), args.shapes.split(","))
        for shape, model_dir in models.items():
            sides: dict[str, list] = {"new": [], "base": []}
            for rep in range(args.repeats):
                for side, src in (("base", base_src), ("new", ROOT / "src")):
                    if src is None:
                        continue
                    sides[side].append(run_side(src, model_dir, args, batches))
                    shown = {b: {k: v for k, v in r.items() if k != "outputs"} for b, r in sides[side][-1].items()}
                    print(f"{shape} {side} run {rep + 1}: " + json.dumps(shown), flush=True)
            results[shape] = sides
    mode = "greedy" if args.greedy else "temperature 1, seeded"
    text = (
        f"# In-process decode speed ({mode}; prompt {args.prompt_len} tokens, {args.new_tokens} new; 1 thread; "
        f"median of {args.repeats})\n\n"
        + (f"base: {args.baseline_rev}\n\n" if has_base else "")
        + table(results, batches, has_base)
        + "\n"
    )
    print(text)
    if str(args.out) != "-":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
