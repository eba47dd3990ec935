"""`asearch eval` end to end through the real command: `--judge local` serves a judge model with `asearch engine
serve` (a real subprocess on loopback) for the run and stops it after; and the printed report of a merged file
breaks results down by `data_source`.

The agent is the `scripted` engine kind (it always answers Paris), so the judge sees real predictions. The
judge is a tiny Qwen2 built here whose layers add nothing and whose output layer maps each token to the next
one of `{"judgement": "correct"}`: a bigram model that greedily writes the rest of that verdict, then EOS,
whatever it is asked and wherever its reply starts (after the chat template, or after the verdict prefill a
local judge gets). So every verdict says correct, and disagrees with exact match where the answer is not Paris.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from asearch.cli.eval import app
from asearch.errors import ConfigError

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

VERDICT = '{"judgement": "correct"}'  # a local judge's reply starts as '{"judgement": "' for it
REPLY = "<think>sure</think><answer>Paris</answer>"  # the scripted agent's one reply
CAPITALS = [("fr", "Capital of France?", "Paris"), ("it", "Capital of Italy?", "Rome"),
            ("tx", "Capital of Texas?", "Austin"), ("lv", "Where is the Louvre?", "Paris")]  # fmt: skip

root = typer.Typer()
root.add_typer(app, name="eval")
runner = CliRunner()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted agent's tokenizer (and the judge's): every piece of VERDICT, REPLY and the chat template."""
    from asearch.models.tiny import train_word_tokenizer

    directory = tmp_path_factory.mktemp("judge") / "tokenizer"
    train_word_tokenizer([VERDICT, REPLY, "system\nx\nuser\ny\nassistant\n"]).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def judge_dir(tokenizer_dir: Path) -> Path:
    """A tiny model that answers every chat with VERDICT, then EOS."""
    from transformers import AutoTokenizer

    from asearch.models.tiny import build_tiny_model, save_tiny

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "y"}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False)  # fmt: skip
    chain = [prompt[-1], *tok.encode(VERDICT, add_special_tokens=False), tok.eos_token_id]
    model = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=32, tie=False)
    with torch.no_grad():
        for (
            layer
        ) in model.model.layers:  # attention and MLP add nothing: the last hidden state is the token's
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for slot, (token, successor) in enumerate(itertools.pairwise(chain)):
            model.model.embed_tokens.weight[token, slot] = 1.0
            model.lm_head.weight[successor, slot] = 10.0
    return save_tiny(model.eval(), tok, tokenizer_dir.parent / "bigram")


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from asearch.corpus.sources import open_corpus
    from asearch.retrieval.index import build_index

    root_dir = tmp_path_factory.mktemp("judge-index")
    corpus = root_dir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": c, "title": a, "text": f"{q} {a}", "url": f"https://c.test/{c}"}) + "\n"
                              for c, q, a in CAPITALS))  # fmt: skip
    return build_index(open_corpus(str(corpus)), root_dir / "idx", progress=False)


def agent_args(tokenizer_dir: Path, index_dir: Path) -> list[str]:
    return ["--no-progress", "engine.kind=scripted", f"engine.model={tokenizer_dir}", f"engine.replies={json.dumps([REPLY])}",
            f"tools.index={index_dir}", "agent.style=search-r1", "agent.max_turns=2"]  # fmt: skip


def test_the_printed_report_of_a_merged_file_has_a_row_per_source(tmp_path, tokenizer_dir, index_dir):
    rows = [{"id": f"test_{i}", "question": q, "golden_answers": [a], "data_source": source}
            for source in ("nq", "hotpotqa") for i, (_, q, a) in enumerate(CAPITALS[:2])]  # fmt: skip
    data = tmp_path / "merged" / "test.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), data)
    res = runner.invoke(
        root, ["eval", "-d", str(data), "--out", str(tmp_path / "out"), *agent_args(tokenizer_dir, index_dir)]
    )
    assert res.exit_code == 0, res.output
    printed = res.output[res.output.index("By `data_source`") :]
    assert (
        "| hotpotqa | 2 | 50.0" in printed
        and "| nq | 2 | 50.0" in printed
        and "| **all** | 4 | 50.0" in printed
    )


