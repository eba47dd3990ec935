"""Seconds to put one version of a policy into the in-process engine's weights: every HF-named tensor of a
Qwen2.5-0.5B-shaped state dict through `DecoderWeightsBuilder.put` into a previous version's tensors, as a
collective sync (bfloat16 on the wire) and a disk load (float32 files) do on a server. Its projection
matrices are copied transposed, (out, in) to the engine's (in, out): by torch's strided copy (the baseline)
or by the C kernel (`cpu_kernels.CpuKernels.transpose_into`), in the same run, alternating, one thread.

    flock /tmp/asearch-heavy.lock .venv/bin/python bench/weight_load.py         # ~1 minute, ~6 GB of RAM
    .venv/bin/python bench/weight_load.py --shape tiny --repeats 2              # seconds, a smoke test

Prints the table and writes it to --out (bench/results/weight_load.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import write_report  # noqa: E402
from gpu_check import SHAPES  # noqa: E402


def put_seconds(spec, sd: dict[str, torch.Tensor], reuse, transpose) -> tuple[float, object]:
    from asearch.engine.local.decoder import DecoderWeightsBuilder

    builder = DecoderWeightsBuilder(spec, torch.float32, reuse=reuse, transpose=transpose)
    t0 = time.perf_counter()
    for name, tensor in sd.items():
        builder.put(name, tensor)
    weights = builder.finish()
    return time.perf_counter() - t0, weights


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--repeats", type=int, default=5, help="puts per (dtype, copy); the median is reported")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "weight_load.md")
    args = ap.parse_args(argv)
    from transformers import Qwen2Config

    from asearch.engine.local.cpu_kernels import kernels_for
    from asearch.engine.local.decoder import DecoderSpec, expected_shapes

    torch.set_num_threads(1)
    kernels = kernels_for("native", torch.device("cpu"), torch.float32)
    assert kernels is not None
    spec = DecoderSpec.from_config(Qwen2Config(**SHAPES[args.shape]))
    shapes = {k: s for k, s in expected_shapes(spec).items() if k != "lm_head.weight" or not spec.tie_embeddings}
    copies = {"torch": None, "C kernel": kernels.transpose_into}
    results: dict[str, dict[str, list[float]]] = {}
    t_all = time.perf_counter()
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(0)
        sd = {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}
        spare = {c: put_seconds(spec, sd, None, t)[1] for c, t in copies.items()}  # first touch of the memory
        runs: dict[str, list[float]] = {c: [] for c in copies}
        for _ in range(args.repeats):
            for c, t in copies.items():
                seconds, spare[c] = put_seconds(spec, sd, spare[c], t)
                runs[c].append(seconds)
        a, b = spare["torch"].by_field(), spare["C kernel"].by_field()  # type: ignore[attr-defined]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the two copies differ"
        results[str(dtype).removeprefix("torch.")] = runs
        print(dtype, {c: [round(x, 3) for x in r] for c, r in runs.items()}, flush=True)
    n_params = sum(int(torch.Size(s).numel()) for s in shapes.values())
    lines = ["| source dtype | torch's copy, median s | C kernel, median s | speed-up | runs torch / C (s) |",
             "|---|---:|---:|---:|---|"]  # fmt: skip
    for dtype, runs in results.items():
        t, c = statistics.median(runs["torch"]), statistics.median(runs["C kernel"])
        detail = ", ".join(f"{x:.2f}" for x in runs["torch"]) + " / " + ", ".join(f"{x:.2f}" for x in runs["C kernel"])
        lines.append(f"| {dtype} | {t:.3f} | {c:.3f} | {t / c:.2f}x | {detail} |")
    write_report(f"One version put into the in-process engine's weights ({args.shape}, {n_params / 1e6:.0f}M values)",
                 "weight_load.py", argv, "1 thread", time.perf_counter() - t_all, "\n".join(lines), args.out)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
