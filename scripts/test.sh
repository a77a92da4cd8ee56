#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything (CUDA sources too when
# nvcc is present), fetches SmolLM2-135M-Instruct, and runs the whole ctest suite.
# GPU tests (label gpu) skip visibly on hosts without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
BUILD=${POLYKV_BUILD_DIR:-build}
JOBS=${POLYKV_JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPOLYKV_BUILD_TESTS=ON \
  -DPOLYKV_BUILD_BENCHMARKS=ON </dev/null
cmake --build "$BUILD" -j"$JOBS" </dev/null

POLYKV_SMOLLM2_GGUF="$(bash scripts/fetch-model.sh </dev/null | tail -n1)"
export POLYKV_SMOLLM2_GGUF
echo "test: SmolLM2-135M-Instruct at $POLYKV_SMOLLM2_GGUF" >&2

ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j"$JOBS" </dev/null
