"""The eval runner: hand-computed summaries, resume after kill -9 and torn writes, shards, judge, failures."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killable_eval import make_records, make_solve

from asearch.errors import AsearchError, ConfigError, DataFormatError
from asearch.eval.runner import aggregate_only, evaluate, parse_shard, read_results, shard_records
from asearch.metrics.judge import JudgeVerdict

HELPER = Path(__file__).with_name("killable_eval.py")


def without_timing(summary: dict) -> dict:
    """summary.json minus wall-clock numbers, which differ between any two runs."""
    s = json.loads(json.dumps(summary))
    for group in [*s["datasets"].values(), s["overall"]]:
        group.pop("timing", None)
    return s


def keys(out: Path) -> list[tuple[str, str, int]]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return [(r["dataset"], r["id"], r["pass"]) for r in map(json.loads, lines)]


def test_summary_numbers_match_hand_computation(tmp_path):
    # 40 questions, 8 per class (see killable_eval), k = 2 with seeds 0 and 1:
    #   EM per question: wrong 0, seed-dependent 1/2, "wordI maybe" 0, no answer 0, right 1
    #   Avg@2 EM = (8*0.5 + 8*1)/40 = 0.3;  Pass@2 EM = (8 + 8)/40 = 0.4
    #   F1 of "wordI maybe" = 2*(1/2)*1/(1/2+1) = 2/3: Avg@2 F1 = (4 + 8*2/3 + 8)/40; Pass@2 = (8 + 8*2/3 + 8)/40
    #   CEM: Avg@2 = (4 + 8 + 8)/40 = 0.5; Pass@2 = 24/40 = 0.6
    #   turns: 32 runs x 1 turn + 8 x 3 turns (max_turns) over 40 runs per pass -> 1.4; parse errors 24/40 = 0.6
    s = evaluate(make_solve(), make_records(40), out_dir=tmp_path, k=2, concurrency=8, progress=False)
    assert (s.written, s.resumed, s.failed, s.k) == (80, 0, 0, 2)
    m = s.datasets["codes"]["metrics"]
    assert m["em"]["avg_at_k"]["mean"] == pytest.approx(0.3)
    assert m["em"]["pass_at_k"]["mean"] == pytest.approx(0.4)
    assert m["f1"]["avg_at_k"]["mean"] == pytest.approx((4 + 8 * 2 / 3 + 8) / 40)
    assert m["f1"]["pass_at_k"]["mean"] == pytest.approx((8 + 8 * 2 / 3 + 8) / 40)
    assert m["cem"]["avg_at_k"]["mean"] == pytest.approx(0.5)
    assert m["cem"]["pass_at_k"]["mean"] == pytest.approx(0.6)
    low, high = m["em"]["avg_at_k"]["low"], m["em"]["avg_at_k"]["high"]
    assert 0 < low < 0.3 < high < 1  # a real interval around the mean
    st = s.datasets["codes"]["stats"]
    assert st["turns"] == pytest.approx(1.4) and st["parse_errors"] == pytest.approx(0.6)
    assert st["no_answer_rate"] == pytest.approx(0.2) and st["finish"] == {"answer": 64, "max_turns": 16}
    assert s.datasets["codes"]["n"] == 40 and s.datasets["codes"]["judge"] is None
    assert s.metric("codes", "em") == pytest.approx(0.3)

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert without_timing(on_disk) == without_timing(s.summary)
    md = (tmp_path / "summary.md").read_text()
    assert "| codes | 40 | 30.0 [" in md and "EM Avg@2" in md
    line = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    assert {
        "id",
        "dataset",
        "pass",
        "seed",
        "prediction",
        "golds",
        "em",
        "f1",
        "cem",
        "judge",
        "counters",
        "wall_s",
    } <= set(line)
    assert line["trajectory"]["question"] == line["question"] and line["trajectory"]["segments"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["k"] == 2 and cfg["seeds"] == [0, 1] and cfg["datasets"] == {"codes": 40}
    # aggregate_only recomputes the same numbers from disk
    assert without_timing(aggregate_only(tmp_path).summary) == without_timing(
        {**s.summary, "other_results": 0}
    )


def test_two_datasets_get_their_own_and_a_pooled_summary(tmp_path):
    recs = make_records(10, dataset="a") + make_records(
        5, dataset="b"
    )  # same ids in both: keyed by dataset too
    s = evaluate(make_solve(), recs, out_dir=tmp_path, k=1, progress=False)
    assert set(s.datasets) == {"a", "b"} and s.overall["n"] == 15
    # seed 0: classes 1 and 4 right -> a: 4/10 EM, b (ids 0-4): 2/5, pooled 6/15
    assert s.metric("a", "em") == pytest.approx(0.4) and s.metric("b", "em") == pytest.approx(0.4)
    assert s.metric("*", "em") == pytest.approx(6 / 15)
    assert len(set(keys(tmp_path))) == 15


@pytest.mark.timeout(180)
def test_kill_9_mid_run_resumes_to_the_uninterrupted_result(tmp_path):
    def command(out: Path) -> list[str]:
        return [
            sys.executable,
            str(HELPER),
            str(out),
            "--n",
            "40",
            "--k",
            "2",
            "--sleep",
            "0.05",
            "--concurrency",
            "4",
        ]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = killed / "results.jsonl"
    deadline = time.monotonic() + 90
    while not (results.exists() and results.read_bytes().count(b"\n") >= 12):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the helper wrote nothing"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    lines_at_kill = results.read_bytes().count(b"\n")
    assert 12 <= lines_at_kill < 80  # really interrupted mid-run

    again = subprocess.run(command(killed), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    written, resumed = (int(x.split("=")[1]) for x in again.stdout.split()[:2])
    assert resumed == lines_at_kill and written == 80 - lines_at_kill  # nothing redone, nothing lost

    clean = tmp_path / "clean"
    assert subprocess.run(command(clean), capture_output=True, timeout=120).returncode == 0
    k = keys(killed)
    assert len(k) == 80 and len(set(k)) == 80
    assert sorted(k) == sorted(keys(clean))
    summary = json.loads((killed / "summary.json").read_text())
    assert without_timing(summary) == without_timing(json.loads((clean / "summary.json").read_text()))


@pytest.mark.parametrize(
    "torn",
    [
        b'{"v": 1, "id": "q0',
        b'{"id": "q039", "dataset": "codes", "pass": 1}',
        b'{"v": 1, "id": "q0{"id": "q039", "dataset": "codes", "pass": 1}\n',  # glued by an older resume
    ],
)
def test_torn_last_line_is_dropped_and_redone(tmp_path, torn):
    records = make_records(40)
    evaluate(make_solve(), records[:20], out_dir=tmp_path, k=2, progress=False)  # the first half
    results = tmp_path / "results.jsonl"
    with open(results, "ab") as f:
        f.write(torn)  # a write cut by a kill: no newline (the second one even parses as JSON)
    s = evaluate(make_solve(), records, out_dir=tmp_path, k=2, progress=False)
    assert (s.resumed, s.written) == (40, 40)
    k = keys(tmp_path)
    assert len(k) == 80 and len(set(k)) == 80
    assert results.read_bytes().endswith(b"\n")
    assert s.metric("codes", "em") == pytest.approx(0.3)


def test_a_torn_error_line_is_cut_before_the_next_failure_is_logged(tmp_path):
    good = make_solve()

    async def flaky(record, seed):
        if record.id in {"q003", "q007"}:
            raise RuntimeError(f"engine died on {record.id}")
        return await good(record, seed)

    evaluate(flaky, make_records(10), out_dir=tmp_path, k=1, progress=False)
    errors = tmp_path / "errors.jsonl"
    whole = errors.read_bytes()
    with open(errors, "ab") as f:
        f.write(b'{"id": "q007", "dataset": "codes", "error": "Runtime')  # a kill mid-write
    s = evaluate(flaky, make_records(10), out_dir=tmp_path, k=1, progress=False)
    assert (s.resumed, s.failed) == (8, 2)
    assert errors.read_bytes().startswith(whole)  # nothing whole was lost
    ids = [json.loads(line)["id"] for line in errors.read_text().splitlines()]  # every line parses
    assert sorted(ids) == ["q003", "q003", "q007", "q007"]


def test_corrupt_middle_line_is_an_error_not_a_silent_skip(tmp_path):
    evaluate(make_solve(), make_records(5), out_dir=tmp_path, k=1, progress=False)
    results = tmp_path / "results.jsonl"
    lines = results.read_text().splitlines()
    lines[2] = lines[2][:40]
    results.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match="not valid JSON") as e:
        evaluate(make_solve(), make_records(5), out_dir=tmp_path, k=1, progress=False)
    assert e.value.line == 3
    results.write_text("\n".join([lines[0], lines[1], lines[1]]) + "\n")
    with pytest.raises(DataFormatError, match="already scored at line 2"):
        read_results(results)


def test_more_passes_later_and_seed_or_config_changes(tmp_path):
    records = make_records(10)
    first = evaluate(make_solve(), records, out_dir=tmp_path, k=1, progress=False, config={"model": "A"})
    assert first.written == 10
    more = evaluate(make_solve(), records, out_dir=tmp_path, k=2, progress=False, config={"model": "A"})
    assert (more.resumed, more.written) == (10, 10)  # only the new pass ran
    with pytest.raises(ConfigError, match="seed 0, this run gives pass 0 seed 7"):
        evaluate(
            make_solve(), records, out_dir=tmp_path, k=2, seeds=[7, 8], progress=False, config={"model": "A"}
        )
    assert json.loads((tmp_path / "config.json").read_text())["seeds"] == [
        0,
        1,
    ]  # the refused run left it alone
    with pytest.raises(ConfigError, match=r"different configuration \(differs in: model\)"):
        evaluate(make_solve(), records, out_dir=tmp_path, k=2, progress=False, config={"model": "B"})
    # a subset of the questions: the others' lines stay on disk, outside this summary
    sub = evaluate(make_solve(), records[:4], out_dir=tmp_path, k=2, progress=False, config={"model": "A"})
    assert sub.written == 0 and sub.datasets["codes"]["n"] == 4 and sub.summary["other_results"] == 12


def test_recording_settings_do_not_stop_a_resume(tmp_path):
    """tools.record (record on/off, a shared dir, a replay) changes no result, so a run resumes across it."""
    records = make_records(6)
    tools = lambda record: {"runtime": {"tools": {"corpus": "x", "record": record}}}  # noqa: E731
    evaluate(make_solve(), records, out_dir=tmp_path, k=1, progress=False, config=tools({"enabled": True}))
    more = evaluate(make_solve(), records, out_dir=tmp_path, k=2, progress=False, config=tools({"enabled": False}))
    assert (more.resumed, more.written) == (6, 6)
    other = {"runtime": {"tools": {"corpus": "y", "record": {"enabled": False}}}}
    with pytest.raises(ConfigError, match=r"differs in: runtime.tools.corpus\)"):
        evaluate(make_solve(), records, out_dir=tmp_path, k=2, progress=False, config=other)


def test_shards_partition_the_questions_and_merge(tmp_path):
    records = make_records(40)
    parts = [shard_records(records, (i, 3)) for i in range(3)]
    assert sorted(r.id for p in parts for r in p) == sorted(r.id for r in records)
    assert (
        all(parts) and parts[1] == shard_records(list(reversed(records)), (1, 3))[::-1]
    )  # order-free choice
    for i in range(3):
        s = evaluate(make_solve(), records, out_dir=tmp_path, k=2, shard=(i, 3), progress=False)
        assert s.out_dir == tmp_path / f"shard-{i}-of-3" and s.written == 2 * len(parts[i])
    merged = aggregate_only(tmp_path)
    assert merged.datasets["codes"]["n"] == 40 and merged.k == 2
    whole = evaluate(make_solve(), records, out_dir=tmp_path / "whole", k=2, progress=False)
    assert without_timing(merged.summary)["datasets"] == without_timing(whole.summary)["datasets"]
    assert parse_shard("2/8") == (2, 8)
    for bad in ("8/8", "a/b", "1"):
        with pytest.raises(ConfigError):
            parse_shard(bad)


class ScriptedJudge:
    """Judges by the EM of the prediction, except that questions in `fail` get a failed verdict."""

    def __init__(self, fail: set[str]):
        self.fail = fail
        self.calls = 0

    async def judge(self, question, prediction, golds):
        self.calls += 1
        if any(f"item {i}?" in question for i in self.fail):
            return JudgeVerdict(correct=None, error="judge failed after 3 attempts", attempts=3)
        return JudgeVerdict(correct=prediction in golds, rationale="scripted", attempts=1)


def test_judge_verdicts_and_failures_are_reported(tmp_path):
    judge = ScriptedJudge(fail={"0", "4"})  # item 0 (always wrong) and item 4 (always right) fail to judge
    s = evaluate(make_solve(), make_records(10), out_dir=tmp_path, k=1, judge=judge, progress=False)
    j = s.datasets["codes"]["judge"]
    # judged: 8 questions; right on seed 0 and judged: items 1, 6 (class 1) and 9 (class 4) -> 3/8
    assert (j["judged"], j["failures"]) == (8, 2)
    assert j["accuracy"]["mean"] == pytest.approx(3 / 8) and j["accuracy"]["n"] == 8
    assert judge.calls == 10
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    failed = [x for x in lines if x["judge"]["correct"] is None]
    assert sorted(x["id"] for x in failed) == ["q000", "q004"] and all(x["judge"]["error"] for x in failed)
    assert "| 2 |" in (tmp_path / "summary.md").read_text()  # failures column


def test_failing_questions_are_logged_not_scored_and_retried(tmp_path):
    broken = {"q003", "q007"}
    good = make_solve()

    async def flaky(record, seed):
        if record.id in broken:
            raise RuntimeError(f"engine died on {record.id}")
        return await good(record, seed)

    s = evaluate(flaky, make_records(10), out_dir=tmp_path, k=1, progress=False)
    assert (s.written, s.failed) == (8, 2)
    assert s.datasets["codes"]["n"] == 8 and s.datasets["codes"]["expected"] == 10
    errors = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["id"] for e in errors) == sorted(broken) and "engine died" in errors[0]["error"]
    again = evaluate(good, make_records(10), out_dir=tmp_path, k=1, progress=False)
    assert (again.written, again.resumed, again.failed) == (2, 8, 0)

    async def always_broken(record, seed):
        raise RuntimeError("no engine")

    with pytest.raises(AsearchError, match="stopped after 3 failed"):
        evaluate(
            always_broken,
            make_records(20),
            out_dir=tmp_path / "b",
            progress=False,
            max_failures=3,
            concurrency=1,
        )
    assert len((tmp_path / "b" / "errors.jsonl").read_text().splitlines()) == 3


def test_one_writer_per_out_dir(tmp_path):
    from asearch.eval.runner import _exclusive

    with _exclusive(tmp_path), pytest.raises(AsearchError, match="in use by another eval run"):
        evaluate(make_solve(), make_records(2), out_dir=tmp_path, progress=False)


def test_bad_arguments():
    recs = make_records(3)
    with pytest.raises(ConfigError, match="one per pass"):
        evaluate(make_solve(), recs, out_dir="/nonexistent/x", k=2, seeds=[1], progress=False)
    with pytest.raises(ConfigError, match="more than once"):
        evaluate(make_solve(), recs + recs[:1], out_dir="/nonexistent/x", progress=False)


def test_evaluate_async_runs_inside_a_running_loop(tmp_path):
    from asearch.eval.runner import evaluate_async

    async def main():
        return await evaluate_async(make_solve(), make_records(5), out_dir=tmp_path, progress=False)

    assert asyncio.run(main()).written == 5


class _Workflow:
    """A rollout workflow whose episodes answer the record's id; it rejects the records marked `reject`."""

    def __init__(self):
        from collections import Counter

        self.rejected = Counter()

    async def arun_episode(self, engine, item, **ids):
        from asearch.agent.trajectory import Trajectory

        if item.metadata.get("reject"):
            self.rejected["abort"] += 1
            return None
        return Trajectory(id=ids.get("trajectory_id", item.id), question=item.question, style="x",
                          answer=item.id, finish="answer", score=float(item.golds[0] == item.id))  # fmt: skip


