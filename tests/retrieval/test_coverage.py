"""`asearch data check`: per data_source, the share of gold answers the corpus holds at all and the share
retrieved for the question itself, with examples of misses; `asearch eval` prints the same lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from asearch.corpus.sources import open_corpus
from asearch.eval.coverage import check_coverage, has_answer
from asearch.eval.datasets import load_dataset
from asearch.retrieval.index import IndexConfig, build_index, open_index

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

DOCS = [
    ("hamlet", "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("peru", "Peru", "Lima is the capital and largest city of Peru, on the Pacific coast."),
    ("tower", "Eiffel Tower", "The Eiffel Tower in Paris was designed by the engineering company of Gustave Eiffel."),
    ("moon", "Apollo 11", "Neil Armstrong and Buzz Aldrin landed on the Moon in July 1969."),
]
# (data_source, question, golds): retrieved / in corpus but not retrieved / not in corpus / stopwords only
QUESTIONS = [
    ("nq", "who wrote the tragedy hamlet", ["William Shakespeare"]),
    ("nq", "what is the capital city of peru", ["Lima"]),
    ("nq", "which city did neil armstrong visit in july", ["Lima, Peru", "Lima"]),
    ("nq", "who painted the mona lisa", ["Leonardo da Vinci"]),
    ("hotpotqa", "who designed the tower in paris", ["Gustave Eiffel"]),
    ("hotpotqa", "who walked on the moon with aldrin", ["Neil Armstrong"]),
    ("hotpotqa", "in what year did apollo 11 land", ["1969"]),
    ("hotpotqa", "what two words open the famous line of hamlet", ["To be"]),
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cov")
    corpus = d / "mini.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    return build_index(open_corpus(str(corpus)), d / "idx", IndexConfig(), progress=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """The questions as Search-R1's merged test parquet holds them (FlashRAG columns + verl's)."""
    rows = [
        {"id": f"test_{i}", "question": q, "golden_answers": g, "data_source": s,
         "reward_model": {"style": "rule", "ground_truth": {"target": g}}}
        for i, (s, q, g) in enumerate(QUESTIONS)
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("searchr1") / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_has_answer_is_the_normalised_contiguous_rule():
    assert has_answer(["William Shakespeare"], "written by William  Shakespeare, around 1600")
    assert has_answer(["the Eiffel Tower"], "The Eiffel-tower")  is False  # SQuAD deletes the hyphen: eiffeltower
    assert has_answer(["Lima"], "Lima is the capital") and not has_answer(["Lim"], "Lima is the capital")
    assert not has_answer(["Shakespeare William"], "William Shakespeare")  # order matters


def test_coverage_per_data_source_with_misses(index_dir, dataset):
    records = load_dataset(dataset)
    with open_index(index_dir) as index:
        report = check_coverage(records, index, k=1)
    nq, hp = report.sources["nq"], report.sources["hotpotqa"]
    assert (nq.questions, nq.in_corpus, nq.capped, nq.unchecked) == (4, 3, 0, 0)
    assert [r.golds for r in nq.not_in_corpus] == [["Leonardo da Vinci"]]
    assert nq.in_topk == 2  # the third question's words match the moon passage, not Lima's
    assert [(r.question, top) for r, top in nq.not_retrieved] == [
        ("which city did neil armstrong visit in july", "Apollo 11")
    ]
    assert (hp.questions, hp.in_corpus, hp.unchecked) == (4, 3, 1)  # "To be": stopwords only
    assert report.overall.questions == 8 and report.overall.in_corpus == 6
    lines = report.lines()
    assert lines[0] == "coverage nq: answer in corpus 75.0% (3/4), in top-1 for the question 50.0% (2/4)"
    assert lines[-1].startswith("coverage overall: answer in corpus 75.0% (6/8)")


def test_records_without_a_data_source_count_under_their_files_name(index_dir, tmp_path):
    """FlashRAG's `nq_test.jsonl` rows name no data_source: the lines say `nq_test`, not a placeholder."""
    path = tmp_path / "nq_test.jsonl"
    rows = [{"id": f"test_{i}", "question": q, "golden_answers": g} for i, (s, q, g) in enumerate(QUESTIONS) if s == "nq"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open_index(index_dir) as index:
        report = check_coverage(load_dataset(str(path)), index, k=1)
    assert report.lines() == ["coverage nq_test: answer in corpus 75.0% (3/4), in top-1 for the question 50.0% (2/4)"]
    assert all(line.startswith("nq_test ") for line in report.miss_lines())


def test_cli_data_check_and_the_eval_line(index_dir, dataset, monkeypatch, tmp_path):
    from asearch.cli.eval import app, data_app

    root = typer.Typer()
    root.add_typer(app, name="eval")
    root.add_typer(data_app, name="data")
    runner = CliRunner()
    r = runner.invoke(root, ["data", "check", str(dataset), "--index", str(index_dir), "--k", "3"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "8 questions against" in out and "(4 passages, bm25 top-3)" in out
    assert "coverage nq: answer in corpus 75.0% (3/4)" in out
    assert "nq not in corpus: test_3: 'who painted the mona lisa' golds ['Leonardo da Vinci']" in out

    # asearch eval prints the same lines beside its scores, for the index its tools searched
    import asearch.agent.runtime as rt
    from asearch.engine.local.scripted import ScriptedEngine

    class Chars:
        eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    def build_runtime(cfg, *, progress=True, record_dir=None):
        engine = ScriptedEngine(Chars(), lambda prompt: "<think>sure</think><answer>Lima</answer>")
        return rt.Runtime(engine, Chars(), {}, cfg.agent)

    monkeypatch.setattr(rt, "build_runtime", build_runtime)
    args = ["eval", "-d", str(dataset), "--out", str(tmp_path / "ev"), "--no-progress", f"tools.index={index_dir}"]
    r = runner.invoke(root, args)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "coverage nq: answer in corpus 75.0% (3/4), in top-5 for the question" in out
    assert "| nq |" in out  # the per-source scores it sits beside