@pytest.mark.slow  # two model servers' worth of start-up on a shared 2-core box
def test_eval_with_a_local_judge_reports_its_agreement_with_exact_match(tmp_path, judge_dir, index_dir):
    from asearch.metrics.judge import JUDGE_PROMPT_VERSION

    data = tmp_path / "capitals.jsonl"
    data.write_text(
        "".join(json.dumps({"id": c, "question": q, "golden_answers": [a]}) + "\n" for c, q, a in CAPITALS)
    )
    out = tmp_path / "out"
    args = ["eval", "-d", str(data), "--out", str(out), "--judge", "local", "--judge-model", str(judge_dir),
            *agent_args(judge_dir, index_dir)]  # fmt: skip
    res = runner.invoke(root, args)
    assert res.exit_code == 0, res.output

    judge = json.loads((out / "summary.json").read_text())["datasets"]["capitals"]["judge"]
    assert (judge["judged"], judge["failures"]) == (4, 0)  # every verdict came from the served model
    agreement = {"both_right": 2, "judge_only": 2, "em_only": 0, "both_wrong": 0, "agreement": 0.5}
    assert judge["agreement"] == agreement  # the judge says correct to Rome's and Austin's "Paris" too
    version = JUDGE_PROMPT_VERSION + "+prefill"  # a local judge gets the verdict prefill by default
    assert (judge["models"], judge["prompt_versions"]) == ([str(judge_dir)], [version])
    table = "| capitals | 2 | 2 | 0 | 0 | 50.0 |"
    assert table in res.output and table in (out / "summary.md").read_text()
    assert f"Judge ({judge_dir}; prompt {version}) against exact match" in res.output

    # the server was really there, and is gone once the command returns
    url = re.search(r"served at (http://127\.0\.0\.1:\d+)/v1", res.output.replace("\n", ""))
    assert url, res.output
    verdicts = [json.loads(line)["judge"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(v["raw"], v["attempts"]) for v in verdicts} == {
        (VERDICT, 1)
    }  # prefill + the served model's words
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.group(1) + "/health", timeout=5)


@pytest.mark.slow
def test_the_local_judge_server_stops_when_the_run_fails(tmp_path, judge_dir):
    from asearch.eval.config import JudgeConfig, local_judge_server

    cfg = JudgeConfig(local=True, model=str(judge_dir))
    with pytest.raises(RuntimeError, match="the agent crashed"):
        with local_judge_server(cfg, log_path=tmp_path / "judge.log") as url:
            assert (
                url is not None
                and httpx.get(url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
            )
            raise RuntimeError("the agent crashed")
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.removesuffix("/v1") + "/health", timeout=5)


def test_the_verdict_prefill_is_continued_and_read_back_whole():
    import asyncio

    from fastapi import FastAPI

    from asearch.engine.remote.openai_chat import OpenAIChatClient
    from asearch.metrics.judge import JUDGE_PROMPT_VERSION, VERDICT_PREFILL, LLMJudge
    from asearch.retrieval.server import serve_in_thread

    chat, bodies = FastAPI(), []

    @chat.post("/v1/chat/completions")
    async def completions(body: dict) -> dict:
        bodies.append(body)
        word = "correct" if "- Paris" in body["messages"][1]["content"] else "incorrect"
        message = {"role": "assistant", "content": word + '"}'}  # the continuation only, as vLLM sends it
        return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    async def verdicts(url: str) -> list:
        client = OpenAIChatClient(f"{url}/v1", "small", retries=0)
        try:
            judge = LLMJudge(client, prefill=VERDICT_PREFILL, retry_delay_s=0)
            return [await judge.judge("Capital of France?", "Paris", [g]) for g in ("Paris", "Rome")]
        finally:
            await client.aclose()

    with serve_in_thread(chat) as url:
        right, wrong = asyncio.run(verdicts(url))
    assert (right.correct, wrong.correct) == (True, False)
    assert (
        right.raw == '{"judgement": "correct"}' and right.prompt_version == JUDGE_PROMPT_VERSION + "+prefill"
    )
    assert bodies[0]["messages"][-1] == {"role": "assistant", "content": VERDICT_PREFILL}
    assert (bodies[0]["continue_final_message"], bodies[0]["add_generation_prompt"]) == (True, False)


def test_judge_options_are_checked(tmp_path):
    from asearch.config import load_config
    from asearch.eval.config import LOCAL_JUDGE_MODEL, JudgeConfig, build_judge, local_judge_server

    with pytest.raises(ConfigError, match="give one"):
        load_config(JudgeConfig, overrides=["url=http://127.0.0.1:8001/v1", "model=m", "local=true"])
    assert JudgeConfig(local=True).model_name == LOCAL_JUDGE_MODEL  # the model the project ships
    assert (
        JudgeConfig(local=True).prefills_verdict
        and not JudgeConfig(url="http://x/v1", model="m").prefills_verdict
    )
    with local_judge_server(JudgeConfig(), log_path=tmp_path / "unused.log") as url:
        assert url is None and build_judge(JudgeConfig()) == (
            None,
            None,
        )  # no judge asked for: nothing started
    res = runner.invoke(root, ["eval", "--judge", "remote", "-d", "world"])
    assert isinstance(res.exception, ConfigError) and "the only value is 'local'" in str(res.exception)
