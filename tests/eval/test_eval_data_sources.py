"""Peers' data as it is: a Search-R1 merged parquet (ids restarting per `data_source`) loads whole, rows
without ids never take an explicit id, and the eval reports per source beside per dataset and overall."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from asearch.errors import DataFormatError
from asearch.eval.datasets import QARecord, load_dataset, read_qa_file
from asearch.eval.report import render_markdown, summarize
from asearch.eval.runner import aggregate_only, evaluate

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEMPLATE = "Answer the given question. ... For example, <answer> Beijing </answer>. Question: {q}\n"
SOURCES = {"nq": 3, "hotpotqa": 2, "bamboogle": 2}  # questions per source, in file order


def search_r1_row(source: str, i: int) -> dict:
    """One row as Search-R1's qa_search_test_merge.py writes it: FlashRAG's columns kept, verl's added."""
    q = f"{source} question {i}?"
    return {
        "id": f"test_{i}",  # FlashRAG's id: restarts in every source
        "question": q,
        "golden_answers": [f"{source}-{i}"],
        "data_source": source,
        "prompt": [{"role": "user", "content": TEMPLATE.format(q=q)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": [f"{source}-{i}"]}},
        "extra_info": {"split": "test", "index": i},  # restarts too
    }


@pytest.fixture
def merged(tmp_path: Path) -> Path:
    rows = [search_r1_row(source, i) for source, n in SOURCES.items() for i in range(n)]
    path = tmp_path / "searchr1" / "test.parquet"
    path.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_merged_search_r1_parquet_loads_every_row_with_its_source(merged):
    records = load_dataset(merged)
    expected = [(s, i) for s, n in SOURCES.items() for i in range(n)]
    assert len(records) == len(expected) == 7
    # ids repeat across sources, so every id carries its source; nothing else about the rows changes
    assert [r.id for r in records] == [f"{s}/test_{i}" for s, i in expected]
    assert [r.data_source for r in records] == [s for s, _ in expected]
    assert [(r.question, r.golds) for r in records] == [
        (f"{s} question {i}?", [f"{s}-{i}"]) for s, i in expected
    ]
    assert {r.dataset for r in records} == {"searchr1"}
    assert records[0].metadata["extra_info"] == {"split": "test", "index": 0}


def test_ids_are_prefixed_only_when_they_repeat_across_sources(tmp_path):
    rows = [{**search_r1_row("nq", 0), "id": "a"}, {**search_r1_row("hotpotqa", 0), "id": "b"}]
    path = tmp_path / "unique.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert [(r.id, r.data_source) for r in read_qa_file(path)] == [("a", "nq"), ("b", "hotpotqa")]


def test_an_id_repeated_within_one_source_is_still_an_error(tmp_path):
    rows = [search_r1_row("nq", 0), search_r1_row("hotpotqa", 0), search_r1_row("nq", 0)]
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(
        DataFormatError, match=r"duplicate id 'nq/test_0' in data_source 'nq' \(first at line 1\)"
    ) as e:
        read_qa_file(path)
    assert (e.value.line, e.value.field) == (3, "id")


def test_a_row_without_an_id_never_takes_one_another_row_names(tmp_path):
    rows = [
        {"question": "q1?", "answer": "a"},  # line 1: "1" is named by line 2
        {"id": "1", "question": "q2?", "answer": "a"},
        {"id": "5", "question": "q3?", "answer": "a"},
        {"id": "line5", "question": "q4?", "answer": "a"},
        {"question": "q5?", "answer": "a"},  # line 5: "5" and "line5" are both named
        {"question": "q6?", "answer": "a"},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [r.id for r in read_qa_file(path)]
    assert ids == ["line1", "1", "5", "line5", "line5.1", "6"]


def test_data_source_rides_along_in_asearch_lines(tmp_path):
    recs = [
        QARecord(id="x", question="q?", golds=["a"], dataset="mine", data_source="nq"),
        QARecord(id="y", question="r?", golds=["b"], dataset="mine"),
    ]
    lines = [r.to_jsonl_dict() for r in recs]
    assert (
        lines[0]["data_source"] == "nq" and "data_source" not in lines[1]
    )  # files without sources unchanged
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_qa_file(path) == recs
    assert [r.source for r in recs] == ["nq", "mine"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q?", "answer": "a", "data_source": 3}) + "\n")
    with pytest.raises(DataFormatError, match="expected a non-blank string") as e:
        read_qa_file(bad)
    assert (e.value.line, e.value.field) == (1, "data_source")


def test_eval_of_a_merged_file_reports_each_source_and_overall(merged, tmp_path):
    async def solve(record: QARecord, seed: int) -> SimpleNamespace:
        # right on nq, wrong on hotpotqa, right on bamboogle's first question only
        right = record.data_source == "nq" or record.id == "bamboogle/test_0"
        return SimpleNamespace(answer=record.golds[0] if right else "wrong", turns=[], finish="answer")

    records = load_dataset(merged)
    out = tmp_path / "run"
    s = evaluate(solve, records, out_dir=out, progress=False).summary

    em = {name: g["metrics"]["em"]["avg_at_k"]["mean"] for name, g in s["data_sources"].items()}
    assert em == {"bamboogle": 0.5, "hotpotqa": 0.0, "nq": 1.0}
    assert {name: g["n"] for name, g in s["data_sources"].items()} == {"bamboogle": 2, "hotpotqa": 2, "nq": 3}
    assert [g["expected"] for g in s["data_sources"].values()] == [2, 2, 3]
    assert s["overall"]["metrics"]["em"]["avg_at_k"]["mean"] == pytest.approx(4 / 7)
    assert list(s["datasets"]) == ["searchr1"]

    md = (out / "summary.md").read_text()
    assert md == render_markdown(s, title=f"Evaluation: {out}")  # what `asearch eval` prints, too
    table = md[md.index("By `data_source`") :]
    assert (
        "| nq | 3 | 100.0" in table and "| hotpotqa | 2 | 0.0" in table and "| bamboogle | 2 | 50.0" in table
    )
    assert "| **all** | 7 | 57.1" in table
    line = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert (line["id"], line["data_source"]) == ("nq/test_0", "nq")

    # rebuilt from disk alone: the same per-source numbers and expected counts
    again = aggregate_only(out).summary
    assert again["data_sources"] == s["data_sources"]


def test_a_file_of_one_source_per_dataset_has_no_separate_source_breakdown(tmp_path):
    line = {"id": "q", "dataset": "nq", "pass": 0, "seed": 0, "em": 1.0, "f1": 1.0, "cem": 1.0}
    s = summarize([line, {**line, "id": "r", "data_source": "nq"}], k=1)
    assert "data_sources" not in s  # it would repeat `datasets`
    assert "By `data_source`" not in render_markdown(s)


def test_judge_agreement_with_exact_match_and_its_identity():
    def line(qid: str, em: float, correct: bool | None, version: str = "judge-v1") -> dict:
        verdict = {"correct": correct, "model": "m", "prompt_version": version}
        return {
            "id": qid,
            "dataset": "d",
            "pass": 0,
            "seed": 0,
            "em": em,
            "f1": em,
            "cem": em,
            "judge": verdict,
        }

    lines = [line("a", 1.0, True), line("b", 0.0, True), line("c", 1.0, False), line("d", 0.0, False),
             line("e", 0.0, False), line("f", 1.0, None, "judge-v0")]  # fmt: skip
    judge = summarize(lines, k=1)["datasets"]["d"]["judge"]
    assert judge["agreement"] == {
        "both_right": 1,
        "judge_only": 1,
        "em_only": 1,
        "both_wrong": 2,
        "agreement": pytest.approx(3 / 5),  # a failed verdict (f) is not a verdict
    }
    assert (judge["models"], judge["prompt_versions"]) == (["m"], ["judge-v0", "judge-v1"])
    md = render_markdown(summarize(lines, k=1))
    assert "Judge (m; prompt judge-v0, judge-v1) against exact match" in md
    assert "| d | 1 | 1 | 1 | 2 | 60.0 |" in md
