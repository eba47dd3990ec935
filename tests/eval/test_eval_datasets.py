"""Dataset readers on files in each real shape, and their errors (file, line, field)."""

from __future__ import annotations

import json

import pytest

from asearch.errors import AsearchError, DataFormatError
from asearch.eval.datasets import QARecord, load_dataset, read_qa_file


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_asearcher_jsonl_ids_answers_and_aug(tmp_path):
    f = write_jsonl(
        tmp_path / "asearcher.jsonl",
        [
            {"qid": "a1", "question": " Who? ", "answer": "Ada", "source": "hotpot"},
            {
                "id": 7,
                "question": "When?",
                "answer": ["1921", "in 1921"],
                "aug_answer": ["nineteen twenty-one"],
            },
            {"idx": "x", "question": "Year?", "answer": 1937},  # a number answer becomes a string
            {"question": "Where?", "gt": "Oslen"},  # no id: the line number
        ],
    )
    recs = read_qa_file(f)
    assert [r.id for r in recs] == ["a1", "7", "x", "4"]
    assert (
        recs[0].question == "Who?" and recs[0].golds == ["Ada"] and recs[0].metadata == {"source": "hotpot"}
    )
    assert recs[1].golds == ["1921", "in 1921"] and recs[1].aug_golds == ["nineteen twenty-one"]
    assert recs[2].golds == ["1937"] and recs[3].golds == ["Oslen"]
    assert {r.dataset for r in recs} == {"asearcher"}


def test_flashrag_jsonl(tmp_path):
    f = write_jsonl(
        tmp_path / "nq" / "test.jsonl",
        [{"id": "test_0", "question": "who wrote it?", "golden_answers": ["A", "B"], "metadata": {"x": 1}}],
    )
    (rec,) = read_qa_file(f)
    assert (rec.id, rec.golds, rec.dataset, rec.metadata) == (
        "test_0",
        ["A", "B"],
        "nq",
        {"metadata": {"x": 1}},
    )


def test_search_r1_verl_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    template = "Answer the given question. ... For example, <answer> Beijing </answer>. Question: {q}\n"
    rows = [
        {
            "id": "train_100",
            "data_source": "nq",
            "prompt": [{"role": "user", "content": template.format(q="which captain won most?")}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Virat Kohli", "Kohli"]}},
            "extra_info": {"split": "train", "index": 100},
        },
        {
            "id": None,
            "data_source": "hotpotqa",
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "What city hosts it?"},  # no "Question:" marker: whole turn
            ],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Oslen"]}},
            "extra_info": {"split": "train", "index": 101},
        },
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    a, b = read_qa_file(path)
    assert (a.id, a.question, a.golds) == ("train_100", "which captain won most?", ["Virat Kohli", "Kohli"])
    assert (
        a.metadata["data_source"] == "nq" and "prompt" not in a.metadata and "reward_model" not in a.metadata
    )
    assert (b.id, b.question, b.golds) == (
        "101",
        "What city hosts it?",
        ["Oslen"],
    )  # id from extra_info.index
    assert a.dataset == tmp_path.name  # "train" is a split name, so the directory names the dataset

    bad = tmp_path / "bad.parquet"
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": {"target": []}}
    pq.write_table(pa.Table.from_pylist(rows), bad)
    with pytest.raises(DataFormatError) as e:
        read_qa_file(bad)
    assert (e.value.path, e.value.line, e.value.field) == (str(bad), 2, "reward_model.ground_truth.target")


