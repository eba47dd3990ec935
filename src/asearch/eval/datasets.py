"""QA datasets as they come: ASearcher / FlashRAG / asearch jsonl, Search-R1 (verl) parquet, JSON lists.

Rows of any of these shapes become `QARecord`s, each keeping its `data_source` when it names one; a
malformed row is a DataFormatError naming the file, line (parquet: 1-based row) and field.
`load_dataset(spec)` resolves a built-in set (`world...`, `wiki10k...`), a file, a directory, or a name
under `{data_dir}/{name}/{split}.jsonl`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from asearch.errors import AsearchError, DataFormatError
from asearch.eval.builtin import load_builtin
from asearch.eval.records import QARecord
from asearch.files import iter_jsonl, read_utf8_text

__all__ = [
    "DATA_SUFFIXES",
    "QARecord",
    "ROW_READERS",
    "dataset_name_for",
    "is_builtin",
    "iter_rows",
    "load_dataset",
    "read_qa_file",
    "record_from_row",
    "resolve_dataset_file",
]

_SPLIT_NAMES = frozenset({"test", "dev", "val", "valid", "validation", "train", "eval"})
_ID_KEYS = ("id", "qid", "idx")
# Keys a row's answer may live under, in the order they are looked for (first present wins):
# asearch's own, Search-R1/verl's reward target, FlashRAG's, ASearcher's (`answer`, or `gt`).
_GOLD_KEYS = ("golds", "reward_model.ground_truth.target", "golden_answers", "answer", "gt", "answers")
# Row keys turned into QARecord fields (the rest goes to metadata); a verl row's chat `prompt` and
# `reward_model` are consumed too: they only restate the question and the golds.
_CONSUMED = frozenset(
    {"question", "golds", "aug_golds", "golden_answers", "answer", "gt", "answers", "aug_answer"}
    | {"prompt", "reward_model"}
)


# --------------------------------------------------------------------------- one row -> QARecord


def _dig(row: Mapping[str, Any], dotted: str) -> Any:
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _answers(value: Any, where: tuple[Path | str, int | None], field: str) -> list[str]:
    """A str / number / list of those -> list of non-blank strings (a number like 1937 becomes "1937")."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    out: list[str] = []
    for i, item in enumerate(items):
        name = field if not isinstance(value, list | tuple) else f"{field}[{i}]"
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise DataFormatError(
                *where, name, f"expected a string (or a list of strings), got {type(item).__name__}"
            )
        text = str(item).strip()
        if not text:
            raise DataFormatError(*where, name, "blank answer")
        out.append(text)
    if not out:
        raise DataFormatError(*where, field, "empty list of answers")
    return out


