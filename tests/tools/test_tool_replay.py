"""Replayable runs (`tools.record`): an eval against a real loopback retrieval server is recorded, the server is
shut down, and the replay gives the same per-question results with no call out; a replay of other questions
counts its misses and refuses them (masked as infrastructure faults). Then the record store itself: whole
entries under kills, damaged entries refused, concurrent writers keeping the first answer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from asearch.errors import ConfigError
from asearch.tools import ToolRecord, ToolsConfig, build_tools, record_metrics, run_tool
from asearch.tools.replay import RECORD_DIR, RecordDamaged, record_dir_of

WORLD = "world:seed=1,entities=200"
LONG_PAGES = {"seed": 1, "n_entities": 200, "pages": "long"}  # pages read chunk by chunk with `access`

# --------------------------------------------------------------------------- helpers


async def _close(closers: list[Any]) -> None:
    for close in closers:
        if asyncio.iscoroutine(result := close()):
            await result


def _comparable(value: Any, drop: tuple[str, ...] = ()) -> Any:
    """A result line without what a rerun may change on its own: wall-clock times (and the keys `drop`)."""
    if isinstance(value, dict):
        return {
            k: _comparable(v, drop)
            for k, v in value.items()
            if not k.endswith(("latency_s", "wall_s")) and k not in drop
        }
    if isinstance(value, list):
        return [_comparable(v, drop) for v in value]
    return value


def _by_question(run_dir: Path, drop: tuple[str, ...] = ()) -> dict[tuple[str, int], dict[str, Any]]:
    from asearch.eval.runner import read_results

    return {
        (r["id"], r["pass"]): _comparable(r, drop)
        for r in read_results(run_dir / "results.jsonl", keep_trajectory=True)
    }


@pytest.fixture
def world_server():
    """A real retrieval server (uvicorn on loopback) over a long-page world's BM25 index: (url, its stats, stop())."""
    from asearch.corpus.world import WorldCorpus
    from asearch.retrieval.index import IndexConfig
    from asearch.retrieval.server import app_from_index, serve_in_thread
    from asearch.tools.build import ensure_index

    app, _ = app_from_index(ensure_index(WorldCorpus(**LONG_PAGES).name, IndexConfig(), progress=False))
    serving = serve_in_thread(app)
    url = serving.__enter__()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            serving.__exit__(None, None, None)  # uvicorn exits and its thread is joined

    yield url, app.state.stats, stop
    stop()


