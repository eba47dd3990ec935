"""Test helper (not a test module): the eval runner over generated questions with a scripted agent.

Run as `python tests/eval/killable_eval.py OUT_DIR [--n 40] [--k 2] [--sleep 0.05]`; the kill test
kills it with SIGKILL mid-run and runs it again. Imported by the tests for the same records and solve.

The scripted agent answers question i (golds ["word<i>"]) by class i % 5, so every metric has a
hand-computable value: 0 wrong, 1 right on even seeds only, 2 "word<i> maybe" (F1 2/3, CEM 1),
3 never answers (a malformed turn until max_turns=3), 4 right.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

from asearch.agent import AgentConfig, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.eval.datasets import QARecord
from asearch.eval.runner import evaluate

AGENT = AgentConfig(style="search-r1", max_turns=3, max_new_tokens=64, max_context_tokens=4096)


class CharTokenizer:
    """One token per character: enough of a tokenizer for the loop and the scripted engine."""

    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def make_records(n: int = 40, dataset: str = "codes") -> list[QARecord]:
    return [
        QARecord(
            id=f"q{i:03d}",
            question=f"What is the code word of item {i}?",
            golds=[f"word{i}"],
            dataset=dataset,
        )
        for i in range(n)
    ]


def make_policy(seed: int):
    def policy(prompt: str) -> str:
        i = int(re.findall(r"code word of item (\d+)\?", prompt)[-1])
        kind = i % 5
        if kind == 0:
            return "<think>guess</think><answer>wrong</answer>"
        if kind == 1:
            return f"<answer>{'word' + str(i) if seed % 2 == 0 else 'wrong'}</answer>"
        if kind == 2:
            return f"<answer>word{i} maybe</answer>"
        if kind == 3:
            return "<think>I am not sure what to do"  # never an action: a parse error every turn
        return f"<think>easy</think><answer>word{i}</answer>"

    return policy


def make_solve(sleep_s: float = 0.0):
    tok = CharTokenizer()

    async def solve(record: QARecord, seed: int):
        if sleep_s:
            await asyncio.sleep(sleep_s)
        engine = ScriptedEngine(tok, make_policy(seed))
        return await run_episode(engine, tok, {}, record.question, AGENT, trajectory_id=record.id, seed=seed)

    return solve


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.05)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args(argv)
    summary = evaluate(
        make_solve(args.sleep),
        make_records(args.n),
        out_dir=args.out,
        k=args.k,
        concurrency=args.concurrency,
        progress=False,
        config={"helper": "killable_eval", "n": args.n},
    )
    print(f"written={summary.written} resumed={summary.resumed} failed={summary.failed}")


if __name__ == "__main__":
    main(sys.argv[1:])
