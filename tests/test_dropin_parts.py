"""Every pluggable part is one new file: a copy of the package gets six new modules, one per part, and nothing
else changes; a fresh interpreter on that copy uses each one by name from config (the table in
docs/extending.md). One subprocess checks all six (a new module is found only by a fresh import)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asearch

SRC = Path(asearch.__file__).resolve().parent

# part -> (the one new file, its text)
NEW_FILES: dict[str, tuple[str, str]] = {
    "tool": (
        "tools/lookup.py",
        '''
        from pydantic import Field

        from asearch.config import Config
        from asearch.tools.base import Observation
        from asearch.tools.registry import register_tool


        class LookupConfig(Config):
            """Looks a word up in a fixed glossary."""

            suffix: str = Field("!", description="Appended to every answer.")


        @register_tool
        class LookupTool:
            name, counter, order, config_class, enabled_by_default = "lookup", "lookups", 40, LookupConfig, False

            def __init__(self, config=None):
                self.config = config or LookupConfig()

            @classmethod
            def from_sources(cls, sources, config):
                return cls(config)

            @property
            def description(self):
                return "<lookup>word</lookup> looks a word up"

            def parse(self, raw):
                return raw.strip()

            async def call(self, args, episode):
                return Observation(text=args.upper() + self.config.suffix)
        ''',
    ),
    "engine kind": (
        "engine/remote/echo_server.py",
        '''
        from pydantic import Field

        from asearch.engine.registry import ServerLaunch, ServerOptions, register_engine
        from asearch.engine.remote.sglang import SGLangEngine, SGLangEngineConfig
        from asearch.engine.supervisor import ServerSupervisor


        class EchoServerOptions(ServerOptions):
            """How an echo server starts (`rollout_servers.echo`)."""

            gpus: int = Field(1, ge=0, description="GPUs one echo server spans.")
            port_base: int = Field(41000, description="Server i listens on port_base + i.")

            def gpus_per_server(self):
                return self.gpus


        def serve_echo(launch: ServerLaunch):
            options = launch.options
            port = options.port_base + launch.index
            cmd = ["echo-server", launch.model, "--port", str(port), "--max-seq-len", str(launch.engine.max_seq_len)]
            url = f"http://{launch.host}:{port}"
            return ServerSupervisor(cmd, url + "/health", log_path=launch.log_path, cfg=launch.supervisor), url


        @register_engine("echo-server", options=SGLangEngineConfig, needs_url=True, rollouts=True, serve=serve_echo,
                         server_options=EchoServerOptions, server_section="echo", summary="an echo rollout server")
        def build_echo(cfg, **context):
            return SGLangEngine(cfg.base_url, cfg=cfg.options)
        ''',
    ),
    "launcher": (
        "launch/slurm.py",
        '''
        from pydantic import Field

        from asearch.launch.registry import register_launcher
        from asearch.launch.spec import Allocation, Launcher


        class SlurmAllocation(Allocation):
            partition: str = Field("batch", description="The Slurm partition the job asks for.")


        @register_launcher("slurm")
        class SlurmLauncher(Launcher):
            options_model = SlurmAllocation

            def start(self):
                self.urls = [f"slurm://{self.allocation.partition}/{i}" for i in range(self.allocation.rollout_servers)]

            def stop(self):
                self.urls = []
        ''',
    ),
    "agent style": (
        "agent/terse_style.py",
        '''
        from asearch.agent.styles import AgentStyle, register_style

        register_style(AgentStyle(name="terse", system_prompt="Answer in one word. {tools}", reading_turns=False))
        ''',
    ),
    "advantage estimator": (
        "rl/median_advantages.py",
        '''
        from asearch.rl.advantages import register_estimator


        @register_estimator("median")
        def median_advantages(r, cfg):
            """A_i = r_i - median(r): a baseline one outlier cannot move."""
            return r - r.median(dim=1, keepdim=True).values
        ''',
    ),
    "web search provider": (
        "web/brave.py",
        '''
        from pydantic import Field

        from asearch.config import Config
        from asearch.web.registry import register_search_provider


        class BraveConfig(Config):
            """A Brave-style search API."""

            base_url: str = Field("https://api.search.brave.com", description="API root.")


        @register_search_provider("brave", options=BraveConfig)
        class BraveBackend:
            def __init__(self, config, *, runtime):
                self.config, self.runtime = config, runtime

            async def search(self, queries, topk):
                return [[] for _ in queries]

            async def aclose(self):
                pass
        ''',
    ),
}

# Run in the copy: each part, used by name from config. Prints one JSON object, a result per part.
CHECKS = '''
import asyncio, json, sys
from pathlib import Path
from types import SimpleNamespace

out = {}
import asearch
out["package"] = asearch.__file__

from asearch.tools import make_tool, run_tool
from asearch.tools.build import ToolsConfig
from asearch.tools.registry import tool_counters
from asearch.rl.loop import rollout_metrics
from asearch.eval.report import render_markdown, summarize

tools = ToolsConfig(lookup={"suffix": "?"})
obs = asyncio.run(run_tool(make_tool("lookup", config=tools.lookup), "oslo"))
traj = SimpleNamespace(reward=1.0, score=1.0, num_turns=2, generated_tokens=5, counters={"lookups": 2}, answer="x",
                       min_version=0, style="asearcher")
controller = SimpleNamespace(rejected={}, masked_episodes=0, masked_by_kind={}, sampler=None,
                             staleness=SimpleNamespace(accepted=1, rejected=0), episodes_generated=1, episodes_kept=1)
metrics = rollout_metrics([SimpleNamespace(trajectories=[traj])], 0, controller, SimpleNamespace(rejected={}))
record = {"dataset": "d", "id": "q", "pass": 0, "counters": {"lookups": 2}, "num_turns": 2, "prediction": "x",
          "em": 1.0, "f1": 1.0, "cem": 1.0}
summary = summarize([record], k=1)
report = render_markdown(summary)
from asearch.metrics.counters import tool_calls_text
from asearch.view.pages import CHARTS

charted = [c.title for c in CHARTS for k in c.keys if k.endswith("/") and "rollout/tool_calls/lookups".startswith(k)]
out["tool"] = {"observation": obs.text, "counters": tool_counters(), "metric": metrics.get("rollout/tool_calls/lookups"),
               "report": "lookups 2.0" in report, "viewer": tool_calls_text(summary["overall"]["stats"]),
               "charted": charted}

from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.remote.pool import RolloutServersConfig, open_pool
from asearch.engine.supervisor import SupervisorConfig
from asearch.launch.local import rollout_server_supervisor
from asearch.launch.spec import Allocation, server_tensor_parallel

servers = RolloutServersConfig(kind="echo-server", echo={"gpus": 2, "port_base": 42000})
sup, url = rollout_server_supervisor("models/tiny", 1, Allocation(), servers, InProcessEngineConfig(max_seq_len=512),
                                     seed=0, log_path=Path("unused.log"), cfg=SupervisorConfig())
pool = open_pool(servers, [url])
out["engine kind"] = {"command": sup.command, "url": url, "gpus": server_tensor_parallel(servers),
                      "member": type(pool.members[0].engine).__name__, "saved": servers.model_dump()["echo"]}

from asearch.launch.registry import make_launcher
from asearch.launch.train import TrainConfig

cfg = TrainConfig(model="m", data="d", launcher="slurm", allocation={"partition": "gpu", "rollout_servers": 3})
launcher = make_launcher(cfg.launcher, cfg.model, cfg.allocation, RolloutServersConfig(), log_dir=Path("unused"))
with launcher:
    urls = list(launcher.urls)
out["launcher"] = {"partition": cfg.allocation.partition, "urls": urls}

from asearch.agent.loop import AgentConfig

style = AgentConfig(style="terse").resolved_style()
out["agent style"] = {"name": style.name, "reading_turns": style.reading_turns}

import torch
from asearch.rl.advantages import AdvantageConfig, group_advantages

adv = group_advantages(torch.tensor([[0.0, 1.0, 1.0, 9.0]]), AdvantageConfig(estimator="median"))
out["advantage estimator"] = adv.tolist()

from asearch.web.sources import WebConfig, open_web

web = open_web(WebConfig(search="brave", brave={"base_url": "http://brave.test"}, cache={"mode": "off"}))
out["web search provider"] = {"backend": type(web.search).__name__, "base_url": web.search.config.base_url,
                              "results": asyncio.run(web.search.search(["q"], 3))}
asyncio.run(web.aclose())
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the package plus the six new files, and what a fresh interpreter on it did with each part."""
    root = tmp_path_factory.mktemp("dropin")
    copy = root / "asearch"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in NEW_FILES.values():
        assert not (copy / path).exists(), path
        (copy / path).write_text(textwrap.dedent(text).lstrip())
    env = {**os.environ, "PYTHONPATH": str(root), "ASEARCH_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHECKS], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"root": root, "copy": copy, **json.loads(done.stdout.strip().splitlines()[-1])}


def test_each_part_is_exactly_one_new_file(dropped: dict[str, Any]) -> None:
    files = lambda base: {p.relative_to(base) for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts}  # noqa: E731
    added = files(dropped["copy"]) - files(SRC)
    assert added == {Path(path) for path, _ in NEW_FILES.values()}
    assert Path(dropped["package"]).parent == dropped["copy"]  # the subprocess ran the copy, not the source tree


def test_a_new_tool_is_usable_and_its_counter_reaches_metrics_and_report(dropped: dict[str, Any]) -> None:
    tool = dropped["tool"]
    assert tool["observation"] == "OSLO?" and tool["counters"] == ["searches", "accesses", "finds", "lookups"]
    assert tool["metric"] == 2.0 and tool["report"]  # rollout/tool_calls/lookups; the report's tool calls column
    assert tool["viewer"] == "lookups 2.0" and tool["charted"] == ["Tool calls per episode"]  # the viewer's cell, chart


def test_a_new_engine_kind_serves_rollouts_with_its_own_server_options(dropped: dict[str, Any]) -> None:
    kind = dropped["engine kind"]
    assert kind["command"] == ["echo-server", "models/tiny", "--port", "42001", "--max-seq-len", "512"]
    assert kind["url"] == "http://127.0.0.1:42001" and kind["gpus"] == 2 and kind["member"] == "SGLangEngine"
    assert kind["saved"] == {"gpus": 2, "port_base": 42000}  # rollout_servers.echo round-trips with the run's config


def test_a_new_launcher_has_its_own_option(dropped: dict[str, Any]) -> None:
    assert dropped["launcher"] == {"partition": "gpu", "urls": ["slurm://gpu/0", "slurm://gpu/1", "slurm://gpu/2"]}


def test_a_new_agent_style_is_picked_by_name(dropped: dict[str, Any]) -> None:
    assert dropped["agent style"] == {"name": "terse", "reading_turns": False}


def test_a_new_advantage_estimator_is_picked_by_name(dropped: dict[str, Any]) -> None:
    assert dropped["advantage estimator"] == [[-1.0, 0.0, 0.0, 8.0]]  # r - median(r); median of 0,1,1,9 is 1


def test_a_new_web_search_provider_is_picked_by_name(dropped: dict[str, Any]) -> None:
    web = dropped["web search provider"]
    assert web == {"backend": "BraveBackend", "base_url": "http://brave.test", "results": [[]]}
