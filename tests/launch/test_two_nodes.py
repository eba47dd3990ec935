"""A real two-node Ray cluster on one machine: a head node in network namespace A (10.213.0.1) and a worker
node in namespace B (10.213.0.2), joined by a veth pair, so that 127.0.0.1 in one is not the other's. Each node
declares 2 GPUs it does not have (`ray start --num-gpus 2`) and the run forces the CPU device, so the GPU
reservations, placement groups, node addresses and forwarded environment are Ray's own.

`asearch train launcher=ray` with 2 rollout servers and 2 FSDP ranks runs in A: the servers spread one per node,
the ranks one per node (rank 0 on the head, a replicate 2 x shard 1 HSDP mesh), every address is a node address
(bind auto), and the run is killed (SIGKILL) after its step-2 checkpoint and resumed to step 3.

Needs root (network namespaces); skips with the reason elsewhere. The nodes are ended by their process ids
(`ip netns pids`): `ray stop` would end every Ray process of the machine, another test's cluster included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

pytestmark = pytest.mark.ray  # a two-node Ray cluster in network namespaces

RAY_BIN = str(Path(sys.executable).parent / "ray")
HEAD, WORKER = "10.213.0.1", "10.213.0.2"  # the tests' own addresses, on a veth pair no other host sees
PORT = 6391
B, N, ETA = 2, 2, 2


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class TwoNodes:
    """Namespaces A and B with a veth pair between them and a Ray node in each."""

    def __init__(self, env: dict[str, str]):
        tag = str(os.getpid())[-5:]
        self.ns = {"a": f"asearch-{tag}-a", "b": f"asearch-{tag}-b"}
        self.env = env

    def netns_or_skip(self) -> None:
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root (ip netns add)")
        made = _ip("netns", "add", self.ns["a"])
        if made.returncode != 0:
            pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
        tag = self.ns["a"].split("-")[1]
        steps = [
            ("netns", "add", self.ns["b"]),
            ("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}"),
            ("link", "set", f"va{tag}", "netns", self.ns["a"]),
            ("link", "set", f"vb{tag}", "netns", self.ns["b"]),
            ("-n", self.ns["a"], "addr", "add", f"{HEAD}/24", "dev", f"va{tag}"),
            ("-n", self.ns["b"], "addr", "add", f"{WORKER}/24", "dev", f"vb{tag}"),
        ]
        for ns, dev in ((self.ns["a"], f"va{tag}"), (self.ns["b"], f"vb{tag}")):
            steps += [("-n", ns, "link", "set", "lo", "up"), ("-n", ns, "link", "set", dev, "up")]
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"

    def run(self, node: str, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.ns[node], *cmd], env=kwargs.pop("env", self.env),
                              capture_output=True, text=True, **kwargs)  # fmt: skip

    def start_ray(self, tmp: Path) -> None:
        common = ["--num-cpus=2", "--num-gpus=2", "--disable-usage-stats"]
        head = self.run("a", [RAY_BIN, "start", "--head", f"--node-ip-address={HEAD}", f"--port={PORT}",
                              "--include-dashboard=false", f"--temp-dir={tmp}", *common], timeout=180)  # fmt: skip
        assert head.returncode == 0, head.stdout + head.stderr
        worker = self.run("b", [RAY_BIN, "start", f"--address={HEAD}:{PORT}", f"--node-ip-address={WORKER}", *common], timeout=180)
        assert worker.returncode == 0, worker.stdout + worker.stderr

    def wait_all_free(self, timeout: float = 120) -> str:
        """Until the cluster's 4 CPUs and 4 GPUs are free (a killed driver's actors and placement groups are
        released asynchronously); returns what the cluster reports."""
        probe = (
            "import ray, time, sys\n"
            f"ray.init(address='{HEAD}:{PORT}', log_to_driver=False, logging_level='warning')\n"
            "t0 = time.monotonic()\n"
            "while (r := ray.available_resources()).get('CPU', 0) < 4 or r.get('GPU', 0) < 4:\n"
            f"    assert time.monotonic() - t0 < {timeout}, r\n"
            "    time.sleep(0.2)\n"
            "print(len([n for n in ray.nodes() if n['Alive']]), 'nodes', r.get('CPU'), 'CPU', r.get('GPU'), 'GPU')\n"
            "ray.shutdown()\n"
        )
        done = self.run("a", [sys.executable, "-c", probe], timeout=timeout + 60)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout.strip()

    def down(self) -> None:
        """End every process left in either namespace (Ray's daemons and workers, servers), then the namespaces."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(p) for ns in self.ns.values() for p in _ip("netns", "pids", ns).stdout.split()]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p)]
                time.sleep(0.2)
        for ns in self.ns.values():
            _ip("netns", "del", ns)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent is gone too) no longer holds anything
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def two_nodes(subprocess_env, tmp_path_factory):
    env = {**subprocess_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    nodes = TwoNodes(env)
    nodes.netns_or_skip()
    temp_dir = Path("/tmp") / f"ray2n{os.getpid()}"  # Ray's sockets: a short path (a tmp_path is too long for them)
    try:
        t0 = time.monotonic()
        nodes.start_ray(temp_dir)
        print(f"\n[two nodes] up in {time.monotonic() - t0:.1f}s: {nodes.wait_all_free()}")
        yield nodes
    finally:
        nodes.down()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _http_get(nodes: TwoNodes, node: str, url: str) -> str:
    """GET `url` from inside namespace `node`: the body, or the error's class name."""
    code = (
        "import urllib.request, sys\n"
        "try:\n"
        f"    print(urllib.request.urlopen('{url}', timeout=5).read().decode()[:200])\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, getattr(e, 'reason', ''))\n"
    )
    return nodes.run(node, [sys.executable, "-c", code], timeout=60).stdout.strip()


@pytest.mark.slow
def test_two_nodes_place_by_node_address_train_and_resume(two_nodes, tiny_world_model_dir, train_command, tmp_path) -> None:
    out = tmp_path / "run"
    ray_args = [
        "launcher=ray", f"allocation.ray_address={HEAD}:{PORT}", "allocation.rollout_servers=2",
        "allocation.trainer_ranks=2", "allocation.server_cpus=0.5", "allocation.rank_cpus=0.5",
        "trainer.device=cpu", "engine.device=cpu",  # the declared GPUs do not exist: the CPU is forced
    ]  # fmt: skip
    env = {**two_nodes.env, "ASEARCH_TWO_NODE_PROBE": "forwarded", "TWO_NODE_UNLISTED": "not forwarded"}

    def cmd(steps: int) -> list[str]:
        return ["ip", "netns", "exec", two_nodes.ns["a"], *train_command(tiny_world_model_dir, out, steps, batch=B, group=N, eta=ETA), *ray_args]

    console = tmp_path / "train.log"
    t0 = time.monotonic()
    with console.open("wb") as sink:
        proc = subprocess.Popen(cmd(1000), env=env, stdout=sink, stderr=subprocess.STDOUT)  # killed long before
    try:
        while not (out / "checkpoints").is_dir() or not any((out / "checkpoints").glob("step_*")):
            assert proc.poll() is None, console.read_text()[-4000:]
            assert time.monotonic() - t0 < 300, "no checkpoint in 300 s:\n" + console.read_text()[-4000:]
            time.sleep(0.1)
        servers = json.loads((out / "logs" / "servers.json").read_text())
        probes = _check_addresses(two_nodes, servers)
        assert proc.poll() is None, console.read_text()[-3000:]  # still training
        proc.send_signal(signal.SIGKILL)  # the driver dies without a word: Ray ends its actors and servers
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = console.read_text()
    killed_after = time.monotonic() - t0
    placement = [line for line in first.splitlines() if line.startswith("ray launcher:")]
    print("\n".join(["", *placement, *probes]))

    nodes = re.search(r"ray launcher: 2 node\(s\) \(([^)]*)\)", first)
    assert nodes and sorted(nodes[1].split(", ")) == [f"{HEAD} head", WORKER] and "bind node" in first, first[-3000:]
    assert "ASEARCH_TWO_NODE_PROBE" in first and "TWO_NODE_UNLISTED" not in first
    assert "FSDP mesh 2-D HSDP: replicate 2 x shard 1" in first
    servers_at = sorted(re.findall(r"rollout server \d on node ([\d.]+).*serving http://([\d.]+):", first))
    assert servers_at == [(HEAD, HEAD), (WORKER, WORKER)], placement  # spread, each at its node's address
    ranks_at = re.findall(r"trainer rank (\d) on node ([\d.]+)", first)
    assert ranks_at == [("0", HEAD), ("1", WORKER)], placement  # rank 0 on the head, rank 1 on the other node
    assert f"process group store at {HEAD}:" in first
    gpus = re.findall(r"on node ([\d.]+)(?: \(head\))?, GPUs (\S+) ", first)
    assert sorted(gpus) == sorted([(HEAD, "0"), (HEAD, "1"), (WORKER, "0"), (WORKER, "1")]), gpus  # 1 GPU each

    # resume: the ranks load the last checkpoint (step 2 or 4) and the run goes one step further on the same nodes
    print(f"[two nodes] killed after {killed_after:.1f}s; cluster: {two_nodes.wait_all_free()}")
    ckpt_step = max(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    done = subprocess.run(cmd(ckpt_step + 1), env=env, capture_output=True, text=True, timeout=400)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert f"(step {ckpt_step}," in said.replace("\n", ""), said[-3000:]
    # both ranks' shards, read back on their two nodes, are the weights the killed run saved at that step
    assert "weights as saved: digest" in said.replace("\n", ""), said[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, ckpt_step + 2)), (ckpt_step, steps)
    resumed = [line for line in said.splitlines() if "resum" in line.lower() or line.startswith("step ")]
    print("\n".join(resumed))
    print(f"[two nodes] whole test {time.monotonic() - t0:.1f}s")


def _check_addresses(nodes: TwoNodes, servers: list[dict]) -> list[str]:
    """Each server answers at its node address from the other namespace, and 127.0.0.1 in A is not B's; the
    forwarded environment reached the server processes and nothing off the allow-list did."""
    said = []
    for s in servers:
        url = s["url"]
        port = url.rsplit(":", 1)[1]
        ok = _http_get(nodes, "a", f"{url}/health")
        assert "Error" not in ok, (url, ok)
        said.append(f"from A: {url}/health -> {ok[:40]!r}")
        if WORKER in url:
            refused = _http_get(nodes, "a", f"http://127.0.0.1:{port}/health")
            assert "Connection refused" in refused or "URLError" in refused, refused
            said.append(f"from A: http://127.0.0.1:{port}/health (B's server's port on A's loopback) -> {refused}")
        environ = Path(f"/proc/{s['pid']}/environ").read_bytes().split(b"\0")
        assert b"ASEARCH_TWO_NODE_PROBE=forwarded" in environ, url
        assert not any(v.startswith(b"TWO_NODE_UNLISTED=") for v in environ), url
    return said
