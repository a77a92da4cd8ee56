#!/usr/bin/env bash
# Installs the Debian packages PolyKV builds and runs with. Idempotent: does nothing when
# every package is already installed. Non-interactive (CI has no stdin).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git python3 python3-pip
  libtorch-dev              # the f32 reference runtime of tests and benchmarks (polykv_model_torch)
  libblas-dev               # cblas.h and libblas.so: sgemm of long prefills (OpenBLAS at run time)
  libopenblas0-openmp       # fast BLAS for libtorch's matmuls (reference BLAS is ~30x slower)
  libzmq3-dev cppzmq-dev    # control channel (ZeroMQ + C++ bindings)
  libboost-dev              # Boost.Interprocess (POSIX shared memory)
  libabsl-dev               # absl::Status / StatusOr
  libgtest-dev libgmock-dev # tests
  nlohmann-json3-dev        # control-protocol messages, config.json
  libcli11-dev              # command-line flags
  libspdlog-dev             # logs
  libsystemd-dev            # sd_notify (READY, WATCHDOG)
  libsentencepiece-dev      # SentencePiece tokenizer.model files
  libssl-dev                # SHA-256 (pool ids, fingerprints)
  libxxhash-dev             # pool checksums (XXH64)
  libucx-dev ucx-utils      # transfer between hosts (UCX ucp_get); ucx_perftest baseline
  libcpp-httplib-dev        # polykvd --metrics-listen (GET /metrics); polykv-cli agents serve (HTTP)
  curl python3-prometheus-client  # tests: scrape /metrics, parse the text format
  clang libclang-rt-dev     # fault suite: libFuzzer targets (scripts/fuzz.sh); gcc builds the rest
  clang-format-14           # scripts/check-format.sh runs clang-format-14 (the version the tree is formatted with)
  util-linux                # setpriv (uid tests), flock (scripts/fuzz.sh)
  ccache                    # scripts/test.sh compiles through it: rebuilds and the second configuration reuse objects
  python3-venv python3-dev  # the polykv Python package (pip install ./python; ctest python_package)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -q </dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    "${missing[@]}" </dev/null
else
  echo "install-deps: all ${#PACKAGES[@]} packages already installed" >&2
fi

# libtorch multiplies matrices through whatever libblas.so.3 is selected: make it OpenBLAS.
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
if [ -e "$blas" ] && command -v update-alternatives >/dev/null; then
  cur=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || true)
  if [ "$cur" != "$(readlink -f "$blas")" ]; then
    $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu "$blas" >&2
  fi
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: no nvcc found: building the CPU path only (CUDA sources are skipped)" >&2
fi
