"""Stand-in for `python -m sglang.launch_server` (SGLang cannot be installed on a CPU-only machine): it parses the
flags asearch's `sglang-server` kind passes with SGLang's spellings, appends its argv to $SGLANG_STANDIN_ARGV, and
serves the model with `asearch engine serve`, which speaks the same native API (/generate, /health, weight updates)."""

import argparse
import json
import os
import sys

ap = argparse.ArgumentParser(prog="sglang.launch_server")
ap.add_argument("--model-path", required=True)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--tp-size", type=int, default=1)
ap.add_argument("--device", choices=["cuda", "cpu", "npu", "xpu"], default="cuda")
ap.add_argument("--random-seed", type=int)
ap.add_argument("--weight-version", default="default")
ap.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
ap.add_argument("--context-length", type=int)
ap.add_argument("--served-model-name")
ap.add_argument("--mem-fraction-static", type=float)
ap.add_argument("--disable-cuda-graph", action="store_true")
args = ap.parse_args()
with open(os.environ["SGLANG_STANDIN_ARGV"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
cmd = [sys.executable, "-m", "asearch", "engine", "serve", args.model_path, "--host", args.host, "--port", str(args.port),
       "--weight-version", args.weight_version, "--device", "cpu", "--exit-with-parent"]
for flag, value in (("--max-seq-len", args.context_length), ("--seed", args.random_seed),
                    ("--served-model-name", args.served_model_name)):
    if value is not None:
        cmd += [flag, str(value)]
if args.dtype != "auto":
    cmd += ["--dtype", args.dtype]
os.execv(sys.executable, cmd)
