"""Find runs under the paths given to `asearch view`, tell their kind from their files, and read them incrementally.

    train         metrics.jsonl (+ trajectories.jsonl, summary.json, config.yaml, checkpoints/)
    eval          results.jsonl (+ summary.json, config.json, errors.jsonl)
    demo          rl/ (a train run) + summary.json, curve.png, report.md
                  (+ heldout_after.jsonl, heldout_before.jsonl, horizon.png: long-horizon episode rows)
    trajectories  a .json / .jsonl of Trajectory dicts (`asearch ask --json`), or a dir of trajectories.jsonl
    synth         .jsonl of synthesised questions (statements, edit_history, unique_verified) + filter_report.json

A path that is none of these is searched (three levels down) for runs; one with nothing yet is kept
and searched again later, so `asearch view runs/new` can be started before the run writes anything.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from asearch.errors import AsearchError, DataFormatError
from asearch.metrics.horizon import horizon_stats, read_episode_rows
from asearch.view.follow import JsonlFollower, read_line_at
from asearch.view.records import TrajectoryRow, row_of, split_record

__all__ = [
    "Catalog",
    "DemoRun",
    "EvalRun",
    "Run",
    "RunKind",
    "SynthRun",
    "TrainRun",
    "TrajectoryRun",
    "detect",
]

RunKind = Literal["train", "eval", "demo", "trajectories", "synth"]

SYNTH_KEYS = ("statements", "edit_history", "unique_verified", "qa_history")
# Directories that never hold runs (or hold huge numbers of files): not searched.
_SKIP_DIRS = {"checkpoints", "tb", "data", "__pycache__", "node_modules", ".git"}
_SEARCH_DEPTH = 3
_REDISCOVER_S = 2.0  # how often the paths are searched again for new runs
_IMAGES = ("curve.png", "horizon.png")
# The demo's per-episode rows of the held-out questions (`asearch.eval.horizon.write_episode_rows`).
HELDOUT_ROWS = {"before": "heldout_before.jsonl", "after": "heldout_after.jsonl"}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class _CachedJson:
    """A small JSON/text file read again only when its mtime changes (summary.json, config.yaml)."""

    def __init__(self, path: Path, parse: bool = True):
        self.path, self.parse = path, parse
        self._mtime: float | None = None
        self.value: Any = None
        self.problem: str | None = None

    def get(self) -> Any:
        m = _mtime(self.path)
        if m != self._mtime:
            self._mtime, self.problem = m, None
            if m is None:
                self.value = None
            else:
                try:
                    self.value = self._load()
                except json.JSONDecodeError as e:  # written atomically by us; a hand edit can still break it
                    self.value, self.problem = None, str(DataFormatError(self.path, e.lineno, None, e.msg))
                except DataFormatError as e:
                    self.value, self.problem = None, str(e)
                except FileNotFoundError:  # removed between the stat and the read
                    self.value = None
        return self.value

    def _load(self) -> Any:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        return json.loads(text) if self.parse else text

    @property
    def mtime(self) -> float | None:
        """The file's modification time now (None: absent)."""
        return _mtime(self.path)


class _CachedRows(_CachedJson):
    """A small jsonl file of episode rows, read whole again when its mtime changes."""

    def _load(self) -> list[dict[str, Any]]:
        return read_episode_rows(self.path)


class _Indexed(Protocol):
    index: int  # the row's position in its run's list, kept up to date by LineIndex


R = TypeVar("R", bound=_Indexed)


@dataclass(slots=True)
class _Entry(Generic[R]):
    row: R
    source: int  # which of the index's files
    offset: int  # where the line starts
    length: int


