#!/usr/bin/env bash
# The example agent beside the built-in one on the CPU demo's world and budget, for one seed:
#
#   examples/openai_agent/compare.sh SEED [demo overrides, e.g. rl.max_rl_seconds=300 sft.steps=400]
#   WARMUP_ARGS="--threads 1" examples/openai_agent/compare.sh SEED    # warmup.py's options (--tokenizer demo, ...)
#
# 1. `asearch demo`: the built-in agent (worlds, questions, tokenizer, expert SFT, RL, held-out before/after);
# 2. warmup.py: a fresh model of the demo's shape on the world expert's episodes played through the example
#    agent (function calls in the tools template), with the demo's SFT settings and episode count;
# 3. `asearch train` on the demo's own RL config with workflow.kind=openai_agent;
# then both agents' held-out accuracy (the RL runs' 100-question curve: start and final) side by side.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${1:-0}
shift || true
OUT=${OUT:-runs/openai-compare-seed$SEED}
PY=${PY:-.venv/bin/python}
AGENT=examples/openai_agent/search_agent.py:agent

[ -f "$OUT/demo/summary.json" ] || $PY -m asearch demo --seed "$SEED" --out "$OUT/demo" "$@"
[ -f "$OUT/openai-sft/config.json" ] || $PY examples/openai_agent/warmup.py --demo "$OUT/demo" --out "$OUT/openai-sft" ${WARMUP_ARGS:-}
[ -f "$OUT/openai-rl/summary.json" ] || $PY -m asearch train "$OUT/demo/rl/config.yaml" \
    model="$OUT/openai-sft" engine.model="$OUT/openai-sft" out="$OUT/openai-rl" \
    workflow.kind=openai_agent workflow.agent=$AGENT agent.max_new_tokens=64
$PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name, path in (("built-in agent", f"{out}/demo/rl/summary.json"), ("openai agent", f"{out}/openai-rl/summary.json")):
    s = json.load(open(path))
    start, final = s.get("heldout_acc_start"), s.get("heldout_acc_final")
    print(f"{name:15s} held-out {start:.3f} -> {final:.3f} ({100 * (final - start):+.1f} points), {s['steps']} RL steps")
PY
