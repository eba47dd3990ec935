"""Supervised warm-up of a tiny model for the OpenAI-client search agent, on the world expert's episodes.

The world's scripted expert (`asearch.agent.expert.WorldExpert`, with its deliberate mistakes) plays the
model's part through the example agent itself: each completion the agent asks for, the expert answers with a
function call in the hermes format (`<tool_call>{"name": "search", ...}</tool_call>`) or the answer, ended by
`<|im_end|>`. The episodes run through `OpenAIAgentWorkflow`, so they are the agent's own token-exact
trajectories rendered by `CHATML_TOOLS_TEMPLATE`, and supervised training on them teaches the format RL then
sharpens.

    python examples/openai_agent/warmup.py --model runs/demo-seed0/model-sft --data runs/demo-seed0/data/train.jsonl \
        --out runs/openai-agent-sft --episodes 2000 --sft-steps 600
    asearch train configs/train-world-tiny.yaml model=runs/openai-agent-sft workflow.kind=openai_agent \
        workflow.agent=examples/openai_agent/search_agent.py:agent agent.max_new_tokens=64
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asearch.agent.expert import WorldExpert, plan_from_record
from asearch.agent.loop import AgentConfig
from asearch.agent.openai_workflow import OpenAIAgentWorkflow
from asearch.engine.chat_tools import CHATML_TOOLS_TEMPLATE, render_call_text
from asearch.engine.scripted import ScriptedEngine
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
    p_skip: float = 0.5, p_wrong: float = 0.25, concurrency: int = 32,
) -> list[Any]:  # fmt: skip
    """The example agent's episodes on `records` with the expert as its model (one tool set per corpus)."""
    plans = {r["question"]: plan_from_record(r) for r in records}
    engine = ScriptedEngine(tokenizer, ChatExpert(WorldExpert(plans, p_skip=p_skip, p_wrong=p_wrong, seed=seed)))
    corpora = sorted({r["metadata"].get("corpus") or tools_cfg.corpus for r in records})
    built = {c: build_tools(tools_cfg.model_copy(update={"corpus": c, "index": None}), progress=False) for c in corpora}
    tools_of = {c: tools for c, (tools, _) in built.items()}
    cfg = AgentConfig(max_new_tokens=4096, max_context_tokens=1_000_000, max_turns=8, temperature=1.0)
    flow = OpenAIAgentWorkflow(agent, tokenizer, cfg, tools=lambda item: tools_of[item.metadata.get("corpus") or tools_cfg.corpus])

    async def run() -> list[Any]:
        limit = asyncio.Semaphore(concurrency)

        async def one(i: int, r: dict[str, Any]) -> Any:
            async with limit:
                return await flow.arun_episode(engine, r, seed=seed * 1_000_003 + i)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(records))))

    try:
        return [t for t in asyncio.run(run()) if t is not None]
    finally:
        for _, closers in built.values():
            for close in closers:
                close()


def main(argv: Sequence[str] | None = None) -> None:
    import json

    import torch

    from asearch.models.loading import load_model, load_tokenizer
    from asearch.models.tiny import build_tiny_model, save_tiny
    from asearch.rl.sft import SFTConfig, sft, trajectories_to_samples

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model directory: its tokenizer (and shape, with --fresh)")
    p.add_argument("--data", required=True, help="expert questions (jsonl with metadata.evidence: a world set)")
    p.add_argument("--out", required=True)
    p.add_argument("--episodes", type=int, default=2000)
    p.add_argument("--sft-steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fresh", action="store_true", help="a new random model of the same shape instead of the model's weights")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()][: args.episodes]
    tools_cfg = ToolsConfig.model_validate({"search": {"topk": 2, "max_doc_chars": 400, "show_urls": False, "compact": True}, "access": None})
    trajs = expert_trajectories(tokenizer, records, tools_cfg, seed=args.seed)
    reward = sum(t.reward or 0.0 for t in trajs) / max(len(trajs), 1)
    mismatches = sum(t.counters.get("prompt_mismatches", 0) for t in trajs)
    print(f"{len(trajs)} expert episodes: mean reward {reward:.3f}, {mismatches} prompt mismatches")
    model = load_model(args.model)
    if args.fresh:
        c = model.config
        model = build_tiny_model(tokenizer, hidden=c.hidden_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
                                 max_positions=c.max_position_embeddings, seed=args.seed)  # fmt: skip
    # the demo's SFT: loss also on read tokens a copy could predict (docs/demo.md)
    sft_cfg = SFTConfig(steps=args.sft_steps, seed=args.seed, token_budget=2048, context_loss_weight=1.0, context_tokens="repeated")
    losses = sft(model, trajectories_to_samples(trajs), sft_cfg)
    print(f"SFT {args.sft_steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    save_tiny(model, tokenizer, Path(args.out))


if __name__ == "__main__":
    main()
