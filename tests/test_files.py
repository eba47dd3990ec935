"""Atomic writes and the line-numbered jsonl reader."""

from __future__ import annotations

import pytest

from asearch.errors import DataFormatError
from asearch.files import append_jsonl, atomic_write_json, atomic_write_text, iter_jsonl


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "out.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [f.name for f in p.parent.iterdir()] == ["out.txt"]


def test_append_and_read_back_with_line_numbers(tmp_path):
    p = tmp_path / "r.jsonl"
    for i in range(3):
        append_jsonl(p, {"i": i})
    assert [(n, o["i"]) for n, o in iter_jsonl(p)] == [(1, 0), (2, 1), (3, 2)]


def test_bad_line_error_names_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(DataFormatError, match=r"r\.jsonl:3: expected a JSON object"):
        list(iter_jsonl(p))
    p.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DataFormatError, match=r"r\.jsonl:2: not valid JSON"):
        list(iter_jsonl(p))


def test_torn_tail_is_skipped_only_when_tolerated(tmp_path):
    p = tmp_path / "r.jsonl"
    atomic_write_json(tmp_path / "x.json", {"ok": True})
    p.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": ')
    assert [o["a"] for _, o in iter_jsonl(p, tolerate_torn_tail=True)] == [1, 2]
    with pytest.raises(DataFormatError):
        list(iter_jsonl(p))


def test_atomic_outputs_are_readable_like_normal_files(tmp_path):
    import os
    import stat

    p = tmp_path / "out.json"
    atomic_write_json(p, {"a": 1})
    mode = stat.S_IMODE(p.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
