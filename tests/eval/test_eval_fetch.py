"""Fetch converters on local files made in each dataset's own shape (as the hub or its release has it)."""

from __future__ import annotations

import base64
import csv
import json
import sys
import types

import pytest

from asearch.errors import AsearchError, DataFormatError
from asearch.eval.datasets import load_dataset
from asearch.eval.fetch import FETCHABLE, convert_rows, fetch_dataset, xor_decrypt


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def table(path, rows, delimiter):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        w.writeheader()
        w.writerows(rows)
    return path


def xor_encrypt(text: str, key: str) -> str:
    k = key.encode()
    return base64.b64encode(bytes(b ^ k[i % len(k)] for i, b in enumerate(text.encode()))).decode()


def fixture_nq(tmp):
    return jsonl(tmp / "nq.jsonl", [
        {"question": "who sang i will always love you", "answer": ["Dolly Parton", "Whitney Houston"]},
        {"question": "when was the eiffel tower built", "answer": ["1889"]},
    ])  # fmt: skip


def fixture_triviaqa(tmp):
    answer = {
        "aliases": ["Sun", "Sol", "The Sun"], "normalized_aliases": ["sun", "sol", "the sun"],
        "matched_wiki_entity_name": "", "normalized_matched_wiki_entity_name": "",
        "normalized_value": "sun", "type": "WikipediaEntity", "value": "The Sun",
    }  # fmt: skip
    return jsonl(tmp / "tqa.jsonl", [{
        "question": "Which star is closest to Earth?", "question_id": "tc_33", "question_source": "http://www.x.com/",
        "entity_pages": {"doc_source": [], "filename": [], "title": [], "wiki_context": []},
        "search_results": {"description": [], "filename": [], "rank": [], "title": [], "url": [], "search_context": []},
        "answer": answer,
    }])  # fmt: skip


def fixture_popqa(tmp):  # the released test.tsv: possible_answers is a JSON list inside a string
    row = {
        "id": "4222362", "subj": "George Rankin", "prop": "occupation", "obj": "politician",
        "subj_id": "1", "prop_id": "22", "obj_id": "3", "s_aliases": "[]", "o_aliases": '["political leader"]',
        "s_uri": "http://www.wikidata.org/entity/Q1", "o_uri": "http://www.wikidata.org/entity/Q3",
        "s_wiki_title": "George Rankin", "o_wiki_title": "Politician", "s_pop": "142", "o_pop": "25692",
        "question": "What is George Rankin's occupation?",
        "possible_answers": '["politician", "political leader", "polit."]',
    }  # fmt: skip
    return table(tmp / "test.tsv", [row], "\t")


def fixture_hotpotqa(tmp):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{
        "id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes", "type": "comparison", "level": "hard",
        "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
        "context": {"title": ["Ed Wood"], "sentences": [["Edward Davis Wood Jr. was an American filmmaker."]]},
    }]  # fmt: skip
    path = tmp / "validation-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def fixture_2wiki(tmp):
    return jsonl(tmp / "dev.jsonl", [{
        "_id": "8813f87c0bdd11eba7f7acde48001122", "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War?",
        "context": [["Xawery Żuławski", ["Xawery Żuławski is a Polish film director."]]],
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 2]],
        "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"]],
        "answer": "Małgorzata Braunek",
    }])  # fmt: skip


def fixture_musique(tmp):
    base = {
        "paragraphs": [
            {"idx": 0, "title": "Oslen", "paragraph_text": "Oslen is a city.", "is_supporting": True}
        ],
        "question_decomposition": [
            {"id": 1, "question": "who founded X?", "answer": "Ada", "paragraph_support_idx": 0},
            {"id": 2, "question": "where was #1 born?", "answer": "Oslen", "paragraph_support_idx": 0},
        ],
    }
    return jsonl(tmp / "musique_ans_v1.0_dev.jsonl", [
        {"id": "2hop__1_2", "question": "Where was the founder of X born?", "answer": "Oslen",
         "answer_aliases": ["Oslen City"], "answerable": True, **base},
        {"id": "2hop__3_4", "question": "Where was the founder of Y born?", "answer": "",
         "answer_aliases": [], "answerable": False, **base},
    ])  # fmt: skip


def fixture_bamboogle(tmp):
    return jsonl(tmp / "bamboogle.jsonl", [
        {"Question": "Who was president of the U.S. when superconductivity was discovered?", "Answer": "William Howard Taft"},
        {"Question": "What is the capital of the country where Oslen is?", "Answer": "Tarn"},
    ])  # fmt: skip


