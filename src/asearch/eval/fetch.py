"""Fetch public QA benchmarks and convert them to asearch jsonl: one converter per dataset, one table.

`fetch_dataset(name, out_dir)` downloads with the `datasets` library (network needed) or converts a
local copy of the hub files (`source_file=`), and writes `{out_dir}/{name}/test.jsonl` (asearch
lines: id, question, golds, dataset, metadata) plus `source.json` saying where the rows came from.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asearch.errors import AsearchError, DataFormatError
from asearch.eval.datasets import QARecord, iter_rows
from asearch.files import atomic_write_json, read_utf8_text, write_jsonl

__all__ = ["FETCHABLE", "FetchResult", "FetchSpec", "SkipRow", "convert_rows", "fetch_dataset", "xor_decrypt"]


class SkipRow(Exception):
    """A converter's way to leave a row out on purpose (counted by reason, never dropped silently)."""


Where = tuple[str, int]
Converter = Callable[[Mapping[str, Any], int, Where], QARecord]


def _field(row: Mapping[str, Any], key: str, where: Where) -> Any:
    if key not in row or row[key] is None:
        raise DataFormatError(*where, key, f"missing (row has: {', '.join(map(str, row)) or 'nothing'})")
    return row[key]


def _text(row: Mapping[str, Any], key: str, where: Where) -> str:
    value = _field(row, key, where)
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise DataFormatError(*where, key, f"expected text, got {type(value).__name__}")
    return str(value).strip()


def _record(where: Where, **fields: Any) -> QARecord:
    golds = list(dict.fromkeys(g.strip() for g in fields.pop("golds") if isinstance(g, str) and g.strip()))
    try:
        return QARecord(golds=golds, **fields)
    except ValidationError as e:
        err = e.errors()[0]
        raise DataFormatError(*where, ".".join(map(str, err["loc"])) or None, err["msg"]) from None


# --------------------------------------------------------------------------- one converter per dataset
# Each takes one row as the hub's `datasets` library yields it (or as its released file has it),
# its 0-based index, and where it came from; column names are the datasets' own.


