"""The viewer's HTTP surface on a real uvicorn server: live metric polling, filters, escaping, guards."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from asearch.files import iter_jsonl, write_jsonl
from asearch.retrieval.server import serve_in_thread
from asearch.runs import RunDir
from asearch.view import ViewConfig, create_app
from asearch.view.pages import esc
from conftest import XSS

RL = "demo-seed0-rl"


@pytest.fixture(scope="module")
def served(runs_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("served") / "runs"
    shutil.copytree(runs_root, root)  # these tests append to the runs
    with serve_in_thread(create_app([root], ViewConfig(page_size=4))) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            yield client, root


def test_runs_pages_and_headers(served):
    client, root = served
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert {k: r["kind"] for k, r in runs.items()} == {
        "ask.json": "trajectories",
        "demo-seed0": "demo",
        RL: "train",
        "eval-mini": "eval",
        "synth": "synth",
    }
    assert runs["eval-mini"]["state"] == "finished" and runs["eval-mini"]["counts"]["trajectories"] == 10
    for path in ["/", "/trajectories", f"/trajectories?run={RL}&open=0", "/synth", "/static/viewer.js"]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/").text
    assert page.count('<figure class="chart"') >= 10 and f"&quot;id&quot;: &quot;{RL}&quot;" in page
    png = client.get("/file/demo-seed0/curve.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def test_metrics_are_polled_incrementally(served):
    client, root = served
    run = RunDir(root / "demo-seed0" / "rl", tensorboard=False)
    first = client.get("/api/metrics", params={"run": RL}).json()
    assert first["rows"] == run.metrics() and first["cursor"] == 7 and not first["reset"]
    gen = first["generation"]
    assert client.get("/api/metrics", params={"run": RL, "cursor": 7, "generation": gen}).json()["rows"] == []

    run.log(7, {"rollout/reward_mean": 0.9})
    run.log(8, {"rollout/reward_mean": 0.95})
    new = client.get("/api/metrics", params={"run": RL, "cursor": 7, "generation": gen}).json()
    assert [(r["step"], r["rollout/reward_mean"]) for r in new["rows"]] == [(7, 0.9), (8, 0.95)]
    assert new["cursor"] == 9

    path = root / "demo-seed0" / "rl" / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 9, "rollout/reward_me')  # torn: mid-write
    torn = client.get("/api/metrics", params={"run": RL, "cursor": 9, "generation": gen}).json()
    assert torn["rows"] == [] and torn["cursor"] == 9
    with open(path, "a") as f:
        f.write('an": 1.0}\n')
    done = client.get("/api/metrics", params={"run": RL, "cursor": 9, "generation": gen}).json()
    assert [r["step"] for r in done["rows"]] == [9]

    rows = run.metrics()[:3]
    write_jsonl(path, rows)  # replaced (e.g. a restarted run): the client is told to start over
    again = client.get("/api/metrics", params={"run": RL, "cursor": 10, "generation": gen}).json()
    assert again["reset"] and again["rows"] == rows and again["generation"] != gen
    info = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}[RL]
    assert info["counts"]["metric_rows"] == 3


def test_trajectory_filters(served):
    client, root = served
    results = [obj for _, obj in iter_jsonl(root / "eval-mini" / "results.jsonl")]

    def ids(**params):
        body = client.get("/api/trajectories", params={"run": "eval-mini", **params}).json()
        return sorted((r["id"], r["pass"]) for r in body["rows"])

    wrong = sorted((r["trajectory"]["id"], r["pass"]) for r in results if r["em"] < 1)
    assert ids(outcome="wrong") == wrong and len(wrong) == 3
    assert len(ids(outcome="correct")) == len(results) - 3
    assert ids(dataset="mini-b") == sorted(
        (r["trajectory"]["id"], r["pass"]) for r in results if r["dataset"] == "mini-b"
    )
    assert ids(min_turns="4") == [] and len(ids(min_turns="3", max_turns="3")) == len(results)
    assert ids(q="tomas") == sorted((r["trajectory"]["id"], r["pass"]) for r in results if r["id"] == "tomas")
    assert client.get("/api/trajectories", params={"run": "eval-mini", "outcome": "maybe"}).status_code == 400
    assert client.get("/api/trajectories", params={"run": "eval-mini", "min_turns": "x"}).status_code == 400
    # the html list pages through the matches, newest first
    page = client.get("/trajectories", params={"run": "eval-mini", "outcome": "correct", "page": 1}).text
    assert f"{len(results) - 3} of {len(results)} trajectories match" in page and "page 2 / 2" in page


def test_model_output_is_escaped_everywhere(served):
    client, _ = served
    page = client.get("/trajectories", params={"run": "ask.json", "open": 0}).text
    fragment = client.get("/fragment/trajectory", params={"run": "ask.json", "i": 0}).text
    for html in (page, fragment):
        assert XSS not in html and "<script>window" not in html and "<img src=x" not in html
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in html
    assert fragment.count('class="turn turn-') == 3  # search, read, answer
    record = client.get("/api/trajectory", params={"run": "ask.json", "i": 0}).json()["record"]
    assert record["answer"] == XSS  # JSON keeps the text as it is; only HTML escapes it
    assert isinstance(record["segments"][0]["token_ids"], int)  # token lists shrink to their lengths
    full = client.get("/api/trajectory", params={"run": "ask.json", "i": 0, "segments": 1}).json()["record"]
    assert len(full["segments"][0]["token_ids"]) == record["segments"][0]["token_ids"] > 0


def test_an_id_finds_its_trajectory_when_the_index_is_stale(served):
    client, root = served
    rows = client.get("/api/trajectories", params={"run": RL, "limit": 1000}).json()["rows"]
    target = rows[-1]
    r = client.get("/fragment/trajectory", params={"run": RL, "i": 0, "id": target["id"]})
    assert r.status_code == 200 and f'data-index="{target["index"]}"' in r.text
    assert client.get("/fragment/trajectory", params={"run": RL, "i": 0, "id": "nope"}).status_code == 404


def test_synthesis_page(served):
    client, root = served
    rows = [row for _, row in iter_jsonl(root / "synth" / "questions.jsonl")]
    page = client.get("/synth").text
    assert "8 of 8 questions shown (8 verified unique)" in page and "page 1 / 2" in page  # 4 a page
    first = rows[0]
    assert esc(first["question"]) in page and esc(first["statements"][0]["text"]) in page
    assert f'href="{esc(first["statements"][0]["url"])}"' in page and "unique ✓ verified" in page
    assert "<ins>" in page and "Edit history: " in page and "rejected by " in page
    assert "Filter report (filter_report.json)" in page and "Other fields" in page
    # the text filter searches the answers as text: "architect | an architect", not a JSON list
    multi = next(r for r in rows if len(r["answer"]) > 1)
    found = client.get("/synth", params={"q": f"{multi['answer'][0]} | {multi['answer'][1]}"}).text
    assert "1 of 8 questions shown" in found and esc(multi["question"]) in found
    assert "0 of 8" in client.get("/synth", params={"q": '["'}).text
    only = client.get("/synth", params={"verified": "1"}).text
    assert "8 of 8 questions shown" in only
    records = client.get("/api/synth", params={"run": "synth"}).json()
    assert records["total"] == 8 and records["records"] == rows


def test_eval_tables_show_the_summary_numbers(served):
    client, root = served
    summary = json.loads((root / "eval-mini" / "summary.json").read_text())
    page = client.get("/", params={"metric": "f1", "estimate": "pass_at_k"}).text
    for name in ("mini-a", "mini-b"):
        e = summary["datasets"][name]["metrics"]["f1"]["pass_at_k"]
        assert (
            f'{100 * e["mean"]:.1f} <span class="ci">[{100 * e["low"]:.1f}, {100 * e["high"]:.1f}]</span>'
            in page
        )
    assert "F1 Pass@k in %" in page
    assert client.get("/", params={"metric": "bleu"}).status_code == 400
    evals = client.get("/api/eval").json()["evals"]
    assert evals == [{"run": "eval-mini", "name": "eval-mini", "source": "summary.json", "summary": summary}]


def test_guards(served):
    client, _ = served
    assert client.get("/api/runs", headers={"Host": "evil.example"}).status_code == 421  # DNS rebinding
    assert client.get("/api/runs", headers={"Host": "localhost:1234"}).status_code == 200
    assert client.get("/file/demo-seed0/..%2Fsummary.json").status_code == 404
    assert client.get("/file/demo-seed0/summary.json").status_code == 404
    assert client.get("/static/..%2Fserver.py").status_code == 404
    assert client.get("/api/metrics", params={"run": "nope"}).status_code == 404
    assert client.get("/api/metrics", params={"run": "eval-mini"}).status_code == 400


def test_pages_with_nothing_of_their_kind(tmp_path):
    RunDir(tmp_path / "only-train", tensorboard=False).log(1, {"rollout/reward_mean": 0.5})
    with serve_in_thread(create_app([tmp_path / "only-train"])) as url:
        synth = httpx.get(url + "/synth")
        assert synth.status_code == 200 and "None of the runs is synthesis output." in synth.text
        trajectories = httpx.get(url + "/trajectories").text
        assert "0 of 0 trajectories match" in trajectories
        overview = httpx.get(url + "/").text
        assert 'id="curves"' in overview and 'id="evaluation"' not in overview