def fixture_frames(tmp):  # test.tsv: the first column has an empty header
    rows = [{
        "": "0", "Prompt": "If my future wife has the same first name as the 15th first lady ...",
        "Answer": "Jane Ballou", "wikipedia_link_1": "https://en.wikipedia.org/wiki/President",
        "wikipedia_link_2": "", "reasoning_types": "Numerical reasoning | Tabular reasoning",
        "wiki_links": "['https://en.wikipedia.org/wiki/President']",
    }]  # fmt: skip
    return table(tmp / "test.tsv", rows, "\t")


def fixture_gaia(tmp):  # 2023/validation/metadata.jsonl
    meta = {
        "Steps": "1. Search",
        "Number of steps": "1",
        "How long did this take?": "2 minutes",
        "Tools": "web",
        "Number of tools": "1",
    }
    return jsonl(tmp / "metadata.jsonl", [
        {"task_id": "c61d22de-5f6c-4958-a7f6-5e9707bd3466", "Question": "How many studio albums did X release?",
         "Level": 1, "Final answer": "3", "file_name": "", "Annotator Metadata": meta},
        {"task_id": "32102e3e-d12a-4209-9163-7b3a104efe5d", "Question": "In the attached sheet, what ...?",
         "Level": 2, "Final answer": "Time-Parking 2", "file_name": "32102e3e.xlsx", "Annotator Metadata": meta},
    ])  # fmt: skip


def fixture_xbench(tmp):
    key = "canary-guid-1234"
    rows = [
        {"id": "1", "prompt": xor_encrypt("哪位作家写了《红楼梦》？", key), "type": "x",
         "answer": xor_encrypt("曹雪芹", key), "reference_steps": xor_encrypt("搜索", key), "canary": key},
    ]  # fmt: skip
    return table(tmp / "DeepSearch.csv", rows, ",")


CASES = {
    "nq": (fixture_nq, ["nq-0", "nq-1"], ["Dolly Parton", "Whitney Houston"], {}),
    "triviaqa": (fixture_triviaqa, ["tc_33"], ["The Sun", "Sun", "Sol"], {}),
    "popqa": (fixture_popqa, ["popqa-4222362"], ["politician", "political leader", "polit."], {}),
    "hotpotqa": (fixture_hotpotqa, ["5a8b57f25542995d1e6f1371"], ["yes"], {}),
    "2wikimultihopqa": (fixture_2wiki, ["8813f87c0bdd11eba7f7acde48001122"], ["Małgorzata Braunek"], {}),
    "musique": (fixture_musique, ["2hop__1_2"], ["Oslen", "Oslen City"], {"unanswerable (MuSiQue-Full contrast question)": 1}),
    "bamboogle": (fixture_bamboogle, ["bamboogle-0", "bamboogle-1"], ["William Howard Taft"], {}),
    "frames": (fixture_frames, ["frames-0"], ["Jane Ballou"], {}),
    "gaia": (fixture_gaia, ["c61d22de-5f6c-4958-a7f6-5e9707bd3466"], ["3"], {"needs an attached file (not text-only)": 1}),
    "xbench-deepsearch": (fixture_xbench, ["xbench-1"], ["曹雪芹"], {}),
}  # fmt: skip


def test_table_covers_every_promised_benchmark():
    assert set(FETCHABLE) == set(CASES)
    for name, spec in FETCHABLE.items():
        assert spec.name == name and "/" in spec.hub_id and spec.split and callable(spec.converter)


@pytest.mark.parametrize("name", sorted(CASES))
def test_convert_local_copy_then_load(tmp_path, name):
    make, ids, first_golds, skipped = CASES[name]
    result = fetch_dataset(name, tmp_path / "data", source_file=make(tmp_path))
    assert result.path == tmp_path / "data" / name / "test.jsonl"
    assert result.count == len(ids) and result.skipped == skipped
    source = json.loads((tmp_path / "data" / name / "source.json").read_text())
    assert source["hub_id"] == FETCHABLE[name].hub_id and source["count"] == len(ids)
    recs = load_dataset(name, split="test", data_dir=tmp_path / "data")  # the eval layout
    assert [r.id for r in recs] == ids
    assert recs[0].golds == first_golds
    assert {r.dataset for r in recs} == {name} and all(r.question for r in recs)


