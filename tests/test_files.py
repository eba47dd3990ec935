"""Atomic writes, the line-numbered jsonl reader and the cut of a torn last line before an append."""

from __future__ import annotations

import pytest

from asearch.errors import DataFormatError
from asearch.files import append_jsonl, atomic_write_json, atomic_write_text, iter_jsonl, repair_jsonl_tail


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


WHOLE = b'{"a": 1}\n{"a": 2}\n'


@pytest.mark.parametrize(
    "torn",
    [
        b'{"a": ',  # a write cut by a kill
        b'{"a": 3}',  # cut just before its newline: it parses, but the next line would be glued to it
        b'{"a": 3, "b": "' + b"x" * 200_000,  # longer than one read-back block
        b'{"a": {"a": 4}\n',  # a fragment an older append was glued to: ends whole, is not JSON
        b'{"a": "\xff\n',  # not even UTF-8
    ],
)
def test_repair_cuts_only_the_torn_last_line_and_says_so(tmp_path, caplog, torn):
    p = tmp_path / "r.jsonl"
    p.write_bytes(WHOLE + torn)
    with caplog.at_level("WARNING", logger="asearch.files"):
        assert repair_jsonl_tail(p) == len(torn)
    assert p.read_bytes() == WHOLE
    assert f"{p}: cut a torn last line ({len(torn)} bytes)" in caplog.text


@pytest.mark.parametrize("content", [b"", b"\n", WHOLE, WHOLE + b"\n"])
def test_repair_leaves_whole_files_alone(tmp_path, caplog, content):
    p = tmp_path / "r.jsonl"
    p.write_bytes(content)
    with caplog.at_level("WARNING", logger="asearch.files"):
        assert repair_jsonl_tail(p) == 0
        assert repair_jsonl_tail(tmp_path / "missing.jsonl") == 0
    assert p.read_bytes() == content and caplog.text == ""
    assert not (tmp_path / "missing.jsonl").exists()


def test_an_append_after_a_torn_tail_starts_on_a_fresh_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(WHOLE + b'{"a": 3, "b"')
    append_jsonl(p, {"a": 4})
    assert [o["a"] for _, o in iter_jsonl(p)] == [1, 2, 4]  # strict read: every line parses
