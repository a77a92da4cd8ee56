#!/usr/bin/env bash
# ctest `python_package` (label python): builds and installs the polykv package into a venv
# under the build folder (BUILD/pyvenv) with pip, from the repository's own CMake, then runs
# its pytest suite (which also runs python/examples/) against a real polykvd from BUILD and
# the real SmolLM2-135M-Instruct. pytest's "no tests collected" (exit 5) is a failure.
# Usage: python/tests/run_ctest.sh BUILD_DIR
# Needs: python3 with venv (Debian python3-venv) and pip access to PyPI (scikit-build-core,
# pybind11, pytest), polykvd and polykv-cli built in BUILD_DIR, the model
# ($POLYKV_SMOLLM2_GGUF, else scripts/fetch-model.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: run_ctest.sh BUILD_DIR}" && pwd)"
VENV="$BUILD/pyvenv"

if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV" || { echo "run_ctest: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "scikit-build-core>=0.8" "pybind11>=2.10" "pytest>=7"

# The same package `pip install ./python` builds; a persistent build folder makes reruns
# incremental, ccache (when present) shares objects with the main build.
cfg=(-C "build-dir=$BUILD/pywheel" -C "cmake.define.POLYKV_ENABLE_CUDA=OFF")
if command -v ccache >/dev/null; then
  cfg+=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps "${cfg[@]}" "$ROOT/python"

if [[ -z "${POLYKV_SMOLLM2_GGUF:-}" ]]; then
  POLYKV_SMOLLM2_GGUF="$(bash "$ROOT/scripts/fetch-model.sh" </dev/null | tail -n 1)"
fi
export POLYKV_SMOLLM2_GGUF POLYKV_BUILD_DIR="$BUILD"

# Run from outside the source tree so `import polykv` is the installed package.
cd "$BUILD"
set +e
"$VENV/bin/python" -m pytest -v -p no:cacheprovider "$ROOT/python/tests"
rc=$?
set -e
if (( rc == 5 )); then
  echo "run_ctest: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
