"""The incremental jsonl reader: only appended bytes are read, torn tails wait, rewrites restart, bad lines count."""

from __future__ import annotations

import json
import os

from asearch.files import append_jsonl, write_jsonl
from asearch.view.follow import JsonlFollower, read_line_at


def test_reads_only_what_was_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = JsonlFollower(path)
    assert follower.poll() == []  # no file yet
    for step in range(3):
        append_jsonl(path, {"step": step, "x": step * 0.5})
    first = follower.poll()
    assert [line.obj["step"] for line in first] == [0, 1, 2]
    assert [line.number for line in first] == [1, 2, 3]
    assert follower.offset == path.stat().st_size
    assert follower.poll() == []

    # Overwrite the first line in place (same length) and append one: the follower does not read the
    # old bytes again (it would see step 9), only the new line.
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"step": 0', b'"step": 9', 1))
    append_jsonl(path, {"step": 3, "x": 1.5})
    (new,) = follower.poll()
    assert new.obj == {"step": 3, "x": 1.5} and new.number == 4
    assert read_line_at(path, new.offset, new.length) == new.obj


def test_a_torn_last_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"step": 1})
    follower = JsonlFollower(path)
    assert len(follower.poll()) == 1
    with open(path, "ab") as f:  # a writer caught mid-line
        f.write(b'{"step": 2, "reward')
    assert follower.poll() == []
    assert follower.bad_lines == 0
    with open(path, "ab") as f:
        f.write(b'": 0.5}\n')
    (line,) = follower.poll()
    assert line.obj == {"step": 2, "reward": 0.5} and line.number == 2


def test_a_rewritten_or_truncated_file_is_read_again(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [{"i": i} for i in range(4)])
    follower = JsonlFollower(path)
    assert len(follower.poll()) == 4 and follower.generation == 0
    write_jsonl(path, [{"i": 10}, {"i": 11}])  # atomic rewrite: another inode
    assert [line.obj["i"] for line in follower.poll()] == [10, 11]
    assert follower.generation == 1
    with open(path, "r+b") as f:  # truncated in place
        f.truncate(0)
    assert follower.poll() == [] and follower.generation == 2
    append_jsonl(path, {"i": 20})
    assert [line.obj["i"] for line in follower.poll()] == [20]
    os.unlink(path)
    assert follower.poll() == [] and follower.generation == 3


def test_bad_lines_are_counted_and_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"ok": 1}) + "\n{not json\n[1, 2]\n\n" + json.dumps({"ok": 2}) + "\n")
    follower = JsonlFollower(path)
    lines = follower.poll()
    assert [line.obj["ok"] for line in lines] == [1, 2]
    assert [line.number for line in lines] == [1, 5]
    assert follower.bad_lines == 2
    assert follower.problems[0].startswith(f"{path}:2:") and "not valid JSON" in follower.problems[0]
    assert follower.problems[1].startswith(f"{path}:3:") and "got list" in follower.problems[1]