def test_json_list_errors_name_the_element_line(tmp_path):
    f = tmp_path / "qs.json"
    f.write_text(
        '[\n  {"id": "1", "question": "a?", "answer": "x"},\n  {"id": "2",\n   "question": "b?"}\n]\n'
    )
    with pytest.raises(DataFormatError) as e:
        read_qa_file(f)
    assert (e.value.line, e.value.field) == (3, "answer")
    assert str(e.value).startswith(f"{f}:3: field 'answer':")
    f.write_text(
        '[{"id": "1", "question": "a?", "answer": "x"},\n {"id": "2", "question": "b?", "answer": "y"}]'
    )
    assert [r.golds for r in read_qa_file(f)] == [["x"], ["y"]]
    f.write_text('[{"id": "1", "question": "a?", "answer": "x"},\n\n {"id": "2" "question": "b?"}]')
    with pytest.raises(DataFormatError, match="not valid JSON") as e:
        read_qa_file(f)
    assert e.value.line == 3


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ({"answer": "x"}, "question", "missing"),
        ({"question": "  ", "answer": "x"}, "question", "blank"),
        ({"question": 3, "answer": "x"}, "question", "expected a string"),
        ({"question": "q?"}, "answer", "no gold answer"),
        ({"question": "q?", "answer": []}, "answer", "empty list"),
        ({"question": "q?", "answer": ["ok", ""]}, "answer[1]", "blank answer"),
        ({"question": "q?", "answer": {"text": "x"}}, "answer", "expected a string"),
        ({"question": "q?", "golden_answers": ["a", None]}, "golden_answers[1]", "expected a string"),
        ({"question": "q?", "answer": "x", "id": [1]}, "id", "expected a string or integer"),
        ({"prompt": [{"role": "assistant", "content": "hi"}], "answer": "x"}, "prompt", "no user turn"),
    ],
)
def test_row_errors_name_file_line_field(tmp_path, row, field, problem):
    f = write_jsonl(tmp_path / "d.jsonl", [{"question": "fine?", "answer": "ok"}, row])
    with pytest.raises(DataFormatError) as e:
        read_qa_file(f)
    assert (e.value.path, e.value.line, e.value.field) == (str(f), 2, field)
    assert problem in e.value.problem


def test_bad_json_and_duplicate_ids(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"question": "a?", "answer": "x"}\n{"question": "b?", "answer": \n')
    with pytest.raises(DataFormatError, match="not valid JSON") as e:
        read_qa_file(f)
    assert e.value.line == 2
    write_jsonl(
        f,
        [
            {"id": "q1", "question": "a?", "answer": "x"},
            {"id": "q2", "question": "b?", "answer": "y"},
            {"id": "q1", "question": "c?", "answer": "z"},
        ],
    )
    with pytest.raises(DataFormatError, match=r"duplicate id 'q1' \(first at line 1\)") as e:
        read_qa_file(f)
    assert (e.value.line, e.value.field) == (3, "id")


def test_native_lines_round_trip(tmp_path):
    recs = [
        QARecord(
            id="a", question="q?", golds=["x", "y"], aug_golds=["z"], dataset="mine", metadata={"hops": 2}
        ),
        QARecord(id="b", question="r?", golds=["w"], dataset="mine"),
    ]
    f = write_jsonl(tmp_path / "other_name.jsonl", [r.to_jsonl_dict() for r in recs])
    assert read_qa_file(f) == recs  # the dataset written in the line wins over the file name


def test_world_question_files_read_with_evidence(tmp_path):
    from asearch.corpus.world import WorldCorpus, generate_questions, write_questions_jsonl

    world = WorldCorpus(seed=3, n_entities=300)
    qs = generate_questions(world, 6, hops=(2,), seed=1)
    f = tmp_path / "myworld" / "test.jsonl"
    f.parent.mkdir()
    write_questions_jsonl(f, qs)
    recs = load_dataset("myworld", data_dir=tmp_path)
    assert {r.dataset for r in recs} == {"myworld"}
    assert [r.id for r in recs] == [q.id for q in qs]
    assert [r.golds for r in recs] == [q.answers for q in qs]
    assert all(len(r.metadata["evidence"]) == 2 and r.metadata["hops"] == 2 for r in recs)


def test_load_dataset_layout_and_resolution(tmp_path):
    write_jsonl(
        tmp_path / "nq" / "test.jsonl",
        [{"id": str(i), "question": f"q{i}?", "answer": "a"} for i in range(5)],
    )
    write_jsonl(tmp_path / "nq" / "dev.jsonl", [{"id": "d", "question": "dq?", "answer": "a"}])
    recs = load_dataset("nq", split="test", data_dir=tmp_path)
    assert len(recs) == 5 and {r.dataset for r in recs} == {"nq"}
    assert [r.id for r in load_dataset("nq", split="dev", data_dir=tmp_path)] == ["d"]
    assert [r.id for r in load_dataset(tmp_path / "nq", limit=2)] == ["0", "1"]  # a directory: its split file
    assert load_dataset(tmp_path / "nq" / "test.jsonl", name="custom")[0].dataset == "custom"
    with pytest.raises(AsearchError, match="not found") as e:
        load_dataset("hotpotqa", data_dir=tmp_path)
    assert str(tmp_path / "hotpotqa" / "test.jsonl") in str(e.value)
    with pytest.raises(AsearchError, match="limit"):
        load_dataset("nq", data_dir=tmp_path, limit=0)