def test_converted_fields_in_detail(tmp_path):
    (rec,) = (
        fetch_dataset("xbench-deepsearch", tmp_path, source_file=fixture_xbench(tmp_path))
        .path.read_text()
        .splitlines()
    )
    assert json.loads(rec)["question"] == "哪位作家写了《红楼梦》？"
    (frames,) = load_dataset(fetch_dataset("frames", tmp_path, source_file=fixture_frames(tmp_path)).path)
    assert frames.metadata["reasoning_types"] == "Numerical reasoning | Tabular reasoning"
    (gaia,) = load_dataset(fetch_dataset("gaia", tmp_path, source_file=fixture_gaia(tmp_path)).path)
    assert gaia.metadata == {"level": 1}
    assert xor_decrypt(xor_encrypt("héllo", "k"), "k") == "héllo"


def test_converter_errors_name_source_row_and_column():
    rows = [{"question": "a?", "answer": ["x"]}, {"query": "b?", "answer": ["y"]}]
    with pytest.raises(DataFormatError) as e:
        convert_rows("nq", rows, source="nq.jsonl")
    assert (e.value.path, e.value.line, e.value.field) == ("nq.jsonl", 2, "question")
    assert "row has: query, answer" in e.value.problem
    with pytest.raises(DataFormatError, match="duplicate id 'h1'") as e:
        convert_rows("hotpotqa", [{"id": "h1", "question": "a?", "answer": "x"}] * 2)
    assert e.value.line == 2
    with pytest.raises(DataFormatError, match="not a JSON list"):
        convert_rows("popqa", [{"id": 1, "question": "q?", "possible_answers": "[broken"}])
    with pytest.raises(DataFormatError, match="golds"):
        convert_rows("nq", [{"question": "q?", "answer": [""]}])
    with pytest.raises(AsearchError, match="unknown dataset 'squad'; fetchable: gaia"):
        convert_rows("squad", [])


def test_local_table_that_is_not_utf8_names_its_line(tmp_path):
    """A tsv saved in Latin-1 (a spreadsheet's default) is an error naming the line and byte, not a traceback;
    a UTF-8 BOM is not part of the first column's name."""
    good = fixture_frames(tmp_path)
    lines = good.read_bytes().splitlines(keepends=True)
    latin = tmp_path / "latin" / "test.tsv"
    latin.parent.mkdir()
    latin.write_bytes(lines[0] + lines[1].replace(b"wife", "wîfe".encode("latin-1")))
    with pytest.raises(DataFormatError, match=r"test\.tsv:2: not UTF-8 text \(byte 0xee at byte \d+ of the file\)") as e:
        fetch_dataset("frames", tmp_path / "data", source_file=latin)
    assert e.value.line == 2
    bom = tmp_path / "bom" / "test.tsv"
    bom.parent.mkdir()
    prompt_first = [{"Prompt": row["Prompt"], **row} for row in csv.DictReader(good.open(newline=""), delimiter="\t")]
    bom.write_bytes(b"\xef\xbb\xbf" + table(tmp_path / "bom" / "plain.tsv", prompt_first, "\t").read_bytes())
    (record,) = load_dataset(fetch_dataset("frames", tmp_path / "bom-out", source_file=bom).path)
    assert record.golds == ["Jane Ballou"]


def test_download_without_the_datasets_library_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(AsearchError, match="pip install datasets") as e:
        fetch_dataset("nq", tmp_path)
    assert "--from FILE" in str(e.value)


def test_download_failure_says_network_is_needed(tmp_path, monkeypatch):
    fake = types.ModuleType("datasets")

    def load_dataset(*a, **kw):
        raise ConnectionError("Couldn't reach 'google/frames-benchmark' on the Hub")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AsearchError) as e:
        fetch_dataset("frames", tmp_path)
    msg = str(e.value)
    assert (
        "network access to the Hugging Face Hub" in msg
        and "HF_HUB_OFFLINE" in msg
        and "Couldn't reach" in msg
    )
    assert not (tmp_path / "frames").exists()  # nothing half-written


def test_download_path_converts_what_the_library_yields(tmp_path, monkeypatch):
    fake = types.ModuleType("datasets")
    seen = {}

    def load_dataset(hub_id, config, split):
        seen.update(hub_id=hub_id, config=config, split=split)
        return iter([{"Question": "q?", "Answer": "a"}])

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    result = fetch_dataset("bamboogle", tmp_path)
    assert seen == {"hub_id": "chiayewken/bamboogle", "config": None, "split": "test"}
    assert result.count == 1