class LineIndex(Generic[R]):
    """Rows (small summaries) of every line of some jsonl files; the full line is read back on demand.

    `on_line(source, obj)` sees each new object once (e.g. to keep the score columns of eval lines);
    `on_reset(source)` is called when a file was replaced, before its lines are read again.
    """

    def __init__(
        self,
        paths: list[Path],
        make_row: Callable[[int, dict[str, Any]], R],
        on_line: Callable[[int, dict[str, Any]], None] | None = None,
        on_reset: Callable[[int], None] | None = None,
    ):
        self.paths = paths
        self.followers = [JsonlFollower(p) for p in paths]
        self.make_row, self.on_line, self.on_reset = make_row, on_line, on_reset
        self.entries: list[_Entry[R]] = []
        self.generation = 0

    def refresh(self) -> int:
        """Read what was appended; returns the number of new rows."""
        n = 0
        for src, follower in enumerate(self.followers):
            before = follower.generation
            lines = follower.poll()
            if follower.generation != before:
                self.generation += 1
                kept = [e for e in self.entries if e.source != src]
                self.entries = []
                for e in kept:  # renumbered: indexes stay positions in the list
                    self._append(e.source, e.offset, e.length, e.row)
                if self.on_reset:
                    self.on_reset(src)
            for line in lines:
                self._append(src, line.offset, line.length, self.make_row(len(self.entries), line.obj))
                if self.on_line:
                    self.on_line(src, line.obj)
                n += 1
        return n

    def _append(self, source: int, offset: int, length: int, row: R) -> None:
        row.index = len(self.entries)
        self.entries.append(_Entry(row, source, offset, length))

    @property
    def rows(self) -> list[R]:
        return [e.row for e in self.entries]

    def __len__(self) -> int:
        return len(self.entries)

    def read(self, i: int) -> dict[str, Any]:
        e = self.entries[i]
        return read_line_at(self.paths[e.source], e.offset, e.length)

    @property
    def bad_lines(self) -> int:
        return sum(f.bad_lines for f in self.followers)

    @property
    def problems(self) -> list[str]:
        return [p for f in self.followers for p in f.problems]

    @property
    def mtime(self) -> float | None:
        ms = [f.mtime for f in self.followers if f.mtime is not None]
        return max(ms) if ms else None


# --------------------------------------------------------------------------- runs


class Run:
    """A run the viewer shows. Subclasses read their own files; `refresh()` picks up what was appended."""

    kind: RunKind
    has_lifecycle = True  # whether the run is made by a process that ends (state: running / finished / idle)

    def __init__(self, run_id: str, path: Path, name: str):
        self.id, self.path, self.name = run_id, path, name
        self.trajectories: LineIndex[TrajectoryRow] | None = None

    def refresh(self) -> None:
        if self.trajectories is not None:
            self.trajectories.refresh()

    def data_mtime(self) -> float | None:
        """When the run's growing files last changed."""
        return self.trajectories.mtime if self.trajectories is not None else _mtime(self.path)

    def finished(self) -> bool:
        return False

    def bad_lines(self) -> tuple[int, list[str]]:
        if self.trajectories is None:
            return 0, []
        return self.trajectories.bad_lines, self.trajectories.problems

    def counts(self) -> dict[str, int]:
        return {"trajectories": len(self.trajectories)} if self.trajectories is not None else {}

    def trajectory_rows(self) -> list[TrajectoryRow]:
        return self.trajectories.rows if self.trajectories is not None else []

    @property
    def browsable(self) -> bool:
        """Whether the run has trajectories to browse."""
        return self.trajectories is not None

    def open_trajectory(self, i: int) -> dict[str, Any]:
        """The whole record of trajectory i (a train line, an eval result line, or a bare trajectory)."""
        assert self.trajectories is not None
        return self.trajectories.read(i)

    def images(self) -> list[str]:
        return [n for n in _IMAGES if (self.path / n).is_file()]

    def info(self, live_window_s: float) -> dict[str, Any]:
        mtime = self.data_mtime()
        age = None if mtime is None else max(0.0, time.time() - mtime)
        state: str | None
        if not self.has_lifecycle:
            state = None  # a file of trajectories or questions: no process whose end could be seen
        elif self.finished():
            state = "finished"
        elif age is not None and age < live_window_s:
            state = "running"
        else:
            state = "idle"
        bad, problems = self.bad_lines()
        return {
            "id": self.id,
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "state": state,
            "updated_s_ago": None if age is None else round(age, 1),
            "counts": self.counts(),
            "bad_lines": bad,
            "problems": problems,
        }


