#!/usr/bin/env bash
# PolyKV end-to-end demo on a fresh machine: install deps, build, fetch SmolLM2-135M-Instruct,
# start polykvd (host backend, private endpoint), publish ONE compressed pool of the first
# WikiText-2 article, launch N separate agent processes that each ask a different question,
# print the answers and the memory / time-to-first-token table, then stop the daemon and
# check that no socket or shared-memory segment is left behind.
#
# Usage: bash scripts/demo.sh [-n AGENTS (default 4, up to 64)] [-j JOBS] [--codec default|paper|k8v3|none|SPEC]
#                             [--max-new-tokens N] [--questions FILE] [--model PATH.gguf]
#                             [--skip-deps] [--skip-build] [--build-dir DIR]
# Non-interactive (reads no stdin). Exit status 0 only when every agent answered and the
# cleanup check passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N=4
JOBS=""
CODEC="default"  # the measured default codec (README: Choosing the default codec)
MAX_NEW=48
QUESTIONS="$ROOT/data/questions.txt"
MODEL="${POLYKV_SMOLLM2_GGUF:-}"
SKIP_DEPS=0
SKIP_BUILD=0
BUILD="${POLYKV_BUILD_DIR:-$ROOT/build}"

die() { echo "demo: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    -j) JOBS="$2"; shift 2 ;;
    --codec) CODEC="$2"; shift 2 ;;
    --max-new-tokens) MAX_NEW="$2"; shift 2 ;;
    --questions) QUESTIONS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --skip-deps) SKIP_DEPS=1; shift ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ "$N" =~ ^[0-9]+$ ]] && (( N >= 1 && N <= 64 )) || die "-n must be 1..64 (got '$N')"
[[ -z "$JOBS" || "$JOBS" =~ ^[0-9]+$ ]] || die "-j must be a number (got '$JOBS')"
[[ -f "$QUESTIONS" ]] || die "questions file $QUESTIONS not found"
DOC="$ROOT/data/wikitext-2/robert_boulter.txt"
[[ -f "$DOC" ]] || die "demo document $DOC not found"

step() { printf '\n==> %s\n' "$*"; }

# ---- 1. dependencies, build, model ------------------------------------------------------
if (( ! SKIP_DEPS )); then
  step "installing dependencies (scripts/install-deps.sh)"
  bash "$ROOT/scripts/install-deps.sh" </dev/null
fi
if (( ! SKIP_BUILD )); then
  step "building (Release) into $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release </dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target polykvd polykv-cli </dev/null
fi
DAEMON="$BUILD/daemon/polykvd"
CLI="$BUILD/cli/polykv-cli"
[[ -x "$DAEMON" && -x "$CLI" ]] || die "polykvd / polykv-cli not found under $BUILD (build first)"
if [[ -z "$MODEL" ]]; then
  step "fetching SmolLM2-135M-Instruct (scripts/fetch-model.sh)"
  MODEL="$(bash "$ROOT/scripts/fetch-model.sh" </dev/null | tail -n 1)"
fi
[[ -f "$MODEL" ]] || die "model file '$MODEL' not found"

