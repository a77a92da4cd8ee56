#!/usr/bin/env bash
# Sanitizer runs (documented here rather than in every CI run: each is a full extra build).
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer build
#                              (POLYKV_SANITIZE=ON) running the unit and integration tests
#                              and the fault suite (labels gpu and bigmodel excluded).
#   scripts/sanitize.sh tsan   ThreadSanitizer build (POLYKV_TSAN=ON) running the ipc,
#                              daemon and client tests.
# Options: --build-dir DIR (default build-asan / build-tsan), --jobs N, --target T (repeat
# it to build only these targets instead of the mode's default set), extra arguments after
# -- go to ctest (e.g. -- -R DaemonFaults). Suppressions for third-party libraries that are
# not instrumented (libtorch, OpenMP, protobuf) are in scripts/sanitizers/.
# CI runs this when POLYKV_CI_SANITIZE=1 (see scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-}"
shift || true
case "$MODE" in
  asan|tsan) ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
BUILD="build-$MODE"
JOBS="${POLYKV_JOBS:-$(nproc)}"
CTEST_ARGS=()
ONLY_TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --target) ONLY_TARGETS+=("$2"); shift 2 ;;
    --) shift; CTEST_ARGS=("$@"); break ;;
    *) echo "sanitize: unknown argument $1" >&2; exit 2 ;;
  esac
done
SUPP="$PWD/scripts/sanitizers"
if [ "$MODE" = asan ]; then
  FLAG=-DPOLYKV_SANITIZE=ON
  # Unit + integration + fault tests; the kernels and model binaries are built too.
  TARGETS=()
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_odr_violation=0:suppressions=$SUPP/asan.supp"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp"
  SELECT=(--label-exclude 'gpu|bigmodel')
else
  FLAG=-DPOLYKV_TSAN=ON
  TARGETS=(--target ipc_protocol_test ipc_pool_layout_test ipc_shm_region_test
           ipc_sealed_region_test daemon_pool_manager_test daemon_server_test
           daemon_faults_test daemon_process_test daemon_process_faults_test client_api_test
           client_daemon_test cli_pools_test test_support_test polykvd polykv-cli)
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp"
  SELECT=(-R '^(Protocol|PoolLayout|ShmRegion|SealedRegion|PoolManager|DaemonServer|DaemonFlags|ParseByteSize|PoolManagerFaults|DaemonFaults|ModelWeightBytes|ProcessTest|ProcessFaults|RootFaults|Client|FakePool|CliPools|TestSupport)')
fi
if [ ${#ONLY_TARGETS[@]} -gt 0 ]; then TARGETS=(--target "${ONLY_TARGETS[@]}"); fi
echo "sanitize: $MODE build in $BUILD" >&2
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$FLAG" -DPOLYKV_BUILD_TESTS=ON \
  -DPOLYKV_BUILD_BENCHMARKS=OFF -DPOLYKV_ENABLE_CUDA=OFF </dev/null
cmake --build "$BUILD" -j"$JOBS" "${TARGETS[@]}" </dev/null
if [ -z "${POLYKV_SMOLLM2_GGUF:-}" ]; then unset POLYKV_SMOLLM2_GGUF; fi
# libucs (linked into polykv_ipc) patches libc's mmap/munmap/madvise/brk at load time (UCX
# memory events, bistro hooks); a thread's exit then calls the patched madvise, whose rwlock
# the sanitizer intercepts after it has torn the thread down: SEGV in every test that joins a
# thread. The sanitized tests do not need UCX's memory events.
export UCX_MEM_EVENTS="${UCX_MEM_EVENTS:-no}"
# The attach storm's 256 instrumented processes on a small machine outlast the client's
# best-effort DETACH (two tries of at most 1 s, a library constant): 64 processes under the
# sanitizers (the plain suite keeps 256).
export POLYKV_STORM_PROCESSES="${POLYKV_STORM_PROCESSES:-64}"
# Instrumented processes start and run several times slower: stretch the tests' bounds.
export POLYKV_TEST_TIMEOUT_SCALE="${POLYKV_TEST_TIMEOUT_SCALE:-4}"
ctest --test-dir "$BUILD" --output-on-failure --no-tests=error -j"$JOBS" "${SELECT[@]}" \
  "${CTEST_ARGS[@]}" </dev/null