def _trajectory_index(paths: list[Path], **kw: Any) -> LineIndex[TrajectoryRow]:
    return LineIndex(paths, row_of, **kw)


class TrainRun(Run):
    kind: RunKind = "train"

    def __init__(self, run_id: str, path: Path, name: str):
        super().__init__(run_id, path, name)
        self.metrics = JsonlFollower(path / "metrics.jsonl")
        self.rows: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        self.trajectories = _trajectory_index([path / "trajectories.jsonl"])
        self.summary = _CachedJson(path / "summary.json")
        self.config_text = _CachedJson(path / "config.yaml", parse=False)

    def refresh(self) -> None:
        before = self.metrics.generation
        lines = self.metrics.poll()
        if self.metrics.generation != before:
            self.rows, self.keys = [], set()
        for line in lines:
            row = {k: v for k, v in line.obj.items() if _plottable(v) or k == "step"}
            self.rows.append(row)
            self.keys.update(k for k in row if k not in ("step",))
        super().refresh()

    def metrics_since(self, cursor: int, generation: int | None) -> dict[str, Any]:
        """Rows after `cursor` (a row count the client got last time); all rows when the file was replaced."""
        reset = generation is not None and generation != self.metrics.generation
        start = 0 if reset or cursor < 0 or cursor > len(self.rows) else cursor
        return {
            "run": self.id,
            "rows": self.rows[start:],
            "cursor": len(self.rows),
            "generation": self.metrics.generation,
            "reset": reset or start == 0 and cursor > 0,
        }

    def data_mtime(self) -> float | None:
        ms = [m for m in (self.metrics.mtime, super().data_mtime()) if m is not None]
        return max(ms) if ms else None

    def finished(self) -> bool:
        s, d = self.summary.mtime, self.data_mtime()
        return s is not None and (d is None or s >= d - 1.0)

    def counts(self) -> dict[str, int]:
        steps = [r["step"] for r in self.rows if isinstance(r.get("step"), int)]
        return {"metric_rows": len(self.rows), "last_step": max(steps, default=0), **super().counts()}

    def bad_lines(self) -> tuple[int, list[str]]:
        n, problems = super().bad_lines()
        return n + self.metrics.bad_lines, self.metrics.problems + problems

    def checkpoints(self) -> list[str]:
        d = self.path / "checkpoints"
        return sorted((p.name for p in d.iterdir() if p.is_dir()), key=_natural) if d.is_dir() else []


def _plottable(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))


