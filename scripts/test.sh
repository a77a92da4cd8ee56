#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything (CUDA sources too when
# nvcc is present), fetches SmolLM2-135M-Instruct, and runs the whole ctest suite, the fault
# suite's short forms included (labels fault-chaos, fault-storm, and fault + fuzz; the fuzz
# targets are built with clang in <build>/fuzz). GPU tests (label gpu) skip visibly on hosts
# without a GPU.
# The eval venv (scripts/install-eval-deps.sh: numpy, tokenizers, all-MiniLM-L6-v2) is
# installed too and exported as POLYKV_EVAL_PYTHON for the ctest eval_post_semantic.
# Before building, scripts/check-format.sh checks every source against .clang-format.
# Then the same without libtorch (POLYKV_WITH_TORCH=OFF) in <build>-notorch.
# POLYKV_CI_SANITIZE=1 adds the ASan+UBSan and ThreadSanitizer runs (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# Layout first: every tracked source clean under .clang-format (fails in seconds, not after
# the build).
bash scripts/check-format.sh </dev/null
POLYKV_EVAL_PYTHON="$(bash scripts/install-eval-deps.sh </dev/null | tail -n1)"
export POLYKV_EVAL_PYTHON
echo "test: eval Python at $POLYKV_EVAL_PYTHON" >&2
BUILD=${POLYKV_BUILD_DIR:-build}
JOBS=${POLYKV_JOBS:-$(nproc)}
# Compile through ccache when it is there: the torch-free configuration below shares most
# objects with this one, and a rebuild in another clone reuses them (paths relative to the
# clone, so the cache does not depend on where it lies).
LAUNCHER=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPOLYKV_BUILD_TESTS=ON \
  -DPOLYKV_BUILD_BENCHMARKS=ON "${LAUNCHER[@]}" </dev/null
cmake --build "$BUILD" -j"$JOBS" </dev/null

POLYKV_SMOLLM2_GGUF="$(bash scripts/fetch-model.sh </dev/null | tail -n1)"
export POLYKV_SMOLLM2_GGUF
echo "test: SmolLM2-135M-Instruct at $POLYKV_SMOLLM2_GGUF" >&2

ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j"$JOBS" </dev/null

# The torch-free configuration (issue 26): the whole product without libtorch
# (POLYKV_WITH_TORCH=OFF), built and tested too. Every test runs there except the suites the
# build above already ran that do not touch the model runtime's build options (fault, fuzz,
# gpu, the 1.7B integration-bigmodel run); the torch-reference tests do not exist there.
NOTORCH="${BUILD}-notorch"
cmake -S . -B "$NOTORCH" -DCMAKE_BUILD_TYPE=Release -DPOLYKV_BUILD_TESTS=ON \
  -DPOLYKV_BUILD_BENCHMARKS=OFF -DPOLYKV_WITH_TORCH=OFF "${LAUNCHER[@]}" </dev/null
cmake --build "$NOTORCH" -j"$JOBS" </dev/null
ctest --test-dir "$NOTORCH" --output-on-failure --no-tests=error -j"$JOBS" \
  -LE 'fault|fuzz|gpu|bigmodel' </dev/null

if [ "${POLYKV_CI_SANITIZE:-0}" = 1 ]; then
  bash scripts/sanitize.sh asan
  bash scripts/sanitize.sh tsan
fi
