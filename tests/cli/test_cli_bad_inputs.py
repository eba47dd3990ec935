"""Every command fed what a careless user gives it: a bad file or a bad value must end in a non-zero exit and
one message naming the file / line / option, never a Python traceback (issue 18 item 3).

Each case runs in a process of its own: one runner process imports the package once and forks a child per
case (a few at a time) that calls the CLI's `main()` as `python -m asearch` does, so the table costs seconds,
not an interpreter start per case. `test_the_runner_matches_a_fresh_interpreter` checks that a fresh
`python -m asearch` gives the same exit code and output. Each case is its own test, named after the command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASE_TIMEOUT_S = 120


def _line(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()


QUESTION = _line({"id": "q1", "question": "Who wrote Hamlet?", "answer": "Shakespeare"})
DOCUMENT = _line({"id": "7", "title": "Hamlet", "text": "A tragedy by William Shakespeare."})
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"

# name under the case directory -> bytes of the file (None: a directory)
BAD_FILES: dict[str, bytes | None] = {
    "ds_good.jsonl": QUESTION,
    "ds_latin1.jsonl": QUESTION + b'{"id": "q2", "question": "Caf\xe9 owner?", "answer": "Ren\xe9"}\n',
    "ds_malformed.jsonl": QUESTION + b'{"id": "q2", "question": "Who\n',
    "ds_dup.jsonl": QUESTION + QUESTION,
    "ds_latin1.json": b'[\n  {"question": "Caf\xe9?", "answer": "x"}\n]\n',
    "ds_fake.parquet": b"this is not parquet\n",
    "corpus_latin1.jsonl": DOCUMENT + b'{"id": "8", "title": "Caf\xe9", "text": "Ren\xe9 ran it."}\n',
    "corpus_malformed.jsonl": DOCUMENT + b'{"id": "8", "title": \n',
    "corpus_dup.jsonl": DOCUMENT
    + _line({"id": "9", "title": "Macbeth", "text": "Another tragedy."})
    + _line({"id": "7", "title": "Hamlet again", "text": "A second copy of the same id."}),
    "empty.jsonl": b"",
    "blank.jsonl": b"\n   \n\t\n",
    "bin.yaml": PNG_HEAD,
    "latin1.yaml": b"seed: 1\n# caf\xe9\n",
    "unknown_key.yaml": b"seeed: 1\n",
    "bench_latin1.json": b'{"args": "caf\xe9"}\n',
    "adir": None,
    "adir.jsonl": None,
    "empty_run": None,
    "bad_index": None,
    "bad_index/manifest.json": b"\xff\xfe{not json",
}


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]  # each must appear in the output (whitespace collapsed)


def case(id: str, argv: str, *expect: str) -> Case:
    return Case(id, tuple(argv.split()), expect)


CASES = [
    # asearch data show
    case("data-show/latin1", "data show {ds_latin1.jsonl}", "ds_latin1.jsonl:2", "UTF-8", "byte 0xe9 at byte 100"),
    case("data-show/latin1-json-list", "data show {ds_latin1.json}", "ds_latin1.json:2", "UTF-8"),
    case("data-show/empty", "data show {empty.jsonl}", "empty.jsonl", "--allow-empty"),
    case("data-show/blank", "data show {blank.jsonl}", "blank.jsonl", "--allow-empty"),
    case("data-show/malformed", "data show {ds_malformed.jsonl}", "ds_malformed.jsonl:2", "JSON"),
    case("data-show/missing", "data show {missing.jsonl}", "missing.jsonl"),
    case("data-show/duplicate-ids", "data show {ds_dup.jsonl}", "ds_dup.jsonl:2", "duplicate id", "line 1"),
    case("data-show/directory", "data show {adir}", "adir", "test.jsonl"),
    case("data-show/not-parquet", "data show {ds_fake.parquet}", "ds_fake.parquet", "parquet"),
    case("data-show/negative-n", "data show {ds_good.jsonl} -n -1", "-n"),
    case("data-fetch/unknown-name", "data fetch nosuchset", "nosuchset"),
    case("data-fetch/from-latin1", "data fetch nq --from {ds_latin1.jsonl} --out {out}", "ds_latin1.jsonl:2"),
    # asearch eval
    case("eval/latin1", "eval -d {ds_latin1.jsonl}", "ds_latin1.jsonl:2", "UTF-8"),
    case("eval/empty", "eval -d {empty.jsonl}", "empty.jsonl", "--allow-empty"),
    case("eval/blank", "eval -d {blank.jsonl}", "blank.jsonl", "--allow-empty"),
    case("eval/malformed", "eval -d {ds_malformed.jsonl}", "ds_malformed.jsonl:2"),
    case("eval/missing", "eval -d {missing.jsonl}", "missing.jsonl"),
    case("eval/binary-config", "eval -d {ds_good.jsonl} -c {bin.yaml}", "bin.yaml:1", "UTF-8"),
    case("eval/latin1-config", "eval -d {ds_good.jsonl} -c {latin1.yaml}", "latin1.yaml:2", "UTF-8"),
    case("eval/config-is-dir", "eval -d {ds_good.jsonl} -c {adir}", "adir"),
    case("eval/unknown-key", "eval -d {ds_good.jsonl} nosuch.key=1", "nosuch"),
    case("eval/k-zero", "eval -d {ds_good.jsonl} --k 0", "eval.k"),
    case("eval/seeds-not-int", "eval -d {ds_good.jsonl} --seeds 1,x", "--seeds", "'x'"),
    case("eval/bad-shard", "eval -d {ds_good.jsonl} --shard 3/2", "shard"),
    case("eval/negative-limit", "eval -d {ds_good.jsonl} --limit -1", "limit"),
    case("eval/zero-concurrency", "eval -d {ds_good.jsonl} --concurrency 0", "concurrency"),
    case("eval/aggregate-missing", "eval --aggregate-only --out {missing_dir}", "missing_dir"),
    # asearch corpus
    case("corpus-info/latin1", "corpus info {corpus_latin1.jsonl}", "corpus_latin1.jsonl:2", "UTF-8"),
    case("corpus-info/empty", "corpus info {empty.jsonl}", "empty.jsonl", "empty"),
    case("corpus-info/blank", "corpus info {blank.jsonl}", "blank.jsonl", "empty"),
    case("corpus-info/malformed", "corpus info {corpus_malformed.jsonl}", "corpus_malformed.jsonl:2"),
    case("corpus-info/missing", "corpus info {missing.jsonl}", "missing.jsonl"),
    case("corpus-info/directory", "corpus info {adir.jsonl}", "adir.jsonl", "directory"),
    case("corpus-info/negative-words", "corpus info world --words -5", "--words"),
    case("corpus-info/bad-world-option", "corpus info world:seed=x", "seed", "'x'"),
    case("corpus-export/latin1", "corpus export {corpus_latin1.jsonl} --out {out}/x.jsonl", "corpus_latin1.jsonl:2"),
    case("corpus-export/out-is-dir", "corpus export {corpus_dup.jsonl} --out {adir}", "adir"),
    case("corpus-show/latin1", "corpus show {corpus_latin1.jsonl} Hamlet", "corpus_latin1.jsonl:2"),
    # asearch index
    case("index-build/duplicate-ids", "index build --corpus {corpus_dup.jsonl} --out {out}/i",
         "corpus_dup.jsonl:3", "'7'", "line 1"),  # fmt: skip
    case("index-build/empty", "index build --corpus {empty.jsonl} --out {out}/i", "empty.jsonl", "--allow-empty"),
    case("index-build/blank", "index build --corpus {blank.jsonl} --out {out}/i", "blank.jsonl", "--allow-empty"),
    case("index-build/latin1", "index build --corpus {corpus_latin1.jsonl} --out {out}/i", "corpus_latin1.jsonl:2"),
    case("index-build/binary-config", "index build --corpus world --out {out}/i -c {bin.yaml}", "bin.yaml:1"),
    case("index-build/unknown-key", "index build --corpus world --out {out}/i chunk.wordz=3", "chunk.wordz"),
    case("index-build/negative-words", "index build --corpus world --out {out}/i chunk.words=-1", "chunk.words"),
    case("index-info/missing", "index info {missing_dir}", "missing_dir"),
    case("index-info/a-file", "index info {ds_good.jsonl}", "ds_good.jsonl"),
    case("index-info/binary-manifest", "index info {bad_index}", "manifest.json"),
    case("index-search/zero-topk", "index search {bad_index} q --topk 0", "--topk"),
    # asearch serve
    case("serve/port-too-big", "serve --index {missing_dir} --port 70000", "--port", "70000"),
    case("serve/negative-port", "serve --index {missing_dir} --port -1", "--port"),
    case("serve/binary-config", "serve --index {missing_dir} -c {bin.yaml}", "bin.yaml:1"),
    case("serve/unknown-key", "serve --index {missing_dir} prot=1", "prot"),
    case("serve/missing-index", "serve --index {missing_dir}", "missing_dir"),
    # asearch view
    case("view/missing-run", "view {missing_dir}", "missing_dir"),
    case("view/port-too-big", "view {empty_run} --port 70000", "--port", "70000"),
    case("view/negative-poll", "view {empty_run} --poll-s -1", "--poll-s"),
    # asearch ask
    case("ask/binary-config", "ask q -c {bin.yaml}", "bin.yaml:1"),
    case("ask/unknown-key", "ask q nosuch=1", "nosuch"),
    case("ask/negative-turns", "ask q --max-turns -1", "max_turns"),
    case("ask/latin1-corpus", "ask q --corpus {corpus_latin1.jsonl}", "corpus_latin1.jsonl:2"),
    case("ask/empty-corpus", "ask q --corpus {empty.jsonl}", "empty.jsonl"),
    # asearch train
    case("train/binary-config", "train {bin.yaml}", "bin.yaml:1", "UTF-8", "byte 0x89 at byte 0"),
    case("train/latin1-config", "train {latin1.yaml}", "latin1.yaml:2", "UTF-8"),
    case("train/missing-config", "train {missing.yaml}", "missing.yaml"),
    case("train/config-is-dir", "train {adir}", "adir"),
    case("train/unknown-key-in-file", "train {unknown_key.yaml}", "unknown_key.yaml:1", "seeed"),
    case("train/negative-steps", "train {configs}/train-world-tiny.yaml steps=-1", "steps"),
    # asearch demo
    case("demo/binary-config", "demo -c {bin.yaml}", "bin.yaml:1"),
    case("demo/unknown-preset", "demo --preset nosuch", "nosuch"),
    case("demo/unknown-key", "demo bogus=1", "bogus"),
    # asearch sim
    case("sim/binary-config", "sim {bin.yaml}", "bin.yaml:1"),
    case("sim/unknown-key", "sim {configs}/sim-reference.yaml bogus=1", "bogus"),
    case("sim/calibrate-latin1", "sim --calibrate {bench_latin1.json}", "bench_latin1.json"),
    # asearch synth
    case("synth/binary-config", "synth {bin.yaml}", "bin.yaml:1"),
    case("synth/unknown-key", "synth {configs}/synth-world.yaml bogus=1", "bogus"),
    case("synth-report/no-config", "synth report {empty_run}", "config.yaml"),
    case("synth-measure/latin1", "synth measure {ds_latin1.jsonl} --out {out}/m", "ds_latin1.jsonl:2"),
    case("synth-measure/empty", "synth measure {empty.jsonl} --out {out}/m", "empty.jsonl"),
    # asearch engine
    case("engine-serve/unknown-model", "engine serve nosuch-model", "nosuch-model"),
]

TRACE_MARKERS = ("Traceback (most recent call last)", "╭─ Traceback")
# Modules the commands import lazily: the case runner imports them once, so that each case (a forked child)
# costs what its own work costs, not a fresh interpreter's imports.
PRELOAD = (
    "asearch.cli.app", "asearch.agent.runtime", "asearch.eval.runner", "asearch.launch.train",
    "asearch.demo.pipeline", "asearch.retrieval.server", "asearch.synth", "asearch.synth.measure",
    "asearch.sim.run", "asearch.view", "asearch.engine.server.app",
)  # fmt: skip


def _materialise(root: Path) -> None:
    for name, data in BAD_FILES.items():
        path = root / name
        if data is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _argv(c: Case, root: Path) -> list[str]:
    names = {n: str(root / n) for n in BAD_FILES}
    names.update({n: str(root / n) for n in ("missing.jsonl", "missing.yaml", "missing_dir")})
    names["out"] = str(root / "out" / c.id.replace("/", "_"))
    names["configs"] = str(ROOT / "configs")
    return [re.sub(r"\{([^}]+)\}", lambda m: names[m.group(1)], a) for a in c.argv]


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "COLUMNS": "4000",  # rich wraps at the terminal width: keep each message on one line
        "ASEARCH_CACHE": str(root / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


# --------------------------------------------------------------------------- the case runner (its own process)


def _run_child(argv: list[str], log: Path) -> None:
    """In a forked child: run `asearch ARGV` as `python -m asearch` would, output to `log`, and exit."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 1
    try:
        import asearch

        sys.argv = [str(Path(asearch.__file__).with_name("__main__.py")), *argv]
        from asearch.cli.app import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()  # what the interpreter prints for an uncaught exception
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_cases(spec_file: Path) -> None:
    """Run every case of `spec_file` ({"cases": [[id, argv], ...], "logs": dir}) in forked children, a few
    at a time; write {id: exit code or null (timed out)} to `<logs>/exits.json`."""
    import importlib
    import signal
    import time

    spec = json.loads(spec_file.read_text())
    logs = Path(spec["logs"])
    for module in PRELOAD:
        importlib.import_module(module)
    pending = [(i, cid, argv) for i, (cid, argv) in enumerate(spec["cases"])]
    running: dict[int, tuple[str, float]] = {}
    exits: dict[str, int | None] = {}
    width = max(2, os.cpu_count() or 1)
    while pending or running:
        while pending and len(running) < width:
            i, cid, argv = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _run_child(argv, logs / f"{i}.log")
            running[pid] = (cid, time.monotonic() + CASE_TIMEOUT_S)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            exits[running.pop(pid)[0]] = os.waitstatus_to_exitcode(status)
            continue
        for pid, (cid, deadline) in list(running.items()):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                exits[cid] = None
                del running[pid]
        time.sleep(0.01)
    (logs / "exits.json").write_text(json.dumps(exits))


