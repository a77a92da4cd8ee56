#!/usr/bin/env bash
# Runs every libFuzzer target for at least 1,000,000 executions (more with --runs N) and
# prints executions, coverage and crashes per target (see scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=1000000
if [ "${1:-}" = "--runs" ]; then RUNS="$2"; shift 2; fi
exec bash scripts/fuzz.sh --runs "$RUNS" "$@"
