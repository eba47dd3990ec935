"""The engine registry: one `EngineConfig` (a kind plus its options, flat), errors that name the nearest
key, discovery of a new kind from one file, and every builder going through it (pool members included)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from asearch.config import dump_config, load_config
from asearch.engine import registry
from asearch.engine.registry import EngineConfig, build_engine, engine_kind, engine_kinds, make_engine
from asearch.errors import ConfigError

KINDS = {"inprocess", "vllm", "sglang", "openai", "scripted"}


def runtime_config(tmp_path, yaml_text: str, *overrides: str):
    from asearch.agent.runtime import RuntimeConfig

    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    return load_config(RuntimeConfig, path, overrides)


def test_every_kind_is_registered_with_its_options_model() -> None:
    from asearch.engine.local.inprocess import InProcessEngineConfig
    from asearch.engine.local.scripted import ScriptedEngineConfig
    from asearch.engine.remote.openai_chat import OpenAIEngineConfig
    from asearch.engine.remote.sglang import SGLangEngineConfig
    from asearch.engine.remote.vllm import VLLMEngineConfig

    assert KINDS <= set(engine_kinds())
    options = {
        "inprocess": InProcessEngineConfig,
        "vllm": VLLMEngineConfig,
        "sglang": SGLangEngineConfig,
        "openai": OpenAIEngineConfig,
        "scripted": ScriptedEngineConfig,
    }
    for kind, model in options.items():
        assert engine_kind(kind).options is model and engine_kind(kind).summary
    assert {k for k in KINDS if engine_kind(k).needs_url} == {"vllm", "sglang", "openai"}
    assert KINDS & set(engine_kinds(rollouts=True)) == {k for k in KINDS if engine_kind(k).serve} == {"vllm", "sglang"}
    # the default engine, and the options model the trainer hands to InProcessEngine
    assert EngineConfig().kind == "inprocess" and type(EngineConfig().options) is InProcessEngineConfig
    cfg = EngineConfig(kind="inprocess", max_batch=8, max_seq_len=1024)
    assert cfg.options == InProcessEngineConfig(max_batch=8, max_seq_len=1024)


def test_listing_the_kinds_imports_no_torch() -> None:
    code = (
        "import sys; from asearch.engine.registry import engine_kinds; print(engine_kinds()); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "openai" in res.stdout


def test_options_sit_flat_in_yaml_and_survive_a_dump(tmp_path) -> None:
    from asearch.engine.remote.openai_chat import OpenAIEngineConfig

    cfg = runtime_config(
        tmp_path,
        """
        engine: {kind: openai, base_url: "http://127.0.0.1:8000", model: policy, timeout_s: 30}
        """,
        "engine.max_concurrency=4",
    )
    opts = cfg.engine.options
    assert isinstance(opts, OpenAIEngineConfig) and (opts.timeout_s, opts.max_concurrency) == (30.0, 4)
    dumped = cfg.model_dump(mode="json")["engine"]
    assert dumped["kind"] == "openai" and dumped["timeout_s"] == 30.0 and "options" not in dumped
    dump_config(cfg, tmp_path / "resolved.yaml")
    again = runtime_config(tmp_path, (tmp_path / "resolved.yaml").read_text())
    assert again.engine == cfg.engine and again.engine.options == opts
    # a partial override keeps the rest, as for any config section
    assert runtime_config(tmp_path, "engine: {max_batch: 3}", "engine.threads=2").engine.options.max_batch == 3


def test_older_nested_inprocess_options_still_load(tmp_path) -> None:
    cfg = runtime_config(tmp_path, "engine:\n  inprocess: {threads: 2}\n", "engine.inprocess.max_batch=5")
    assert (cfg.engine.options.threads, cfg.engine.options.max_batch) == (2, 5)
    assert "inprocess" not in cfg.model_dump()["engine"]


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("engine: {max_bach: 3}", r"run\.yaml:1: engine: unknown key 'engine\.max_bach' for engine kind 'inprocess'; "
         r"did you mean 'engine\.max_batch'\?"),
        ("engine: {kind: openai, base_url: 'http://h:1', timeout: 3}", r"did you mean 'engine\.timeout_s'\?"),
        ("engine: {kind: opnai}", r"unknown engine kind 'opnai'; did you mean 'openai'\? \(registered: inprocess, "),
        ("engine: {kind: vllm}", r"engine\.kind='vllm' needs engine\.base_url"),
        ("engine: {base_url: 'http://h:1'}", r"engine\.base_url is set but kind 'inprocess' uses no server: set "
         r"engine\.kind \(openai, sglang, sglang-server, vllm\)"),
        ("engine: {max_batch: 0}", r"run\.yaml:1: engine\.max_batch: Input should be greater than or equal to 1"),
        ("engine: {kind: vllm, base_url: 'http://h:1', inprocess: {threads: 2}}", r"engine\.inprocess is for kind"),
    ],
)  # fmt: skip
def test_bad_engine_configs_say_what_to_write(tmp_path, yaml_text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        runtime_config(tmp_path, yaml_text)


def test_a_new_engine_kind_is_one_file(tmp_path, monkeypatch) -> None:
    """A module in the engine package that registers a kind is found on the first lookup: EngineConfig
    validates its options, build_engine builds it, the kind lists show it. Nothing else is edited."""
    import asearch.engine

    (tmp_path / "echo_engine.py").write_text(
        textwrap.dedent(
            '''
            from pydantic import Field

            from asearch.config import Config
            from asearch.engine.registry import register_engine
            from asearch.engine.local.scripted import ScriptedEngine


            class EchoEngineConfig(Config):
                suffix: str = Field("!", description="Appended to the prompt's last word.")


            @register_engine("echo", options=EchoEngineConfig, summary="repeats the prompt's last word")
            def build_echo(cfg, **context):
                from asearch.models.tiny import train_bpe_tokenizer

                tok = train_bpe_tokenizer(["echo the last word"] * 5, vocab_size=300)
                return ScriptedEngine(tok, lambda prompt: prompt.split()[-1] + cfg.options.suffix)
            '''
        )
    )
    monkeypatch.setattr(asearch.engine, "__path__", [*asearch.engine.__path__, str(tmp_path)])
    with registry.ENGINES.temporary(rediscover=True):  # finds the new module; gone after the test
        monkeypatch.delitem(sys.modules, "asearch.engine.echo_engine", raising=False)
        pytest.importorskip("torch")
        assert "echo" in engine_kinds() and "echo: repeats" in registry.engine_kinds_help()
        engine, tok = build_engine(EngineConfig(kind="echo", model="unused", suffix="?"))
        from asearch.engine.types import GenerateRequest, SamplingParams

        ids = tok.encode("echo the word", add_special_tokens=False)
        resp = asyncio.run(engine.generate(GenerateRequest(input_ids=ids, sampling=SamplingParams())))
        assert resp.text == "word?"
        with pytest.raises(Exception, match="did you mean 'engine.suffix'"):
            EngineConfig(kind="echo", sufix="?")


def test_scripted_kind_replays_replies_per_trajectory(tok_dir) -> None:
    from asearch.engine.types import GenerateRequest, SamplingParams

    engine, tok = build_engine(EngineConfig(kind="scripted", model=str(tok_dir), replies=["one", "two"]))

    async def call(tid: str) -> str:
        req = GenerateRequest(input_ids=tok.encode("q", add_special_tokens=False), trajectory_id=tid,
                              sampling=SamplingParams(max_new_tokens=16))  # fmt: skip
        return (await engine.generate(req)).text

    async def go() -> list[str]:
        return [await call("a"), await call("b"), await call("a"), await call("a")]

    assert asyncio.run(go()) == ["one", "one", "two", "two"]


def test_rollout_pool_members_are_built_through_the_registry(monkeypatch) -> None:
    from asearch.engine.remote.pool import RolloutServersConfig, open_pool
    from asearch.engine.remote.sglang import SGLangEngine
    from asearch.engine.remote.vllm import VLLMEngine

    built = []
    real = registry.make_engine
    monkeypatch.setattr("asearch.engine.remote.pool.make_engine", lambda cfg, **kw: built.append(cfg) or real(cfg, **kw))
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    pool = open_pool(RolloutServersConfig(kind="vllm"), urls, version=3)
    assert all(isinstance(m.engine, VLLMEngine) and m.engine.version == 3 for m in pool.members)
    assert [c.base_url for c in built] == urls and {c.model for c in built} == {"policy"}
    pool = open_pool(RolloutServersConfig(kind="sglang"), urls[:1])
    assert isinstance(pool.members[0].engine, SGLangEngine) and built[-1].kind == "sglang"
    assert make_engine(built[-1]).base_urls == urls[:1]
    with pytest.raises(ValueError, match="RL samples from one of sglang, sglang-server, vllm"):
        RolloutServersConfig(kind="openai")  # a chat server has no token log-probs or weight updates
    pool = open_pool(RolloutServersConfig(kind="sglang", update_kv="keep"), urls[:1])
    assert pool.members[0].engine.cfg.update_kv == "keep" and pool.members[0].engine.updates_in_place
    assert open_pool(RolloutServersConfig(kind="sglang"), urls[:1]).members[0].engine.cfg.update_kv == "keep"
    for kv in ("keep", "recompute"):  # vLLM has no choice: an explicit one is a mistake
        with pytest.raises(ValueError, match="kind 'vllm' always recompute"):
            RolloutServersConfig(kind="vllm", update_kv=kv)


def test_rollout_servers_get_a_section_per_kind_with_server_options() -> None:
    """`rollout_servers.vllm` / `.sglang` are the server options the kinds registered (`ServerOptions`), not fields
    of RolloutServersConfig: typed, saved with the config, and an unknown key names the nearest one."""
    from asearch.config import load_config
    from asearch.engine.remote.pool import RolloutServersConfig
    from asearch.engine.remote.sglang_server import SGLangServerConfig
    from asearch.engine.remote.vllm import VLLMServerConfig
    from asearch.errors import ConfigError
    from asearch.launch.spec import server_tensor_parallel

    servers = RolloutServersConfig(kind="vllm", vllm={"tensor_parallel_size": 2}, sglang={"tp_size": 4})
    vllm = servers.server_options()
    assert isinstance(vllm, VLLMServerConfig) and vllm.tensor_parallel_size == 2 and server_tensor_parallel(servers) == 2
    assert isinstance(servers.server_options("sglang-server"), SGLangServerConfig)
    assert servers.server_options("sglang") is None  # `asearch engine serve` takes the engine's own options
    dumped = servers.model_dump()
    assert dumped["vllm"]["tensor_parallel_size"] == 2 and dumped["sglang"]["tp_size"] == 4
    assert RolloutServersConfig.model_validate(dumped).server_options().tensor_parallel_size == 2
    with pytest.raises(ConfigError, match=r"vllm.dtyp: unknown key 'dtyp'; did you mean 'dtype'"):
        load_config(RolloutServersConfig, None, ["kind=vllm", "vllm.dtyp=float32"], base=None)
    with pytest.raises(ValueError, match=r"unknown key 'vlm'; did you mean 'vllm'"):
        RolloutServersConfig(kind="vllm", vlm={"dtype": "float32"})
