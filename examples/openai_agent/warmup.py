"""Supervised warm-up of a tiny model for the OpenAI-client search agent, on the world expert's episodes.

The world's scripted expert (`asearch.agent.expert.WorldExpert`, with its deliberate mistakes) plays the
model's part through the example agent itself: each completion the agent asks for, the expert answers with a
function call in the hermes format (`<tool_call>{"name": "search", ...}</tool_call>`) or the answer, ended by
`<|im_end|>`. The episodes run through `OpenAIAgentWorkflow`, so they are the agent's own token-exact
trajectories rendered by `CHATML_TOOLS_TEMPLATE`, and supervised training on them teaches the format RL then
sharpens.

    python examples/openai_agent/warmup.py --demo runs/demo-seed0 --out runs/openai-agent-sft
    asearch train runs/demo-seed0/rl/config.yaml model=runs/openai-agent-sft engine.model=runs/openai-agent-sft \
        out=runs/openai-agent-rl workflow.kind=openai_agent workflow.agent=examples/openai_agent/search_agent.py:agent

`--demo` takes a finished (or SFT-done) `asearch demo` run: its training questions, its model shape (fresh
weights), its tokenizer recipe (fitted on this agent's own text, `fitted_tokenizer`; `--tokenizer demo` takes the
demo's tokenizer itself), its expert's mistakes, SFT settings and episode count, so the two agents start alike
(`compare.sh` runs both).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asearch.agent.expert import WorldExpert, plan_from_record
from asearch.agent.loop import AgentConfig
from asearch.agent.openai_workflow import OpenAIAgentWorkflow
from asearch.engine.chat_tools import CHATML_TOOLS_TEMPLATE, render_call_text
from asearch.engine.local.scripted import ScriptedEngine
from asearch.tools import ToolsConfig, build_tools

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_agent import agent  # noqa: E402

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.S)
_ACT = re.compile(r"<(search|answer)> ?(.*?)</\1>", re.S)
END = "<|im_end|>"


class ChatExpert:
    """The world expert over a chat prompt: the question and the tool results read off the template's turns,
    handed to the expert in its own format; its action written back as a call or an answer. A name keeps the
    space before it (`{"query": " Kota Films"}`, ` Kota Films`): byte-level BPE spells a word after `"` or a
    newline with other tokens than the question and the results do, which a tiny model cannot copy (docs/demo.md)."""

    def __init__(self, expert: WorldExpert):
        self.expert = expert

    def __call__(self, prompt: str) -> str:
        users = _USER.findall(prompt)
        question = users[-1].strip() if users else ""
        results = "".join(f"\n<information>\n{r}\n</information>\n" for r in _TOOL.findall(prompt))
        m = _ACT.search(self.expert(f"Question: {question}\n{results}"))
        action, text = (m.group(1), " " + m.group(2).strip()) if m else ("answer", " unknown")
        if action == "search":
            return render_call_text([{"name": "search", "arguments": {"query": text}}], "hermes") + END
        return text + END


def expert_trajectories(
    tokenizer: Any, records: Sequence[dict[str, Any]], tools_cfg: ToolsConfig, *, seed: int = 0,
    p_skip: float = 0.5, p_wrong: float = 0.25, skip_at: str = "every", concurrency: int = 32,
) -> list[Any]:  # fmt: skip
    """The example agent's episodes on `records` with the expert as its model: one expert and one tool set per
    world (a question's text may recur in another world with another answer)."""
    by_corpus: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, r in enumerate(records):
        by_corpus[r["metadata"].get("corpus") or tools_cfg.corpus].append((i, r))
    cfg = AgentConfig(max_new_tokens=4096, max_context_tokens=1_000_000, max_turns=8, temperature=1.0)
    built = {c: build_tools(tools_cfg.model_copy(update={"corpus": c, "index": None}), progress=False) for c in by_corpus}

    async def world(k: int, corpus: str, items: list[tuple[int, dict[str, Any]]]) -> list[Any]:
        plans = {r["question"]: plan_from_record(r) for _, r in items}
        expert = WorldExpert(plans, p_skip=p_skip, p_wrong=p_wrong, seed=seed + 7919 * k, skip_at=skip_at)
        engine = ScriptedEngine(tokenizer, ChatExpert(expert))
        flow = OpenAIAgentWorkflow(agent, tokenizer, cfg, tools=built[corpus][0])
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int, r: dict[str, Any]) -> Any:
            async with limit:
                return await flow.arun_episode(engine, r, seed=seed * 1_000_003 + i)

        return list(await asyncio.gather(*(one(i, r) for i, r in items)))

    async def run() -> list[Any]:
        return [t for part in await asyncio.gather(*(world(k, c, items) for k, (c, items) in enumerate(sorted(by_corpus.items())))) for t in part]

    try:
        return [t for t in asyncio.run(run()) if t is not None]
    finally:
        for _, closers in built.values():
            for close in closers:
                close()