def _natural(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class EvalRun(Run):
    kind: RunKind = "eval"
    # result-line fields the summary needs (the trajectory, the bulk, is read only when opened)
    _SCORE_FIELDS = (
        "id",
        "dataset",
        "pass",
        "em",
        "f1",
        "cem",
        "judge",
        "num_turns",
        "counters",
        "prediction",
    )
    _SCORE_FIELDS += ("finish", "wall_s")

    def __init__(self, run_id: str, path: Path, name: str):
        super().__init__(run_id, path, name)
        self.scores: list[dict[str, Any]] = []
        self.trajectories = _trajectory_index(
            [path / "results.jsonl"], on_line=self._keep_scores, on_reset=lambda _: self.scores.clear()
        )
        self.summary_file = _CachedJson(path / "summary.json")
        self.config = _CachedJson(path / "config.json")
        self._live: tuple[int, int, dict[str, Any] | None] = (-1, -1, None)
        self.errors = JsonlFollower(path / "errors.jsonl")
        self.error_count = 0

    def _keep_scores(self, _source: int, obj: dict[str, Any]) -> None:
        if all(isinstance(obj.get(k), str) for k in ("id", "dataset")) and isinstance(obj.get("pass"), int):
            self.scores.append({k: obj.get(k) for k in self._SCORE_FIELDS})

    def refresh(self) -> None:
        before = self.errors.generation
        new = len(self.errors.poll())
        self.error_count = new if self.errors.generation != before else self.error_count + new
        super().refresh()

    def summary(self) -> tuple[dict[str, Any] | None, str]:
        """(summary, where from): summary.json when it is up to date, else computed from the result lines
        read so far ("live"): the runner writes summary.json only when it finishes."""
        on_disk = self.summary_file.get()
        data = self.trajectories.mtime if self.trajectories else None
        if isinstance(on_disk, dict) and "datasets" in on_disk and (data is None or self.finished()):
            return on_disk, "summary.json"
        if not self.scores:
            return (on_disk if isinstance(on_disk, dict) else None), "summary.json"
        gen = self.trajectories.generation if self.trajectories else 0
        if self._live[:2] != (gen, len(self.scores)):
            self._live = (gen, len(self.scores), self._compute())
        return self._live[2], "live"

    def _compute(self) -> dict[str, Any] | None:
        from asearch.eval.report import summarize

        cfg = self.config.get() if isinstance(self.config.get(), dict) else {}
        k = cfg.get("k") if isinstance(cfg.get("k"), int) else max(int(r["pass"]) for r in self.scores) + 1
        expected = cfg.get("datasets") if isinstance(cfg.get("datasets"), dict) else None
        rows = [r for r in self.scores if r["pass"] < k]
        try:
            return summarize(rows, k=k, expected=expected)
        except (KeyError, TypeError, ValueError):  # a hand-made results file missing score fields
            return None

    def finished(self) -> bool:
        s, d = self.summary_file.mtime, self.trajectories.mtime if self.trajectories else None
        return s is not None and (d is None or s >= d - 1.0)

    def counts(self) -> dict[str, int]:
        return {**super().counts(), "errors": self.error_count}


class TrajectoryRun(Run):
    """Trajectories on their own: `asearch ask --json` output (.json or .jsonl) or a trajectories.jsonl dir."""

    kind: RunKind = "trajectories"
    has_lifecycle = False

    def __init__(self, run_id: str, path: Path, name: str):
        super().__init__(run_id, path, name)
        self._whole: _CachedJson | None = None
        self._records: list[dict[str, Any]] = []
        self._rows: list[TrajectoryRow] = []
        self.problem: str | None = None
        if path.is_dir():
            self.trajectories = _trajectory_index([path / "trajectories.jsonl"])
        elif json_lines(path):
            self.trajectories = _trajectory_index([path])
        else:  # one JSON document: a trajectory dict or a list of them, read whole when it changes
            self._whole = _CachedJson(path)

    def refresh(self) -> None:
        if self._whole is None:
            return super().refresh()
        before = self._whole.mtime
        value = self._whole.get()
        if self._whole.mtime == before and self._rows:
            return
        items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
        self._records = [x for x in items if isinstance(x, dict)]
        self.problem = self._whole.problem
        if value is not None and len(self._records) != len(items):
            self.problem = (
                f"{self.path}: {len(items) - len(self._records)} entries are not JSON objects (skipped)"
            )
        self._rows = [row_of(i, r) for i, r in enumerate(self._records)]

    def trajectory_rows(self) -> list[TrajectoryRow]:
        return self._rows if self._whole is not None else super().trajectory_rows()

    @property
    def browsable(self) -> bool:
        return True

    def counts(self) -> dict[str, int]:
        return {"trajectories": len(self.trajectory_rows())}

    def bad_lines(self) -> tuple[int, list[str]]:
        if self._whole is not None:
            return (1, [self.problem]) if self.problem else (0, [])
        return super().bad_lines()

    def open_trajectory(self, i: int) -> dict[str, Any]:
        return self._records[i] if self._whole is not None else super().open_trajectory(i)

    def data_mtime(self) -> float | None:
        return self._whole.mtime if self._whole is not None else super().data_mtime()


@dataclass(slots=True)
class SynthRow:
    """A synthesised question in the list (the full record is read when its page is shown)."""

    index: int
    question: str
    answer: str
    verified: bool | None
    statements: int
    edits: int  # kept edits, as `asearch.synth` counts them: not the base QA, not rejected proposals


def answer_list(x: Any) -> list[str]:
    """The answers of a record as strings: `asearch synth` writes a list (canonical first), plain QA files a string."""
    if x is None or x == "":
        return []
    items = x if isinstance(x, list) else [x]
    return [a if isinstance(a, str) else json.dumps(a, ensure_ascii=False) for a in items if a is not None]


def answer_text(x: Any) -> str:
    """The answers joined for display and text search ("architect | an architect"), not a JSON list."""
    return " | ".join(answer_list(x))


def synth_question(rec: dict[str, Any]) -> tuple[str, str]:
    """(question, answer text), flat or nested under `qa` (ASearcher's shape)."""
    qa = rec.get("qa") if isinstance(rec.get("qa"), dict) else {}
    q = rec.get("question", qa.get("question", ""))
    a = rec.get("answer", qa.get("answer", ""))
    return (q if isinstance(q, str) else json.dumps(q)), answer_text(a)


def kept_edits(history: Any) -> int:
    """Edits kept in an edit history (`SynthQuestion.to_row`'s `edits`): a proposal the gates rejected did
    not change the question, and the base QA is where editing starts. A step that does not say whether it
    was kept (another producer) counts as kept, since its question is then the one that was carried on."""
    if not isinstance(history, list):
        return 0
    return sum(
        1 for s in history if isinstance(s, dict) and s.get("kept") is not False and s.get("action") != "base"
    )


def _synth_row(i: int, rec: dict[str, Any]) -> SynthRow:
    q, a = synth_question(rec)
    v = rec.get("unique_verified")
    st = rec.get("statements")
    return SynthRow(
        index=i,
        question=q,
        answer=a,
        verified=v if isinstance(v, bool) else None,
        statements=len(st) if isinstance(st, list) else 0,
        edits=kept_edits(rec.get("edit_history")),
    )


class SynthRun(Run):
    kind: RunKind = "synth"
    # `asearch synth` writes questions.jsonl and its filter report together when an invocation ends (and
    # again on every resume), so no file tells a running synthesis from a finished one
    has_lifecycle = False

    def __init__(self, run_id: str, path: Path, name: str, files: list[Path]):
        super().__init__(run_id, path, name)
        self.files = files
        self.questions: LineIndex[SynthRow] = LineIndex(files, _synth_row)
        # what each gate rejected, written by `asearch synth` beside questions.jsonl
        self.report = _CachedJson((path if path.is_dir() else path.parent) / "filter_report.json")

    def refresh(self) -> None:
        self.questions.refresh()

    def data_mtime(self) -> float | None:
        return self.questions.mtime

    def counts(self) -> dict[str, int]:
        rows = self.questions.rows
        return {"questions": len(rows), "verified": sum(1 for r in rows if r.verified)}

    def bad_lines(self) -> tuple[int, list[str]]:
        return self.questions.bad_lines, self.questions.problems

    def read(self, i: int) -> dict[str, Any]:
        return self.questions.read(i)


class DemoRun(Run):
    """`asearch demo` output: its summary, plot and report; its RL run (rl/) is listed as a train run."""

    kind: RunKind = "demo"

    def __init__(self, run_id: str, path: Path, name: str):
        super().__init__(run_id, path, name)
        self.summary = _CachedJson(path / "summary.json")
        self.report = _CachedJson(path / "report.md", parse=False)
        self.heldout = {when: _CachedRows(path / name) for when, name in HELDOUT_ROWS.items()}

    def horizon(self) -> dict[str, dict[str, Any] | None] | None:
        """{"before": stats | None, "after": stats} (`horizon_stats`) of the held-out episode rows;
        None when there are no rows after RL."""
        stats = {when: rows.get() for when, rows in self.heldout.items()}
        if not stats["after"]:
            return None
        return {when: horizon_stats(rows) if rows else None for when, rows in stats.items()}

    def refresh(self) -> None:
        for rows in self.heldout.values():
            rows.get()

    def bad_lines(self) -> tuple[int, list[str]]:
        problems = [p for p in (c.problem for c in self.heldout.values()) if p]
        return len(problems), problems

    def data_mtime(self) -> float | None:
        ms = [m for m in (_mtime(self.path / "rl" / "metrics.jsonl"), self.summary.mtime) if m is not None]
        return max(ms) if ms else None

    def finished(self) -> bool:
        self.summary.get()
        return self.summary.mtime is not None


# --------------------------------------------------------------------------- discovery


def _first_line_record(path: Path) -> dict[str, Any] | None:
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                obj = json.loads(raw)
                return obj if isinstance(obj, dict) else None
    return None


def json_lines(path: Path) -> bool:
    """Whether `path` holds one JSON object per line: a .jsonl, or a .json that `asearch ask --json`
    was appended to several times (the whole does not parse, its first line does)."""
    if path.suffix == ".jsonl":
        return True
    try:
        json.loads(path.read_bytes())
        return False
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        try:
            return _first_line_record(path) is not None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return False


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first JSON object of a .jsonl (first line) or .json file; None when it has none (yet)."""
    try:
        if path.suffix == ".json" and path.stat().st_size > 64 << 20:  # a huge .json is no trajectory file
            return None
        if json_lines(path):
            return _first_line_record(path)
        obj = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        if isinstance(obj, list) and obj and isinstance(obj[0], dict):
            return obj[0]
        return obj if isinstance(obj, dict) else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _looks_like_trajectory(rec: dict[str, Any]) -> bool:
    traj, _ = split_record(rec)
    return isinstance(traj.get("turns"), list) and "question" in traj


def _looks_like_synth(rec: dict[str, Any], *, given: bool) -> bool:
    if any(k in rec for k in SYNTH_KEYS):
        return True
    # a file named on the command line may be plain questions (question + answer): show them too
    return given and ("question" in rec or "qa" in rec) and "turns" not in rec


def detect(path: Path, *, given: bool = False) -> list[tuple[RunKind, Path, list[Path]]]:
    """The runs that `path` itself is: [(kind, path, files)]; empty when it is none (then search below it).

    `given`: the path was named on the command line, so a .jsonl of plain questions counts as synth output.
    """
    if path.is_file():
        if path.name == "results.jsonl":
            return [("eval", path.parent, [])]
        if path.name == "metrics.jsonl":
            return [("train", path.parent, [])]
        if path.suffix not in (".json", ".jsonl"):
            return []
        rec = _first_record(path)
        if rec is None:
            return []
        if _looks_like_trajectory(rec):
            return [("trajectories", path, [])]
        if path.suffix == ".jsonl" and _looks_like_synth(rec, given=given):
            return [("synth", path, [path])]
        return []
    if not path.is_dir():
        return []
    if (path / "results.jsonl").is_file():
        return [("eval", path, [])]
    if (path / "metrics.jsonl").is_file():
        return [("train", path, [])]
    rl = path / "rl"
    if (rl / "metrics.jsonl").is_file() and any(
        (path / n).exists() for n in ("summary.json", "curve.png", "report.md", "model-sft")
    ):
        return [("demo", path, []), ("train", rl, [])]
    if (path / "trajectories.jsonl").is_file():
        return [("trajectories", path, [])]
    return []


def _search(path: Path, depth: int, *, given: bool = False) -> list[tuple[RunKind, Path, list[Path]]]:
    """Runs at or below `path`: a run directory, else the synth/trajectory files in it and the runs below."""
    found = detect(path, given=given)
    if found or not path.is_dir():
        return found
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return []
    synth: list[Path] = []
    for f in entries:
        if f.suffix in (".json", ".jsonl") and f.is_file() and not f.name.startswith("."):
            for kind, p, files in detect(f):
                if kind == "synth":
                    synth += files
                else:
                    found.append((kind, p, files))
    if synth:  # the question files of one directory are one synth run
        found.insert(0, ("synth", path, synth))
    if depth > 0:
        for child in entries:
            if child.is_dir() and not (
                child.name.startswith(".") or child.name in _SKIP_DIRS or child.name.startswith("model-")
            ):
                found += _search(child, depth - 1)
    return found


class Catalog:
    """The runs under the given paths, searched again every few seconds so new runs appear.

    All reads go through `lock`: the web server calls in from several threads.
    """

    def __init__(self, paths: Iterable[str | Path]):
        self.roots = [Path(p) for p in paths]
        missing = [str(p) for p in self.roots if not p.exists()]
        if missing:
            raise AsearchError(f"no such file or directory: {', '.join(missing)}")
        if not self.roots:
            raise AsearchError("give at least one run directory or trajectory file")
        self.lock = threading.RLock()
        self.runs: dict[str, Run] = {}
        self._by_path: dict[tuple[str, Path], Run] = {}
        self._searched_at = -math.inf
        self.empty_roots: list[Path] = []
        self.refresh(force=True)

    def _name(self, root: Path, path: Path) -> str:
        """The path below its root (the root's own name when it is the run); roots prefix it when several."""
        base = root.resolve().name or str(root)
        try:
            rel = str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            rel = path.name
        if rel == ".":
            return base
        return f"{base}/{rel}" if len(self.roots) > 1 else rel

    def _new_id(self, name: str) -> str:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"
        rid, n = slug, 2
        while rid in self.runs:
            rid, n = f"{slug}-{n}", n + 1
        return rid

    def refresh(self, *, force: bool = False) -> None:
        """Search the paths for runs not seen yet (at most every couple of seconds unless forced)."""
        with self.lock:
            now = time.monotonic()
            if not force and now - self._searched_at < _REDISCOVER_S:
                return
            self._searched_at = now
            self.empty_roots = []
            for root in self.roots:
                found = _search(root, _SEARCH_DEPTH, given=True)
                if not found:
                    self.empty_roots.append(root)
                for kind, path, files in found:
                    key = (kind, path.resolve())
                    if key in self._by_path:
                        continue
                    name = self._name(root, path)
                    run = self._make(kind, self._new_id(name), path, name, files)
                    self._by_path[key] = run
                    self.runs[run.id] = run

    @staticmethod
    def _make(kind: RunKind, rid: str, path: Path, name: str, files: list[Path]) -> Run:
        if kind == "train":
            return TrainRun(rid, path, name)
        if kind == "eval":
            return EvalRun(rid, path, name)
        if kind == "demo":
            return DemoRun(rid, path, name)
        if kind == "synth":
            return SynthRun(rid, path, name, files)
        return TrajectoryRun(rid, path, name)

    def get(self, run_id: str) -> Run:
        with self.lock:
            run = self.runs.get(run_id)
            if run is None:
                raise KeyError(run_id)
            run.refresh()
            return run

    def of_kind(self, *kinds: RunKind) -> list[Run]:
        with self.lock:
            return [r for r in self.runs.values() if r.kind in kinds]

    def all(self) -> list[Run]:
        """Every run, each refreshed."""
        with self.lock:
            self.refresh()
            for run in self.runs.values():
                run.refresh()
            return list(self.runs.values())
