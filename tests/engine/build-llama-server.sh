#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from the llama-cpp-python sdist on PyPI (it vendors
# llama.cpp under vendor/llama.cpp, with gguf-py and the vocabulary files the model
# generator needs). Everything is cached outside the repository, keyed by the sdist's
# version, so a second run is a no-op: $LLM_HEALTH_ENGINE_CACHE (default
# ~/.cache/llm-health/engine). Prints the cache directory's path on its last line.
#
# Needs: a C/C++ compiler, cmake, and the venv's pip (to fetch the sdist). About 10 min
# on 2 cores the first time.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${LLM_HEALTH_ENGINE_CACHE:-$HOME/.cache/llm-health/engine}/llama-cpp-python-$VERSION"
PIP="${PIP:-pip}"
SERVER="$CACHE/src/vendor/llama.cpp/build/bin/llama-server"

if [ -x "$SERVER" ] && [ -f "$CACHE/.built" ]; then
  echo "$CACHE"
  exit 0
fi

command -v cmake >/dev/null 2>&1 || {
  echo "cmake is missing: make test-engine installs it (Debian package cmake)" >&2
  exit 1
}
mkdir -p "$CACHE"
if [ ! -d "$CACHE/src/vendor/llama.cpp" ]; then
  rm -rf "$CACHE/sdist" "$CACHE/src"
  "$PIP" download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$CACHE/sdist" >&2
  mkdir -p "$CACHE/src"
  tar -xzf "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE/src" \
    --strip-components=1
fi
cd "$CACHE/src/vendor/llama.cpp"
# LLAMA_CURL / LLAMA_OPENSSL off: no model downloads and no TLS, nothing to link against.
# GGML_NATIVE stays on: the cache belongs to this machine.
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build build --target llama-server -j"$(nproc)" >&2
touch "$CACHE/.built"
echo "$CACHE"