def fitted_tokenizer(demo: Any) -> Any:
    """A BPE fitted by the demo's recipe (its vocabulary size, on its tokenizer worlds: no training or held-out
    world) on the example's own text: those worlds' pages as search results and the expert's episodes there
    through this agent. The demo's tokenizer knows its agent's tags; this one knows the chat template's roles,
    the call's JSON and the system prompt, which the demo's spells out byte by byte (docs/agents-openai.md)."""
    from asearch.demo.pipeline import page_texts, tokenizer_worlds
    from asearch.models.tiny import DEFAULT_SPECIAL_TOKENS, train_bpe_tokenizer

    byte_tokenizer = train_bpe_tokenizer([], vocab_size=300)  # no merges: the episodes decode to their exact text
    byte_tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    specials = re.compile("|".join(map(re.escape, DEFAULT_SPECIAL_TOKENS)))
    texts: list[str] = []
    for corpus, tools, records in tokenizer_worlds(demo):
        rows = [r.to_jsonl_dict() for r in records]
        trajs = expert_trajectories(byte_tokenizer, rows, tools, seed=demo.seed, p_skip=demo.p_skip, p_wrong=demo.p_wrong, skip_at=demo.skip_at)
        episodes = (byte_tokenizer.decode([t for seg in traj.segments for t in seg.token_ids]) for traj in trajs)
        texts += [specials.sub("\n", text) for text in episodes]
        texts += page_texts(corpus, tools.search.topk)
    tokenizer = train_bpe_tokenizer(texts, vocab_size=demo.vocab_size, whole_numbers=demo.whole_numbers)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    return tokenizer


def main(argv: Sequence[str] | None = None) -> None:
    import json

    import torch

    from asearch.config import load_config
    from asearch.demo.pipeline import DemoConfig
    from asearch.models.loading import load_model, load_tokenizer
    from asearch.models.tiny import build_tiny_model, save_tiny
    from asearch.rl.sft import sft, trajectories_to_samples

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", required=True, type=Path, help="an asearch demo run directory (its data/ and model-sft/)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--episodes", type=int, default=None, help="expert episodes (default: the demo's)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the demo's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for SFT (default: the demo's setup_threads)")
    p.add_argument("--tokenizer", choices=["own", "demo"], default="own",
                   help="own: a BPE fitted by the demo's recipe on this agent's text (fitted_tokenizer); demo: the demo's")
    args = p.parse_args(argv)
    demo = load_config(DemoConfig, args.demo / "config.yaml", [])
    torch.manual_seed(demo.seed)
    if args.tokenizer == "own":
        tokenizer = fitted_tokenizer(demo)
    else:
        tokenizer = load_tokenizer(args.demo / "model-sft")
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    questions = [json.loads(line) for line in (args.demo / "data" / "train.jsonl").read_text().splitlines() if line.strip()]
    records = list(itertools.islice(itertools.cycle(questions), args.episodes or demo.expert_episodes))
    trajs = expert_trajectories(tokenizer, records, demo.rl.tools, seed=demo.seed, p_skip=demo.p_skip, p_wrong=demo.p_wrong, skip_at=demo.skip_at)
    reward = sum(t.reward or 0.0 for t in trajs) / max(len(trajs), 1)
    mismatches = sum(t.counters.get("prompt_mismatches", 0) for t in trajs)
    samples = trajectories_to_samples(trajs)
    mean_len = sum(len(s.token_ids) for s in samples) / max(len(samples), 1)
    print(f"{len(trajs)} expert episodes: mean reward {reward:.3f}, {mismatches} prompt mismatches, mean {mean_len:.0f} tokens", flush=True)
    c = load_model(args.demo / "model-sft").config  # the demo's shape, fresh weights: both agents start from SFT alone
    model = build_tiny_model(tokenizer, hidden=c.hidden_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
                             max_positions=c.max_position_embeddings, seed=demo.seed)  # fmt: skip
    model.set_attn_implementation(demo.attention)
    torch.set_num_threads(args.threads or demo.setup_threads)
    sft_cfg = demo.sft.model_copy(update={"seed": demo.seed, **({"steps": args.sft_steps} if args.sft_steps else {})})

    def on_step(step: int, loss: float) -> None:
        if (step + 1) % 100 == 0:
            print(f"sft step {step + 1}/{sft_cfg.steps} loss {loss:.3f}", flush=True)

    losses = sft(model, samples, sft_cfg, on_step=on_step)
    print(f"SFT {sft_cfg.steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    save_tiny(model, tokenizer, args.out)


if __name__ == "__main__":
    main()