def _refuses_connections(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def _long_records(n: int) -> list[Any]:
    from asearch.demo.worlds import world_records

    return world_records(1, 200, n, (1, 2), "w", pages="long", name_answers=True)


@pytest.fixture(scope="module")
def long_tok(make_tokenizer):
    """A tokenizer that knows the long world's pages (what the tools answer and the expert reads)."""
    from asearch.corpus.world import WorldCorpus

    return make_tokenizer([p.contents for p in WorldCorpus(**LONG_PAGES).pages()], vocab_size=600)


def _expert_eval(tok, records, tools_cfg: dict, out: Path, record_dir: Path | None, k: int = 2):
    """An eval of the reading expert of the demo's long preset (search, open the result, read it chunk by chunk,
    summarise, go on) with the preset's tools over the source `tools_cfg` names."""
    from asearch.agent.loop import AgentConfig
    from asearch.demo.presets import PRESETS
    from asearch.demo.worlds import ExpertMistakes, expert_engine
    from asearch.eval.runner import agent_solver, evaluate_async

    long = PRESETS["long"]["rl"]
    # mistakes on: what it opens, reads and answers depends on what the tools answered
    engine = expert_engine(
        tok, records, ExpertMistakes(p_skip=0.3, reading=True, p_stop=0.2, p_distract=0.3), seed=3
    )
    agent = AgentConfig.model_validate(
        {**long["agent"], "max_turns": 24, "max_new_tokens": 128, "max_context_tokens": 8192}
    )
    tools_cfg = {**long["tools"], **tools_cfg}
    tools, closers = build_tools(ToolsConfig.model_validate(tools_cfg), progress=False, record_dir=record_dir)

    async def main():
        try:
            solve = agent_solver(engine, tok, tools, agent)
            return await evaluate_async(solve, records, out_dir=out, k=k, progress=False, concurrency=8)
        finally:
            await _close(closers)

    return asyncio.run(main())


# --------------------------------------------------------------------------- record an eval, replay it


def test_a_replayed_eval_gives_the_same_results_with_the_server_down(world_server, long_tok, tmp_path) -> None:
    url, stats, stop = world_server
    records = _long_records(12)
    recorded = _expert_eval(
        long_tok, records, {"server_url": url, "corpus": None}, tmp_path / "a", tmp_path / "a" / RECORD_DIR
    )
    sent = {path: e.requests for path, e in stats.report({}).endpoints.items()}
    run = recorded.summary["run_metrics"]
    assert recorded.failed == 0 and run["record/answers/search"] > 0 and run["record/answers/access"] > 0
    manifest = json.loads((tmp_path / "a" / RECORD_DIR / "manifest.json").read_text())
    assert manifest["sources"] == [f"server {url}"]
    assert manifest["entries"] == {"search": run["record/new/search"], "access": run["record/new/access"]}
    # what the server was asked is what was recorded: one request per tool call (the tools ask one at a time)
    assert (
        sent["/retrieve"] == run["record/answers/search"] and sent["/access"] == run["record/answers/access"]
    )

    stop()
    # a replay that called out would meet a refused connection (a `remote` fault, in infra_faults)
    assert _refuses_connections(url)
    replayed = _expert_eval(long_tok, records, {"record": {"replay": str(tmp_path / "a")}}, tmp_path / "b", None)
    again = replayed.summary["run_metrics"]
    assert again["replay/misses"] == 0 and again["replay/damaged"] == 0
    assert again["replay/hits"] == run["record/answers"]  # every call the recorded run made, answered again
    first, second = _by_question(tmp_path / "a"), _by_question(tmp_path / "b")
    assert len(first) == 24 and second == first  # answers, scores, counters, every token and observation
    assert not any(r["infra_faults"] for r in second.values())
    assert recorded.overall["metrics"] == replayed.overall["metrics"]
    assert "Replayed tools (this invocation): " in (tmp_path / "b" / "summary.md").read_text()

    # other questions: the record has no answer to their searches; each miss is refused and counted, and
    # the episodes that met one are masked, not scored as the model's failures
    other = _long_records(24)[12:]
    missed = _expert_eval(long_tok, other, {"record": {"replay": str(tmp_path / "a")}}, tmp_path / "c", None, k=1)
    m = missed.summary["run_metrics"]
    faulted = [r for r in _by_question(tmp_path / "c").values() if r["infra_faults"]]
    assert m["replay/misses/search"] > 0 and m["replay/misses"] == sum(
        r["infra_faults"]["replay_miss"] for r in faulted
    )
    assert missed.overall["masked"]["episodes_by_kind"] == {"replay_miss": len(faulted)}
    md = (tmp_path / "c" / "summary.md").read_text()
    assert f"{int(m['replay/misses'])} misses refused (search {int(m['replay/misses/search'])}" in md
    print(f"recorded {int(run['record/answers'])} answers ({manifest['bytes']:,} bytes in {sum(manifest['entries'].values())} "
          f"entries; results.jsonl {(tmp_path / 'a' / 'results.jsonl').stat().st_size:,} bytes); replay of other "
          f"questions: {int(m['replay/misses'])} misses, {len(faulted)}/{len(other)} masked")  # fmt: skip


def test_eval_and_ask_replay_from_the_command_line(
    world_server, tiny_world_model_dir, tmp_path, monkeypatch
) -> None:
    """`--replay RUN_DIR` through the CLI (in-process): eval records into RUN_DIR/tool-record, a replayed eval
    and ask are answered from it with the server down; ask records into the shared record of its source."""
    from typer.testing import CliRunner

    from asearch.cli.app import app

    monkeypatch.setenv("ASEARCH_CACHE", str(tmp_path / "cache"))
    url, _, stop = world_server
    script = '["<search> The Jadorn Letters</search>", "<answer> Vantern</answer>"]'
    engine = ["engine.kind=scripted", f"engine.model={tiny_world_model_dir}", f"engine.replies={script}",
              "agent.style=search-r1", "tools.access=null"]  # fmt: skip
    evaluate = ["eval", "-d", "world:seed=1,entities=200,n=3,hops=1", "--no-progress", *engine]
    cli = CliRunner()
    done = cli.invoke(
        app, [*evaluate, "--out", str(tmp_path / "a"), f"tools.server_url={url}", "tools.corpus=null"]
    )
    assert done.exit_code == 0, done.output
    assert "Recorded tools (this invocation): 3 answers, 1 new entries" in done.output
    # --aggregate-only calls no tool: the counters it shows are the evaluating run's, and it says so
    agg = cli.invoke(app, ["eval", "--aggregate-only", "--out", str(tmp_path / "a")])
    assert agg.exit_code == 0, agg.output
    assert "Recorded tools (the last evaluation run): 3 answers" in agg.output
    assert "(this invocation)" not in agg.output + (tmp_path / "a" / "summary.md").read_text()
    asked = cli.invoke(app, ["ask", "Who?", "--json", "--server-url", url, *engine])
    assert asked.exit_code == 0, asked.output
    shared = tmp_path / "cache" / RECORD_DIR
    assert [p.name for p in shared.iterdir()] == [f"server-http-127.0.0.1-{url.rsplit(':', 1)[1]}"]
    stop()

    replayed = cli.invoke(app, [*evaluate, "--out", str(tmp_path / "b"), "--replay", str(tmp_path / "a")])
    assert replayed.exit_code == 0, replayed.output
    assert "Replayed tools (this invocation): 3 answers from the record, 0 misses refused" in replayed.output
    assert _by_question(tmp_path / "b") == _by_question(tmp_path / "a")
    again = cli.invoke(app, ["ask", "Who?", "--json", "--replay", str(tmp_path / "a"), *engine])
    assert again.exit_code == 0, again.output
    turns = [json.loads(out.output)["turns"][0]["observation"] for out in (asked, again)]
    assert turns[0] == turns[1] and "Jadorn" in turns[0]


@pytest.mark.slow  # two `asearch eval` processes that load torch and a model: ~20 s
def test_asearch_eval_replay_of_a_sampling_model_is_identical(
    world_server, tiny_world_model_dir, tmp_path
) -> None:
    """The real command, a real (tiny, random) model sampling at temperature 1 with the eval's seeds: its
    queries are whatever it samples, so an identical replay needs the same seeds and the same answers."""
    from asearch.eval.runner import read_results

    url, stats, stop = world_server
    common = ["--dataset", "world:seed=1,entities=200,n=6,hops=1-2", "--seeds", "3,4", "--no-progress",
              f"engine.model={tiny_world_model_dir}", "agent.style=guided", "agent.temperature=1.0",
              "agent.max_turns=3", "engine.max_seq_len=512", "agent.max_context_tokens=512"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "asearch", "eval", *common, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done

    run("--out", str(tmp_path / "a"), f"tools.server_url={url}", "tools.corpus=null", "tools.access=null")
    searched = stats.report({}).endpoints["/retrieve"].requests
    stop()
    assert _refuses_connections(url) and searched > 0
    done = run("--out", str(tmp_path / "b"), "--replay", str(tmp_path / "a"), "tools.access=null")
    # sampled tokens, observations, scores; log-probs only up to float noise: the engine batches concurrent
    # episodes, and a batch's makeup (which decides the last bits of a log-prob) follows timing
    first, second = _by_question(tmp_path / "a", ("logprobs",)), _by_question(tmp_path / "b", ("logprobs",))
    assert len(first) == 12 and second == first
    logprobs = [
        {
            (r["id"], r["pass"]): [lp for s in r["trajectory"]["segments"] for lp in s["logprobs"]]
            for r in lines
        }
        for lines in (
            read_results(tmp_path / run / "results.jsonl", keep_trajectory=True) for run in ("a", "b")
        )
    ]
    for key, recorded in logprobs[0].items():
        assert logprobs[1][key] == pytest.approx(recorded, abs=1e-4)
    assert {r["counters"].get("searches", 0) for r in first.values()} != {0}
    assert (
        f"Replayed tools (this invocation): {searched} answers from the record, 0 misses refused"
        in done.stdout
    )
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["run_metrics"]["replay/hits"] == searched


def test_replay_refuses_a_directory_without_a_record(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match=r"holds no tool record .*tools.record=false"):
        build_tools(ToolsConfig.model_validate({"record": {"replay": str(tmp_path / "run")}}), progress=False)
    off = ToolsConfig.model_validate({"record": False, "corpus": WORLD})
    tools, closers = build_tools(off, progress=False, record_dir=tmp_path / "rec")
    assert not (tmp_path / "rec").exists() and record_metrics(tools) == {}
    asyncio.run(_close(closers))


def test_a_recorded_refusal_is_replayed_as_the_same_error(tmp_path) -> None:
    """A backend's own ToolError is an answer to the request (a refused url): replayed, not a miss."""
    from asearch.errors import ToolError
    from asearch.tools import AccessTool, SearchTool, ToolSources
    from asearch.tools.replay import record_sources

    class Refusing:
        async def access(self, urls):
            raise ToolError(f"refused: {urls[0]} is a private address")

        async def search(self, queries, topk):
            raise ToolError("unreachable")

    store = ToolRecord(tmp_path)
    sources, _ = record_sources(ToolSources(search=Refusing(), pages=Refusing()), store, source="test")
    first = asyncio.run(run_tool(AccessTool(sources.pages), "http://10.0.0.1/"))
    replay, _ = record_sources(None, store)
    again = asyncio.run(run_tool(AccessTool(replay.pages), "http://10.0.0.1/"))
    assert first.text == again.text == "access failed: refused: http://10.0.0.1/ is a private address"
    assert again.metadata["error"] == "tool" and again.metadata["fault"] == "model"
    miss = asyncio.run(run_tool(SearchTool(replay.search), "anything"))
    assert miss.metadata["error"] == "replay_miss" and miss.metadata["fault"] == "infrastructure"


# --------------------------------------------------------------------------- the store

HITS = [{"id": "d1#0", "title": "D1", "text": "text", "url": "https://x.example/D1", "score": 1.25}]


def test_entries_round_trip_and_keys_are_exact_requests(tmp_path) -> None:
    store, paris = ToolRecord(tmp_path), {"query": "Paris", "topk": 5}
    outcome, digest = store.write("search", paris, HITS, None)
    assert outcome == "new" and store.read("search", paris)["digest"] == digest
    assert store.write("search", paris, HITS, None) == ("same", digest)
    assert store.write("search", paris, [], None) == ("changed", digest)  # the first answer stays
    assert store.read("search", paris)["answer"] == HITS
    for other in ({"query": "paris", "topk": 5}, {"query": "Paris", "topk": 3}):
        assert store.read("search", other) is None
    assert store.read("access", {"query": "Paris", "topk": 5}) is None
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    with pytest.raises(ConfigError, match="holds no tool record"):
        record_dir_of(tmp_path)  # entries without a manifest: not a record that was opened as one
    store.write_manifest("test")
    assert record_dir_of(tmp_path) == tmp_path
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RECORD_DIR).symlink_to(tmp_path)
    assert record_dir_of(tmp_path / "run") == tmp_path / "run" / RECORD_DIR  # a run dir names its own


def test_a_damaged_entry_is_refused_counted_and_rewritten_by_a_recording(tmp_path) -> None:
    from asearch.tools import AccessTool, SearchTool
    from asearch.tools.replay import record_sources

    store = ToolRecord(tmp_path)
    requests = [{"query": f"q{i}", "topk": 5} for i in range(3)]
    for r in requests:
        store.write("search", r, HITS, None)
    paths = [store.entry_path("search", store.key("search", r)) for r in requests]
    paths[0].write_bytes(paths[0].read_bytes()[:40])  # cut short
    paths[1].write_text(paths[1].read_text().replace("text", "TEXT"))  # edited: its digest no longer fits
    elsewhere = {**json.loads(paths[1].read_text()), "request": {"query": "q9", "topk": 5}}
    paths[2].write_text(json.dumps(elsewhere))  # not its request
    for r, why in zip(requests, ("not a whole entry", "digest", "another request"), strict=True):
        with pytest.raises(RecordDamaged, match=why):
            store.read("search", r)

    store.write_manifest("test")
    replay, _ = record_sources(None, store)
    obs = asyncio.run(run_tool(SearchTool(replay.search), "q1"))
    assert obs.metadata["error"] == "replay_miss" and "is damaged" in obs.text and str(paths[1]) in obs.text
    tools = {"search": SearchTool(replay.search), "access": AccessTool(replay.pages)}
    assert record_metrics(tools)["replay/damaged/search"] == 1 and record_metrics(tools)["replay/hits"] == 0
    assert store.write("search", requests[1], HITS, None)[0] == "new"  # a recording repairs it
    assert store.read("search", requests[1])["answer"] == HITS


_KILL_WRITER = """
import sys
from asearch.tools.replay import ToolRecord
store = ToolRecord(sys.argv[1])
page = {"url": "u", "title": "t", "contents": "x" * 2_000_000}
for i in range(10_000):
    store.write("access", {"url": f"https://x.example/{i}"}, page, None)
    print(i, flush=True)
"""


def test_a_writer_killed_mid_write_leaves_only_whole_entries(tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for _ in range(5):
        proc.stdout.readline()  # five entries written; the sixth is under way
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = ToolRecord(tmp_path)
    entries = list(tmp_path.glob("access/*/*.json"))
    assert len(entries) >= 5
    for i in range(len(entries) + 5):
        found = store.read("access", {"url": f"https://x.example/{i}"})  # raises RecordDamaged if torn
        assert found is None or len(found["answer"]["contents"]) == 2_000_000
    assert store.write_manifest("test")["entries"] == {
        "access": len(entries)
    }  # leftover temp files not counted


def _write_many(root: str, writer: int, keys: int) -> list[str]:
    store = ToolRecord(root)
    return [store.write("search", {"query": f"q{i}", "topk": 5}, [{**HITS[0], "text": f"writer {writer}"}], None)[0]
            for i in range(keys)]  # fmt: skip


def test_concurrent_writers_keep_one_whole_first_answer_per_request(tmp_path) -> None:
    writers, keys = 4, 60
    with ProcessPoolExecutor(writers) as pool:
        outcomes = list(pool.map(_write_many, [str(tmp_path)] * writers, range(writers), [keys] * writers))
    store = ToolRecord(tmp_path)
    for i in range(keys):
        column = [outcomes[w][i] for w in range(writers)]
        assert column.count("new") == 1, column  # exactly one writer put it there; the others found it
        winner = column.index("new")
        assert store.read("search", {"query": f"q{i}", "topk": 5})["answer"][0]["text"] == f"writer {winner}"
        assert set(column) - {"new"} <= {"changed"}  # each other writer's answer differed from the kept one
    assert store.counts() == ({"search": keys}, store.counts()[1])
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_concurrent_episodes_in_one_process_record_each_request_once(tmp_path) -> None:
    tools, closers = build_tools(
        ToolsConfig.model_validate({"corpus": WORLD}), progress=False, record_dir=tmp_path
    )

    async def main():
        try:
            return await asyncio.gather(*(run_tool(tools["search"], f"Gullind {i % 5}") for i in range(40)))
        finally:
            await _close(closers)

    start = time.perf_counter()
    observations = asyncio.run(main())
    assert all(o.ok for o in observations)
    m = record_metrics(tools)
    assert m["record/answers"] == 40 and m["record/new"] == 5 and m["record/changed"] == 0
    assert json.loads((tmp_path / "manifest.json").read_text())["entries"] == {"search": 5}
    print(f"40 concurrent searches recorded in {time.perf_counter() - start:.2f} s")