def _records(*rows):
    from asearch.eval.records import QARecord

    return [QARecord(id=i, question="q?", golds=[g], dataset="d", metadata=m) for i, g, m in rows]


def test_evaluate_workflow_is_the_mean_score_with_rejections_as_zero():
    from asearch.eval.runner import evaluate_workflow

    records = _records(("a", "a", {}), ("b", "x", {}), ("c", "c", {}), ("d", "d", {"reject": True}))
    scores = asyncio.run(evaluate_workflow(_Workflow(), None, records, concurrency=2))
    assert [t.answer if t else None for t in scores.trajectories] == ["a", "b", "c", None]  # the records' order
    assert scores.mean_score == pytest.approx(2 / 4)


def test_a_rejected_episode_is_a_failed_question_retried_by_the_next_run(tmp_path):
    from asearch.eval.runner import workflow_solver

    flow = _Workflow()
    records = _records(("a", "a", {}), ("d", "d", {"reject": True}))
    s = evaluate(workflow_solver(flow, None), records, out_dir=tmp_path, progress=False)
    assert (s.written, s.failed) == (1, 1) and keys(tmp_path) == [("d", "a", 0)]
    error = json.loads((tmp_path / "errors.jsonl").read_text())
    assert error["id"] == "d" and "rejected the episode" in error["error"] and "'abort': 1" in error["error"]
