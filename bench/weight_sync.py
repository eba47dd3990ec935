"""Seconds per weight sync, trainer -> rollout servers: disk float32 (the base commit's path), disk bfloat16,
and collective (a bfloat16 broadcast over a gloo group the servers join), one script, same servers.

A Qwen2.5-0.5B-shaped random policy (bench/gpu_check.py's SHAPES) in a PolicyTrainer (or, with --fsdp, a
DistributedPolicyTrainer of world size 1) and 2 `asearch engine serve` processes (1 thread each) that start
from the same weights. Each method pushes --warmup versions unmeasured (a method's first sync pays one-time
costs: the servers' first spare weights, the page cache), then --repeats versions, through the same
`EnginePool` the RL loop uses (`DiskWeights` with dtype None is the base commit's `DiskWeights.push`: save_hf in
the model's dtype, then /update_weights_from_disk on every server). A sync ends when every server serves the
new version.

    flock /tmp/asearch-heavy.lock .venv/bin/python bench/weight_sync.py            # ~16 GB of RAM at the 0.5B shape
    .venv/bin/python bench/weight_sync.py --shape tiny --repeats 2                  # seconds, for a smoke test

Prints the table and writes it to --out (bench/results/weight_sync.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import import_moved, worktree, write_report  # noqa: E402
from gpu_check import SHAPES  # noqa: E402

METHODS = ("disk-float32", "disk-bfloat16", "collective")
BASE = "base"  # disk float32 measured on the --baseline-rev commit's code (trainer and servers)


def build_policy(shape: str, seed: int = 0):
    """(model, tokenizer): a random Qwen2 of `shape` in float32 and a small BPE tokenizer (ids are all we send)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asearch.models.tiny import train_bpe_tokenizer

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape])).eval()
    tok = train_bpe_tokenizer([f"city {i} river bridge" for i in range(50)], vocab_size=300)
    return model, tok


def make_trainer(model, *, fsdp: bool, device: str):
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig

    if not fsdp:
        return PolicyTrainer(model.to(device), TrainerConfig(device=device), temperature=1.0)
    from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed

    env = init_distributed()  # world size 1: NCCL on CUDA, gloo on CPU
    return DistributedPolicyTrainer(model, TrainerConfig(device=device), env=env, temperature=1.0)


async def measure(trainer, tok, urls: list[str], sups: list, work: Path, method: str, repeats: int,
                  version: int, backend: str | None = None, bucket_mb: float = 512.0, warmup: int = 0) -> list[dict[str, float]]:  # fmt: skip
    """`warmup` unmeasured pushes of `method`, then `repeats` measured ones, each row {seconds, bytes}; versions
    from `version` + 1."""
    from asearch.rl import weights as sync  # the base commit has no CollectiveWeights

    HttpConfig = import_moved("asearch.engine.remote.http").HttpConfig
    EnginePool = import_moved("asearch.engine.remote.pool").EnginePool
    sglang = import_moved("asearch.engine.remote.sglang")
    SGLangEngine, SGLangEngineConfig = sglang.SGLangEngine, sglang.SGLangEngineConfig

    DiskWeights, CollectiveWeights = sync.DiskWeights, getattr(sync, "CollectiveWeights", type(None))

    http = HttpConfig(timeout_s=1200, retries=0)
    engines = [SGLangEngine(u, cfg=SGLangEngineConfig(http=http, initial_version=version)) for u in urls]
    pool = EnginePool(engines, names=urls, supervisors=sups, version=version)
    dtype = {"disk-float32": None, "disk-bfloat16": "bfloat16"}.get(method)
    if method == BASE:  # this module under PYTHONPATH=<base worktree>/src: that commit's DiskWeights as it was
        disk = DiskWeights(pool, trainer, tok, work / method, 2)
    else:
        disk = DiskWeights(pool, trainer, tok, work / method, keep=2, dtype=dtype)
    weights: Any = disk
    if method == "collective":
        weights = CollectiveWeights(pool, trainer, disk, urls, bucket_mb=bucket_mb, backend=backend)
    rows = []
    try:
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            await weights.push(version + 1 + i)
            seconds = time.perf_counter() - t0
            if i < warmup:
                print(f"  {method} warm-up: {seconds:.2f} s", flush=True)
                continue
            if method == BASE:
                written = (work / method / f"v{version + 1 + i}").glob("*.safetensors")
                m = {"weights/collective": False, "weights/sync_bytes": float(sum(f.stat().st_size for f in written))}
            else:
                m = weights.metrics()
            assert m["weights/collective"] == (method == "collective"), m
            rows.append({"seconds": seconds, "bytes": m["weights/sync_bytes"]})
            print(f"  {method} #{i + 1 - warmup}: {seconds:.2f} s, {m['weights/sync_bytes'] / 1e9:.2f} GB", flush=True)
    finally:
        if isinstance(weights, CollectiveWeights):
            await weights.close()
        await pool.close()
        shutil.rmtree(work / method, ignore_errors=True)
    return rows