def convert_nq(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """google-research-datasets/nq_open: {question, answer: [str]} (no id column: the row index)."""
    return _record(
        where, id=f"nq-{i}", question=_text(row, "question", where), golds=_field(row, "answer", where)
    )


def convert_triviaqa(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """mandarjoshi/trivia_qa rc.nocontext: {question_id, question, answer: {value, aliases, ...}}."""
    answer = _field(row, "answer", where)
    if not isinstance(answer, Mapping):
        raise DataFormatError(
            *where, "answer", f"expected an object with value/aliases, got {type(answer).__name__}"
        )
    golds = [answer.get("value") or ""] + list(answer.get("aliases") or [])
    return _record(
        where,
        id=_text(row, "question_id", where),
        question=_text(row, "question", where),
        golds=golds,
        metadata={"question_source": row.get("question_source")},
    )


def convert_popqa(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """akariasai/PopQA: {id, question, possible_answers: a JSON-encoded list (a string), subj, prop, obj, s_pop}."""
    raw = _field(row, "possible_answers", where)
    try:
        golds = json.loads(raw) if isinstance(raw, str) else list(raw)
    except json.JSONDecodeError as e:
        raise DataFormatError(*where, "possible_answers", f"not a JSON list ({e.msg})") from None
    if not isinstance(golds, list):
        raise DataFormatError(*where, "possible_answers", f"expected a list, got {type(golds).__name__}")
    return _record(
        where,
        id=f"popqa-{_text(row, 'id', where)}",
        question=_text(row, "question", where),
        golds=golds,
        metadata={k: row.get(k) for k in ("subj", "prop", "obj", "s_pop")},
    )


def convert_hotpotqa(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """hotpotqa/hotpot_qa distractor: {id, question, answer, type, level, supporting_facts, context}."""
    return _record(
        where,
        id=_text(row, "id", where),
        question=_text(row, "question", where),
        golds=[_text(row, "answer", where)],
        metadata={"type": row.get("type"), "level": row.get("level")},
    )


def convert_2wiki(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """2WikiMultihopQA: {_id, type, question, context, supporting_facts, evidences, answer} (some mirrors: id)."""
    key = "_id" if row.get("_id") is not None else "id"
    return _record(
        where,
        id=_text(row, key, where),
        question=_text(row, "question", where),
        golds=[_text(row, "answer", where)],
        metadata={"type": row.get("type")},
    )


def convert_musique(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """MuSiQue-Ans: {id, question, answer, answer_aliases, answerable, question_decomposition, paragraphs}."""
    if row.get("answerable") is False:
        raise SkipRow("unanswerable (MuSiQue-Full contrast question)")
    aliases = row.get("answer_aliases") or []
    return _record(
        where,
        id=_text(row, "id", where),
        question=_text(row, "question", where),
        golds=[_text(row, "answer", where), *aliases],
        metadata={"hops": len(row.get("question_decomposition") or []) or None},
    )


def convert_bamboogle(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """chiayewken/bamboogle: {Question, Answer} (no id column: the row index)."""
    return _record(
        where,
        id=f"bamboogle-{i}",
        question=_text(row, "Question", where),
        golds=[_text(row, "Answer", where)],
    )


def convert_frames(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """google/frames-benchmark: {Unnamed: 0, Prompt, Answer, reasoning_types, wiki_links, wikipedia_link_1..}.

    The released test.tsv has an unnamed index column (key "" when read as TSV; "Unnamed: 0" via pandas).
    """
    index = row.get("Unnamed: 0", row.get(""))
    return _record(
        where,
        id=f"frames-{index if index not in (None, '') else i}",
        question=_text(row, "Prompt", where),
        golds=[_text(row, "Answer", where)],
        metadata={"reasoning_types": row.get("reasoning_types"), "wiki_links": row.get("wiki_links")},
    )


def convert_gaia(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """gaia-benchmark/GAIA 2023_all: {task_id, Question, Level, Final answer, file_name, Annotator Metadata}.

    Text-only: a row with an attached file (`file_name` set) is skipped, since a search agent cannot read it.
    """
    if str(row.get("file_name") or "").strip():
        raise SkipRow("needs an attached file (not text-only)")
    return _record(
        where,
        id=_text(row, "task_id", where),
        question=_text(row, "Question", where),
        golds=[_text(row, "Final answer", where)],
        metadata={"level": row.get("Level")},
    )


def xor_decrypt(ciphertext_b64: str, key: str) -> str:
    """xbench's obfuscation: base64, then XOR with the UTF-8 bytes of the row's canary, repeated."""
    data = base64.b64decode(ciphertext_b64)
    k = key.encode("utf-8")
    return bytes(b ^ k[j % len(k)] for j, b in enumerate(data)).decode("utf-8")


def convert_xbench(row: Mapping[str, Any], i: int, where: Where) -> QARecord:
    """xbench/DeepSearch: {id, prompt, answer, reference_steps, canary}; text fields are XOR-obfuscated."""
    key = _text(row, "canary", where)
    plain = {}
    for name in ("prompt", "answer"):
        try:
            plain[name] = xor_decrypt(_text(row, name, where), key)
        except (ValueError, UnicodeDecodeError) as e:
            raise DataFormatError(*where, name, f"cannot decrypt with the row's canary ({e})") from None
    return _record(
        where,
        id=f"xbench-{_text(row, 'id', where)}",
        question=plain["prompt"].strip(),
        golds=[plain["answer"]],
    )


@dataclass(frozen=True)
class FetchSpec:
    """Where a benchmark lives on the Hugging Face Hub and how its rows become QARecords."""

    name: str
    hub_id: str
    config: str | None
    split: str
    converter: Converter
    note: str = ""
    gated: bool = False  # the hub wants accepted terms and a token (HF_TOKEN) before it serves the files


FETCHABLE: dict[str, FetchSpec] = {
    s.name: s
    for s in (
        FetchSpec("gaia", "gaia-benchmark/GAIA", "2023_all", "validation", convert_gaia,
                  "gated: accept the terms on the Hub and set HF_TOKEN; text-only rows (test answers are hidden)",
                  gated=True),
        FetchSpec("frames", "google/frames-benchmark", None, "test", convert_frames),
        FetchSpec("xbench-deepsearch", "xbench/DeepSearch", None, "train", convert_xbench,
                  "rows are XOR-obfuscated with their canary; decrypted here"),
        FetchSpec("nq", "google-research-datasets/nq_open", None, "validation", convert_nq,
                  "NQ-open dev set (the usual NQ test set of open-domain QA papers)"),
        FetchSpec("triviaqa", "mandarjoshi/trivia_qa", "rc.nocontext", "validation", convert_triviaqa,
                  "test answers are hidden; golds = value + aliases"),
        FetchSpec("popqa", "akariasai/PopQA", None, "test", convert_popqa),
        FetchSpec("hotpotqa", "hotpotqa/hotpot_qa", "distractor", "validation", convert_hotpotqa),
        FetchSpec("2wikimultihopqa", "framolfese/2WikiMultihopQA", None, "validation", convert_2wiki,
                  "a mirror of the official dev set"),
        FetchSpec("musique", "dgslibisey/MuSiQue", None, "validation", convert_musique,
                  "MuSiQue-Ans dev; golds = answer + answer_aliases"),
        FetchSpec("bamboogle", "chiayewken/bamboogle", None, "test", convert_bamboogle),
    )
}  # fmt: skip


# --------------------------------------------------------------------------- fetching


@dataclass(frozen=True)
class FetchResult:
    path: Path
    count: int
    skipped: dict[str, int]  # reason -> rows left out on purpose


def convert_rows(
    name: str, rows: Iterable[Mapping[str, Any]], *, source: str = ""
) -> tuple[list[QARecord], Counter[str]]:
    """Convert raw rows of a fetchable dataset; returns (records, skipped-by-reason). Duplicate ids are errors."""
    spec = _spec(name)
    records: list[QARecord] = []
    skipped: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        where: Where = (source or spec.hub_id, i + 1)
        if not isinstance(row, Mapping):
            raise DataFormatError(*where, None, f"expected a row object, got {type(row).__name__}")
        try:
            rec = spec.converter(row, i, where)
        except SkipRow as reason:
            skipped[str(reason)] += 1
            continue
        if rec.id in first:
            raise DataFormatError(*where, "id", f"duplicate id {rec.id!r} (first at row {first[rec.id]})")
        first[rec.id] = i + 1
        records.append(rec.model_copy(update={"dataset": name}))
    return records, skipped


def fetch_dataset(name: str, out_dir: str | Path, *, source_file: str | Path | None = None) -> FetchResult:
    """Download (or read `source_file`, a local copy in the hub's own columns), convert, write atomically.

    Writes `{out_dir}/{name}/test.jsonl` whatever the hub split is called (it is the set we evaluate
    on) and `{out_dir}/{name}/source.json` (hub id, config, split, counts, skipped rows by reason).
    """
    spec = _spec(name)
    if source_file is not None:
        source = str(source_file)
        rows: Iterable[Mapping[str, Any]] = _local_rows(Path(source_file))
    else:
        source = f"{spec.hub_id}[{spec.config + ':' if spec.config else ''}{spec.split}]"
        rows = _download(spec)
    records, skipped = convert_rows(name, rows, source=source)
    if not records:
        raise AsearchError(f"{source}: no usable rows (skipped: {dict(skipped) or 'none'})")
    target = Path(out_dir) / name
    path = target / "test.jsonl"
    write_jsonl(path, (r.to_jsonl_dict() for r in records))
    atomic_write_json(
        target / "source.json",
        {
            "dataset": name,
            "hub_id": spec.hub_id,
            "config": spec.config,
            "split": spec.split,
            "source": source,
            "count": len(records),
            "skipped": dict(skipped),
        },
    )
    return FetchResult(path=path, count=len(records), skipped=dict(skipped))


def _spec(name: str) -> FetchSpec:
    try:
        return FETCHABLE[name]
    except KeyError:
        raise AsearchError(f"unknown dataset {name!r}; fetchable: {', '.join(FETCHABLE)}") from None


def _local_rows(path: Path) -> Iterator[Mapping[str, Any]]:
    """Rows of a local copy: .tsv/.csv (as released by Frames and PopQA), else jsonl / JSON list / parquet."""
    if not path.is_file():
        raise AsearchError(f"{path}: file not found")
    if path.suffix in (".tsv", ".csv"):
        lines = io.StringIO(read_utf8_text(path), newline="")  # quoted fields may hold newlines
        reader = csv.DictReader(lines, delimiter="\t" if path.suffix == ".tsv" else ",")
        try:
            yield from reader
        except csv.Error as e:
            raise DataFormatError(path, reader.line_num, None, f"not a readable {path.suffix[1:]} row: {e}") from None
    else:
        for _, row in iter_rows(path):
            yield row


def _download(spec: FetchSpec) -> Iterator[Mapping[str, Any]]:
    try:
        import datasets  # the Hugging Face library; optional, only `asearch data fetch` needs it
    except ImportError:
        raise AsearchError(
            f"fetching {spec.name} needs the Hugging Face `datasets` library: pip install datasets "
            f"(or download {spec.hub_id} yourself and run `asearch data fetch {spec.name} --from FILE`)"
        ) from None
    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "") not in ("", "0")]
    try:
        ds = datasets.load_dataset(spec.hub_id, spec.config, split=spec.split)
    except Exception as e:  # connection, auth (gated sets) and missing-config errors all land here
        needs = "network access to the Hugging Face Hub" + (
            ", accepted terms and HF_TOKEN" if spec.gated else ""
        )
        hint = f" {' and '.join(offline)} is set: unset it to allow downloads." if offline else ""
        raise AsearchError(
            f"could not download {spec.hub_id} ({spec.config or 'default'}, {spec.split}): {type(e).__name__}: {e}. "
            f"Fetching needs {needs}.{hint} Offline, convert a downloaded copy: "
            f"asearch data fetch {spec.name} --from FILE"
        ) from None
    yield from ds