# --------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A directory holding the bad files (`BAD_FILES`)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    _materialise(root)
    return root


@pytest.fixture(scope="module")
def table(root) -> dict[str, tuple[int | None, str]]:
    """Every case's (exit code, output): one runner process, one forked `asearch` per case."""
    logs = root / "logs"
    logs.mkdir()
    spec = root / "cases.json"
    spec.write_text(json.dumps({"cases": [[c.id, _argv(c, root)] for c in CASES], "logs": str(logs)}))
    subprocess.run(
        [sys.executable, __file__, str(spec)], cwd=root, env=_env(root), stdin=subprocess.DEVNULL,
        check=True, timeout=CASE_TIMEOUT_S * 4,
    )  # fmt: skip
    exits = json.loads((logs / "exits.json").read_text())
    return {c.id: (exits[c.id], (logs / f"{i}.log").read_text(errors="replace")) for i, c in enumerate(CASES)}


def _check(c: Case, rc: int | None, output: str) -> None:
    shown = f"asearch {' '.join(c.argv)} -> exit {rc}:\n{output[-3000:]}"
    assert rc not in (0, None), shown
    assert not any(m in output for m in TRACE_MARKERS), shown
    flat = " ".join(output.split())
    for wanted in c.expect:
        assert wanted in flat, f"{wanted!r} not named; {shown}"


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_named_not_traced(c: Case, table):
    _check(c, *table[c.id])


@pytest.mark.parametrize("case_id", ["data-show/latin1", "serve/port-too-big", "train/binary-config"])
def test_the_runner_matches_a_fresh_interpreter(case_id, table, root):
    """The table's forked children behave as `python -m asearch` does: same exit code, same output."""
    c = next(c for c in CASES if c.id == case_id)
    res = subprocess.run(
        [sys.executable, "-m", "asearch", *_argv(c, root)], cwd=root, env=_env(root), capture_output=True,
        text=True, timeout=CASE_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    _check(c, res.returncode, res.stdout + res.stderr)
    assert table[case_id] == (res.returncode, res.stdout + res.stderr)


if __name__ == "__main__":
    _run_cases(Path(sys.argv[1]))