def _question(row: Mapping[str, Any], where: tuple[Path | str, int | None]) -> str:
    q = row.get("question")
    if q is None and isinstance(row.get("prompt"), list):
        # Search-R1/verl rows: the question is the last user turn of the chat prompt, whose template
        # ends with "Question: <q>"; without that marker the whole turn is the question.
        users = [m for m in row["prompt"] if isinstance(m, Mapping) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise DataFormatError(
                *where, "prompt", "no user turn with text content to take the question from"
            )
        content = users[-1]["content"]
        marker = content.rfind("Question:")
        q = content[marker + len("Question:") :] if marker >= 0 else content
    if q is None:
        raise DataFormatError(*where, "question", "missing (and no chat `prompt` to take it from)")
    if not isinstance(q, str):
        raise DataFormatError(*where, "question", f"expected a string, got {type(q).__name__}")
    if not q.strip():
        raise DataFormatError(*where, "question", "blank")
    return q.strip()


def _given_id(row: Mapping[str, Any], where: tuple[Path | str, int | None]) -> str | None:
    """The id the row names (`id`, `qid`, `idx`, else verl's `extra_info.index`), or None."""
    rid = next((row[k] for k in _ID_KEYS if row.get(k) is not None), None)
    if rid is None:
        rid = _dig(row, "extra_info.index")
    if rid is None:
        return None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        raise DataFormatError(*where, "id", f"expected a string or integer, got {type(rid).__name__}")
    return str(rid)


def _data_source(row: Mapping[str, Any], where: tuple[Path | str, int | None]) -> str:
    """The row's `data_source` (Search-R1/verl; any shape may carry one), "" when it has none."""
    source = row.get("data_source")
    if source is None or source == "":
        return ""
    if not isinstance(source, str) or not source.strip():
        raise DataFormatError(*where, "data_source", f"expected a non-blank string, got {source!r}")
    return source.strip()


def _parse_row(row: Any, where: tuple[Path | str, int | None], dataset: str) -> tuple[QARecord, bool]:
    """(record, whether the row named its id); a row without one gets the id "" for the caller to fill."""
    if not isinstance(row, Mapping):
        raise DataFormatError(*where, None, f"expected a JSON object, got {type(row).__name__}")
    question = _question(row, where)

    gold_key = next((k for k in _GOLD_KEYS if _dig(row, k) is not None), None)
    if gold_key is None:
        raise DataFormatError(
            *where, "answer", "no gold answer: expected one of " + ", ".join(repr(k) for k in _GOLD_KEYS)
        )
    golds = _answers(_dig(row, gold_key), where, gold_key)
    aug_key = "aug_golds" if "aug_golds" in row else "aug_answer"
    aug = _answers(row[aug_key], where, aug_key) if row.get(aug_key) not in (None, [], "") else []
    rid = _given_id(row, where)

    if "golds" in row:  # asearch's own line: metadata is a field of its own
        meta = row.get("metadata") or {}
        if not isinstance(meta, Mapping):
            raise DataFormatError(*where, "metadata", f"expected an object, got {type(meta).__name__}")
        metadata = dict(meta)
        name = row.get("dataset") or dataset
    else:
        metadata = {k: v for k, v in row.items() if k not in _CONSUMED and k not in _ID_KEYS}
        name = dataset
    record = QARecord(
        id=rid or "",
        question=question,
        golds=golds,
        aug_golds=aug,
        dataset=str(name),
        data_source=_data_source(row, where),
        metadata=metadata,
    )
    return record, rid is not None


def record_from_row(
    row: Any, where: tuple[Path | str, int | None], *, dataset: str, default_id: str
) -> QARecord:
    """Read one row in any supported shape; `where` = (file, line) for errors; `default_id` when the row
    names no id (`read_qa_file` picks one no other row of the file names)."""
    record, named = _parse_row(row, where, dataset)
    return record if named else record.model_copy(update={"id": default_id})


# --------------------------------------------------------------------------- files -> rows


def iter_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line, row) for each row of a dataset file, read by the reader of its suffix (`ROW_READERS`; any
    other suffix is read as jsonl).

    For parquet, `line` is the 1-based row number; for a JSON list, the line where the element starts.
    """
    path = Path(path)
    yield from ROW_READERS.get(path.suffix, iter_jsonl)(path)


def read_qa_file(path: str | Path, *, dataset: str | None = None, allow_empty: bool = False) -> list[QARecord]:
    """All records of one file (any supported shape), ids made unique per dataset (`_assign_ids`); a
    duplicate left is an error naming both lines, and so is a file without a single question unless
    `allow_empty`."""
    path = Path(path)
    if not path.is_file():
        raise AsearchError(f"{path}: dataset file not found")
    name = dataset or dataset_name_for(path)
    rows = [(line, *_parse_row(row, (path, line), name)) for line, row in iter_rows(path)]
    if not rows and not allow_empty:
        raise DataFormatError(
            path, None, None, "no questions in it (empty, blank lines only, or an empty list); "
            "`asearch eval` and `asearch data show` take such a file with --allow-empty",
        )
    return _assign_ids(path, rows)


def _line_id(line: int, named: set[str]) -> str:
    """The id of a row that names none: its line number, unless another row names that id itself; then
    `line<N>`, then `line<N>.<j>` (each form holds N, so two generated ids never meet either)."""
    candidates = itertools.chain([str(line), f"line{line}"], (f"line{line}.{j}" for j in itertools.count(1)))
    return next(c for c in candidates if c not in named)


def _with_source_prefix(rec: QARecord) -> QARecord:
    """`nq` row `test_0` -> id `nq/test_0`; a row without a data_source unchanged."""
    return rec.model_copy(update={"id": f"{rec.data_source}/{rec.id}"}) if rec.data_source else rec


def _assign_ids(path: Path, rows: list[tuple[int, QARecord, bool]]) -> list[QARecord]:
    """Fill in the ids rows do not name, and make named ids unique per dataset.

    A file merging several sources whose ids restart per source (Search-R1's merged test set: `id` and
    `extra_info.index` count from 0 in each `data_source`) gets ids `<data_source>/<id>` on every row
    with a `data_source`; a file whose named ids are already unique keeps them as they are. Ids still
    repeated (within one source) are an error naming both lines.
    """
    named = [(line, rec) for line, rec, has_id in rows if has_id]
    keys = [(rec.dataset, rec.id) for _, rec in named]
    repeated = len(set(keys)) < len(keys)
    if repeated and len({(rec.dataset, rec.data_source, rec.id) for _, rec in named}) > len(set(keys)):
        # some id repeats across sources, so the source must be part of the id; the check below
        # still catches an id repeated within one source
        rows = [(line, _with_source_prefix(rec) if has_id else rec, has_id) for line, rec, has_id in rows]
    taken = {rec.id for _, rec, has_id in rows if has_id}
    records: list[QARecord] = []
    first_line: dict[tuple[str, str], int] = {}
    for line, rec, has_id in rows:
        if not has_id:
            rec = rec.model_copy(update={"id": _line_id(line, taken)})
        key = (rec.dataset, rec.id)
        if key in first_line:
            within = f" in data_source {rec.data_source!r}" if rec.data_source else ""
            raise DataFormatError(
                path, line, "id", f"duplicate id {rec.id!r}{within} (first at line {first_line[key]})"
            )
        first_line[key] = line
        records.append(rec)
    return records


def dataset_name_for(path: Path) -> str:
    """`data/nq/test.jsonl` -> "nq"; `my_questions.jsonl` -> "my_questions"."""
    return path.parent.name if path.stem in _SPLIT_NAMES and path.parent.name else path.stem


def _first_char(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head[:1].decode("ascii", "replace")


def _iter_json(path: Path) -> Iterator[tuple[int, Any]]:
    """A JSON list, or (as some sets ship under .json) one object per line."""
    return _iter_json_array(path) if _first_char(path) == "[" else iter_jsonl(path)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise AsearchError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError with its own explanation
        raise DataFormatError(path, None, None, f"not a readable parquet file ({e})") from None
    row_no = 0
    for batch in parquet.iter_batches(batch_size=2048):
        for row in batch.to_pylist():
            row_no += 1
            yield row_no, row


def _iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """Elements of a top-level JSON list with the line each starts on (json.load would lose lines)."""
    text = read_utf8_text(path)
    decoder = json.JSONDecoder()
    pos, line = 0, 1

    def skip_ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def advance(to: int) -> None:
        nonlocal pos, line
        line += text.count("\n", pos, to)
        pos = to

    def fail(i: int, problem: str) -> DataFormatError:
        advance(i)
        return DataFormatError(path, line, None, problem)

    i = skip_ws(0)
    if i >= len(text) or text[i] != "[":
        raise fail(i, "expected a JSON list of question objects")
    i = skip_ws(i + 1)
    if i < len(text) and text[i] == "]":
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise fail(e.pos, f"not valid JSON ({e.msg})") from None
        advance(i)
        yield line, obj
        i = skip_ws(end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(i + 1)
        elif i < len(text) and text[i] == "]":
            if skip_ws(i + 1) != len(text):
                raise fail(skip_ws(i + 1), "unexpected text after the closing ]")
            return
        else:
            raise fail(i, "expected ',' or ']' after a list element")


# A new dataset format is one reader `(path) -> (line, row) pairs` and its suffix here.
ROW_READERS: dict[str, Callable[[Path], Iterator[tuple[int, Any]]]] = {
    ".jsonl": iter_jsonl,
    ".json": _iter_json,
    ".parquet": _iter_parquet,
}
DATA_SUFFIXES = tuple(ROW_READERS)
"""Tried in this order for `{data_dir}/{name}/{split}{suffix}`."""


# --------------------------------------------------------------------------- names -> records


def is_builtin(spec: str) -> bool:
    """True for the generated sets: `world`, `world:...`, `wiki10k`, `wiki10k:...`."""
    return spec.split(":", 1)[0] in ("world", "wiki10k")


def resolve_dataset_file(
    spec: str | Path, *, split: str = "test", data_dir: str | Path | None = None
) -> Path:
    """A file path as is; a directory's `{split}.*`; or `{data_dir}/{spec}/{split}.*` (jsonl, json, parquet)."""
    path = Path(spec)
    tried: list[Path] = []
    if path.is_file():
        return path
    candidates_dirs = [path] if path.is_dir() else []
    if data_dir is not None:
        candidates_dirs.append(Path(data_dir) / str(spec))
    for d in candidates_dirs:
        for suffix in DATA_SUFFIXES:
            f = d / f"{split}{suffix}"
            tried.append(f)
            if f.is_file():
                return f
    where = ", ".join(str(t) for t in tried) if tried else str(path)
    hint = "" if data_dir is not None else " (no data dir given)"
    raise AsearchError(
        f"dataset {str(spec)!r} not found{hint}: tried {where}. Give a file, a directory holding {split}.jsonl, "
        f"a name under the data dir (`asearch data fetch NAME` puts it there), or a built-in set (world, wiki10k)"
    )


def load_dataset(
    spec: str | Path,
    *,
    split: str = "test",
    data_dir: str | Path | None = None,
    limit: int | None = None,
    name: str | None = None,
    allow_empty: bool = False,
) -> list[QARecord]:
    """Records of a built-in set, a file, a directory, or `{data_dir}/{spec}/{split}.jsonl`, in file order.

    `limit` keeps the first N; `name` overrides the dataset name the records carry (default: the
    built-in spec, or the directory / file stem); a file without questions is an error unless `allow_empty`.
    """
    if limit is not None and limit < 1:
        raise AsearchError(f"limit must be >= 1, got {limit}")
    if isinstance(spec, str) and is_builtin(spec):  # reserved names: a directory called world needs ./world
        records = load_builtin(spec)
        if name:
            records = [r.model_copy(update={"dataset": name}) for r in records]
    else:
        path = resolve_dataset_file(spec, split=split, data_dir=data_dir)
        default = str(spec) if data_dir is not None and path.parent == Path(data_dir) / str(spec) else None
        records = read_qa_file(path, dataset=name or default, allow_empty=allow_empty)
    return records[:limit] if limit is not None else records