# ---- 2. daemon on a private endpoint; cleanup on any exit ---------------------------------
WORK="$(mktemp -d /tmp/polykv-demo-XXXXXX)"
SOCK="$WORK/control.sock"
export POLYKV_ENDPOINT="ipc://$SOCK"
# The daemon's own memfd / shm name prefix: the cleanup check below looks at this demo's
# names only, and the daemon's start-up sweep of stale segments cannot touch another
# process's /dev/shm/polykv-* (a test suite running beside the demo, say).
SHM_PREFIX="/polykv-demo-${WORK##*-}-"
DAEMON_PID=""
POOL=""
cleanup() {
  local rc=$? leftover=""
  set +e
  if [[ -n "$DAEMON_PID" ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"
    for _ in $(seq 1 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
      echo "demo: polykvd did not stop on SIGTERM; killing it" >&2
      kill -KILL "$DAEMON_PID"; rc=1
    fi
    wait "$DAEMON_PID" 2>/dev/null
    local drc=$?
    (( drc == 0 )) || { echo "demo: polykvd exited with status $drc" >&2; rc=1; }
  fi
  [[ -e "$SOCK" ]] && leftover+=" $SOCK"
  [[ -e "$SOCK.pid" ]] && leftover+=" $SOCK.pid"
  for seg in $(ls /dev/shm 2>/dev/null | grep -F "${SHM_PREFIX#/}" || true); do
    [[ "$seg" == "${SHM_PREFIX#/}"* ]] && leftover+=" /dev/shm/$seg"
  done
  if [[ -n "$leftover" ]]; then
    echo "demo: FAILED cleanup check, left behind:$leftover" >&2
    [[ -f "$WORK/polykvd.log" ]] && tail -n 20 "$WORK/polykvd.log" >&2
    rc=1
  elif [[ -n "$DAEMON_PID" ]]; then
    echo "demo: daemon stopped; no socket or /dev/shm/${SHM_PREFIX#/}* segment left behind"
  fi
  (( rc == 0 )) || { [[ -f "$WORK/polykvd.log" ]] && echo "demo: daemon log: $WORK/polykvd.log" >&2; }
  (( rc != 0 )) || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "starting polykvd (host backend) at $POLYKV_ENDPOINT"
"$DAEMON" --endpoint "$POLYKV_ENDPOINT" --backend host --log-level info --shm-prefix "$SHM_PREFIX" \
  </dev/null >"$WORK/polykvd.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 100); do
  "$CLI" ping >/dev/null 2>&1 && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$WORK/polykvd.log" >&2; die "polykvd exited"; }
  sleep 0.2
done
"$CLI" ping </dev/null || die "polykvd does not answer"

# ---- 3. one pool: the article inside a system turn of the model's own chat template --------
# (GGUF tokenizer.chat_template; the agents render their question turns after it with the same
# template: `agent --chat`).
step "creating the shared pool ($CODEC) from $(basename "$DOC")"
POOL="$("$CLI" pools create --model "$MODEL" --document "$DOC" \
          --chat-system "You answer questions about this article." \
          --codec "$CODEC" --no-bos </dev/null | tail -n 1)"
[[ "$POOL" =~ ^[0-9a-f]{64}$ ]] || die "pools create did not print a pool id (got '$POOL')"
"$CLI" pools show "$POOL" </dev/null

# ---- 4. N separate agent processes --------------------------------------------------------
step "launching $N agent processes${JOBS:+ (-j $JOBS)}"
"$CLI" agents run --pool "$POOL" --model "$MODEL" --questions "$QUESTIONS" -n "$N" \
  ${JOBS:+-j "$JOBS"} --max-new-tokens "$MAX_NEW" </dev/null

# ---- 5. what the codec lost: pools verify re-prefills the document and measures each layer -
step "fidelity of the pool ($CODEC): pools verify"
"$CLI" pools show "$POOL" --json </dev/null >"$WORK/show.json"
"$CLI" pools verify "$POOL" --model "$MODEL" --json </dev/null >"$WORK/verify.json" ||
  die "pools verify failed (see above)"
python3 - "$WORK/show.json" "$WORK/verify.json" <<'PY'
import json, sys
show = json.load(open(sys.argv[1])); ver = json.load(open(sys.argv[2]))
pool = show.get("pool", show)
rows = [r for r in ver["layers"] if "measured_key_rel_mse" in r]
print(f"pool {pool['total_bytes']:,} bytes vs {pool['bf16_bytes']:,} bf16: "
      f"{pool['effective_ratio']:.2f}x; codec {pool['codec']}")
if not rows:
    print(f"relative MSE: not measured (payload checksum {ver['payload_checksum']})")
    sys.exit(0)
def stat(key):
    xs = [r[key] for r in rows]
    return sum(xs) / len(xs), max(xs)
km, kx = stat("measured_key_rel_mse"); vm, vx = stat("measured_value_rel_mse")
print(f"relative MSE vs a fresh prefill ({len(rows)} layers, pools verify): "
      f"keys mean {km:.2e} max {kx:.2e}, values mean {vm:.2e} max {vx:.2e}; "
      f"payload checksum {ver['payload_checksum']}, matches the recorded errors: {ver['ok']}")
PY
