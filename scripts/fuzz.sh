#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each one, printing
# executions, coverage, corpus size and crashes as a table.
#   scripts/fuzz.sh [--seconds S | --runs N] [--build-only] [--build-dir DIR] [TARGET...]
# Default: 30 s per target (the CI short run); scripts/fuzz-bench.sh runs >= 1,000,000
# executions each. Targets: fuzz_protocol fuzz_gguf fuzz_safetensors fuzz_tokenizer
# fuzz_tokenizer_json. Seeds come from tests/fuzz/corpus/<target> (never modified: the run
# works on a copy); crashing inputs are kept in <build-dir>/artifacts/<target>/.
# Exit status: 0 when nothing crashed, 1 on a finding, 77 when clang/libFuzzer is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER=30
RUNS=""
BUILD_ONLY=0
BUILD="${POLYKV_FUZZ_BUILD_DIR:-build-fuzz}"
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER="$2"; RUNS=""; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_protocol fuzz_gguf fuzz_safetensors fuzz_tokenizer
                                     fuzz_tokenizer_json)

CLANGXX="${POLYKV_CLANGXX:-$(command -v clang++ || true)}"
CLANG="${POLYKV_CLANG:-$(command -v clang || true)}"
if [ -z "$CLANGXX" ] || [ -z "$CLANG" ]; then
  echo "fuzz: SKIPPED: clang is not installed (scripts/install-deps.sh installs it)" >&2
  exit 77
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$CLANGXX" -x c++ -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz: SKIPPED: $CLANGXX cannot link libFuzzer (-fsanitize=fuzzer; libclang-rt-dev)" >&2
  exit 77
fi

JOBS="${POLYKV_JOBS:-$(nproc)}"
mkdir -p "$BUILD"
LOCK="$BUILD/.build.lock"
(
  flock 9  # one build at a time (ctest may start several fuzz tests together)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CLANG" \
      -DCMAKE_CXX_COMPILER="$CLANGXX" -DPOLYKV_BUILD_FUZZERS=ON -DPOLYKV_BUILD_TESTS=OFF \
      -DPOLYKV_BUILD_BENCHMARKS=OFF -DPOLYKV_ENABLE_CUDA=OFF </dev/null >"$BUILD/configure.log" 2>&1 ||
      { cat "$BUILD/configure.log" >&2; exit 1; }
  fi
  cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" </dev/null >"$BUILD/build.log" 2>&1 ||
    { tail -n 60 "$BUILD/build.log" >&2; exit 1; }
) 9>"$LOCK"
[ "$BUILD_ONLY" = 1 ] && { echo "fuzz: built ${TARGETS[*]} in $BUILD" >&2; exit 0; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
rows=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD/tests/fuzz/$t"
  seeds="tests/fuzz/corpus/$t"
  work="$(mktemp -d "${TMPDIR:-/tmp}/polykv-$t.XXXXXX")"
  art="$BUILD/artifacts/$t"
  mkdir -p "$art"
  cp -r "$seeds/." "$work/"
  limit=(-max_total_time="$SECONDS_PER")
  [ -n "$RUNS" ] && limit=(-runs="$RUNS")
  log="$BUILD/$t.log"
  echo "fuzz: $t ${limit[*]} (log $log)" >&2
  set +e
  "$bin" "${limit[@]}" -print_final_stats=1 -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
    -artifact_prefix="$art/" "$work" >"$log" 2>&1 </dev/null
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || true)
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || true)
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | grep -o '[0-9]*' || true)
  crashes=$(find "$art" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -newer "$LOCK" | wc -l)
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz: $t FAILED (exit $rc); artifacts in $art; last lines of $log:" >&2
    tail -n 40 "$log" >&2
  fi
  rows+=("| $t | ${execs:-?} | ${speed:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $crashes |")
  rm -rf "$work"
done
echo
echo "| target | executions | exec/s | coverage (edges) | features | corpus | crashes |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $status