def table(results: dict[str, list[dict[str, float]]], n_params: int, servers: int) -> str:
    base = statistics.median(r["seconds"] for r in results["disk-float32"]) if "disk-float32" in results else None
    lines = [
        f"| method | median s per sync ({servers} servers) | runs (s) | update size | vs disk float32 |",
        "|---|---:|---|---:|---:|",
    ]
    for method, rows in results.items():
        med = statistics.median(r["seconds"] for r in rows)
        runs = ", ".join(f"{r['seconds']:.2f}" for r in rows)
        ratio = f"{med / base:.2f}x" if base else "-"
        lines.append(f"| {method} | {med:.2f} | {runs} | {rows[0]['bytes'] / 1e9:.2f} GB | {ratio} |")
    lines.append(f"\n{n_params / 1e6:.0f}M parameters.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from asearch.models.tiny import save_tiny

    launch_engine_server = import_moved("asearch.engine.server.app").launch_engine_server

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="weight-sync-", dir=args.work))
    model, tok = build_policy(args.shape)
    n_params = sum(p.numel() for p in model.parameters())
    start_dir = save_tiny(model, tok, work / "start")
    launched = []
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for i in range(args.servers):
            launched.append(launch_engine_server(
                start_dir, log_path=work / f"server{i}.log", threads=1, max_seq_len=256, max_batch=4,
                weight_version="0", extra_args=["--device", args.device],
            ))  # fmt: skip
        trainer = make_trainer(model, fsdp=args.fsdp, device=args.device)
        urls, sups = [u for _, u in launched], [s for s, _ in launched]
        version = 0
        for method in args.methods:
            print(f"{method}: {args.repeats} syncs to {args.servers} servers", flush=True)
            results[method] = asyncio.run(
                measure(trainer, tok, urls, sups, work, method, args.repeats, version, args.backend, args.bucket_mb, args.warmup)
            )
            version += args.warmup + args.repeats
    finally:
        for sup, _ in launched:
            sup.stop()
        with contextlib.suppress(Exception):
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)
    return {"results": results, "n_params": n_params}


def baseline(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Disk float32 on the `--baseline-rev` commit: this script in a subprocess with that commit's `src` first on
    PYTHONPATH (the servers it launches inherit it), in a worktree made for it."""
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline_rev], capture_output=True, text=True, check=True).stdout.strip()
    tree = worktree(rev)
    answer = Path(tempfile.mkdtemp()) / "base.json"
    cmd = [sys.executable, __file__, "--shape", args.shape, "--servers", str(args.servers), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--methods", BASE, "--device", args.device, "--threads", str(args.threads), "--json", str(answer)]  # fmt: skip
    print(f"{BASE}: disk float32 on {rev} ({tree})", flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(tree / "src")})
    return {f"disk-float32 @ {rev}": json.loads(answer.read_text())["results"][BASE]}


def gpu_check_rows(shape: str, device: str, repeats: int = 2) -> list[dict[str, Any]]:
    """bench/gpu_check.py's `weights` phase: a DistributedPolicyTrainer of world size 1 (NCCL on CUDA) pushes
    to one `asearch engine serve` on the same device, by disk (float32, bfloat16) and over a weight group;
    seconds per GB moved. With one GPU NCCL may refuse a group whose two ranks share it: then the collective
    row is measured again over gloo (tensors through host memory), and both outcomes are kept."""
    import traceback

    def once(methods: list[str], backend: str | None) -> dict[str, list[dict[str, float]]]:
        ns = argparse.Namespace(shape=shape, servers=1, repeats=repeats, warmup=1, methods=methods, device=device,
                                backend=backend, fsdp=True, threads=torch.get_num_threads(), work=None, bucket_mb=512.0)  # fmt: skip
        return run(ns)["results"]

    def rows_of(results: dict[str, list[dict[str, float]]], backend: str) -> list[dict[str, Any]]:
        out = []
        for method, runs in results.items():
            med = statistics.median(r["seconds"] for r in runs)
            gb = runs[0]["bytes"] / 1e9
            out.append({"phase": "weights", "method": method, "backend": backend if method == "collective" else "disk",
                        "seconds": med, "gb": gb, "s_per_gb": med / max(gb, 1e-12), "runs": [r["seconds"] for r in runs]})  # fmt: skip
        return out

    first = "nccl" if device.startswith("cuda") else "gloo"
    try:
        return rows_of(once(list(METHODS), first), first)
    except Exception:  # noqa: BLE001 - recorded, then the gloo measurement
        if first == "gloo":
            raise
        error = traceback.format_exc().strip().splitlines()[-1]
        rows = rows_of(once(["disk-float32", "disk-bfloat16", "collective"], "gloo"), "gloo")
        return rows + [{"phase": "weights", "method": "collective", "backend": "nccl", "error": error}]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="syncs per method (the median is reported)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured syncs per method before those")
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    ap.add_argument("--device", default="cpu", help="of the trainer and the servers")
    ap.add_argument("--backend", default=None, help="the weight group's (default: nccl on cuda, gloo on cpu)")
    ap.add_argument("--bucket-mb", type=float, default=512.0, help="collective: rollout_servers.weights_bucket_mb")
    ap.add_argument("--fsdp", action="store_true", help="a DistributedPolicyTrainer of world size 1")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    ap.add_argument("--work", default=None, help="where the weights directories go (default: the temp dir)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "weight_sync.md")
    ap.add_argument("--baseline-rev", default=None, help="also measure disk float32 on this commit's code (git worktree)")
    ap.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)  # the baseline's subprocess answers here
    args = ap.parse_args(argv)
    if unknown := set(args.methods) - {*METHODS, BASE}:
        ap.error(f"unknown methods {sorted(unknown)} ({', '.join(METHODS)})")
    t = time.perf_counter()
    base = baseline(args) if args.baseline_rev else {}
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out))
        return out
    text = table({**base, **out["results"]}, out["n_params"], args.servers)
    write_report(f"Weight sync, trainer -> {args.servers} rollout servers", "weight_sync.py", argv,
                 f"device {args.device}", time.perf_counter() - t, text, args.out)  # fmt: skip
    return out


if __name__ == "__main__":
    main()
