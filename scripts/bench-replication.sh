#!/usr/bin/env bash
# bench-replication.sh: pools shared between two hosts, measured between two network
# namespaces joined by a veth pair (UCX over TCP), in one run:
#  1. replication bandwidth of a 4,096-token Llama-3-8B-shaped K8/V3 pool (188.8 MB): PolyKV's
#     UcxEngine pull (bench_replication) next to ucx_perftest -t ucp_get -s 8388608 -n 200;
#  2. with polykvd A (prefills) and polykvd B (--peer A) and the SmolLM2 GGUF
#     ($POLYKV_SMOLLM2_GGUF or scripts/fetch-model.sh's path): a remote agent's time to first
#     token on B (fetch + attach + prompt) next to prefilling the document locally on B, and
#     an agent on B once the replica is there.
# Needs root.
#   usage: scripts/bench-replication.sh [path/to/build]   (REPS=5 by default)
set -euo pipefail

BUILD=${1:-build}
[[ -d "$BUILD" ]] || { echo "bench-replication: no build folder $BUILD" >&2; exit 1; }
BUILD=$(readlink -f "$BUILD")
BIN=$BUILD/bench/bench_replication
REPS=${REPS:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${POLYKV_SMOLLM2_GGUF:-$HOME/.cache/polykv/models/SmolLM2-135M-Instruct.Q4_1.gguf}

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-replication: SKIPPED: needs root (creates network namespaces and a veth pair)"
  exit 0
fi
for tool in ip ucx_perftest; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench-replication: $tool not found (scripts/install-deps.sh installs ucx-utils)" >&2
    exit 1
  fi
done
if [ ! -x "$BIN" ]; then
  echo "bench-replication: $BIN is not built (cmake --build <dir> --target bench_replication)" >&2
  exit 1
fi
BIN=$(readlink -f "$BIN")

NA=pkvA$$
NB=pkvB$$
VA=pkva$$
VB=pkvb$$
OCT=$(($$ % 250 + 1))
IPA=10.213.$OCT.1
IPB=10.213.$OCT.2
PERF_PORT=$((20000 + $$ % 20000))
DESC_PORT=$((PERF_PORT + 1))
TMP=$(mktemp -d /tmp/pkv-bench-repl.XXXXXX)
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns del "$NA" 2>/dev/null || true
  ip netns del "$NB" 2>/dev/null || true
  ip link del "$VA" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NA"
ip netns add "$NB"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$NA"
ip link set "$VB" netns "$NB"
ip -n "$NA" addr add "$IPA/24" dev "$VA"
ip -n "$NB" addr add "$IPB/24" dev "$VB"
ip -n "$NA" link set lo up
ip -n "$NB" link set lo up
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up
echo "bench-replication: namespaces $NA ($IPA) and $NB ($IPB), veth $VA/$VB, UCX_TLS=tcp"

# Waits until `file` contains `pattern` (or the process `pid` died), at most 30 s.
wait_for() {
  local file=$1 pattern=$2 pid=$3 i
  for i in $(seq 300); do
    if grep -q "$pattern" "$file" 2>/dev/null; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench-replication: server exited early:" >&2
      cat "$file" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "bench-replication: timed out waiting for '$pattern' in $file" >&2
  return 1
}

# Baseline: ucx_perftest one-sided get, 8 MiB messages, server in A, client in B.
UCX_TLS=tcp ip netns exec "$NA" ucx_perftest -p "$PERF_PORT" >"$TMP/perf-server.log" 2>&1 &
PIDS+=($!)
sleep 1
perf_out=""
for attempt in 1 2 3 4 5; do
  if perf_out=$(UCX_TLS=tcp ip netns exec "$NB" ucx_perftest "$IPA" -p "$PERF_PORT" \
      -t ucp_get -s 8388608 -n 200 2>&1); then
    break
  fi
  sleep 1
done
echo "$perf_out" | tail -3
# Final: iterations, latency 50%ile/average/overall, bandwidth average (last interval)/overall
PERF_MBPS=$(echo "$perf_out" | awk '$1 == "Final:" {print $7}')
if [ -z "$PERF_MBPS" ]; then
  echo "bench-replication: could not read ucx_perftest's bandwidth:" >&2
  echo "$perf_out" >&2
  exit 1
fi

# PolyKV: bench_replication holds the region in A, pulls it from B.
UCX_TLS=tcp ip netns exec "$NA" "$BIN" --serve --port "$DESC_PORT" >"$TMP/serve.log" 2>&1 &
PIDS+=($!)
wait_for "$TMP/serve.log" READY "${PIDS[-1]}"
grep -v READY "$TMP/serve.log"
UCX_TLS=tcp ip netns exec "$NB" "$BIN" --fetch "$IPA:$DESC_PORT" --reps "$REPS" | tee "$TMP/fetch.log"

BEST=$(awk '$1 == "RESULT" && $2 == "best_median_mbps" {print $3}' "$TMP/fetch.log")
BEST_SET=$(awk '$1 == "RESULT" && $2 == "best_median_mbps" {print $5 " MiB x " $7}' \
  "$TMP/fetch.log")
DEF=$(awk '$1 == "RESULT" && $2 == "default_median_mbps" {print $3}' "$TMP/fetch.log")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

echo
printf '%-46s %-5s %10s %17s %7s\n' "figure (A -> B over veth, UCX_TLS=tcp)" unit PolyKV \
  "ucx_perftest get" ratio
printf '%-46s %-5s %10s %17s %7s\n' "pull bandwidth, best ($BEST_SET outstanding)" MB/s "$BEST" \
  "$PERF_MBPS" "$(ratio "$BEST" "$PERF_MBPS")"
printf '%-46s %-5s %10s %17s %7s\n' "pull bandwidth, defaults (4 MiB x 8)" MB/s "$DEF" \
  "$PERF_MBPS" "$(ratio "$DEF" "$PERF_MBPS")"
echo "(MB/s = 2^20 bytes/s as ucx_perftest counts; PolyKV: median of $REPS pulls of the whole"
echo " region, checksum verified; baseline: overall bandwidth of 200 gets of 8 MiB, one at a"
echo " time; goal ratio >= 0.80)"
if awk -v r="$(ratio "$BEST" "$PERF_MBPS")" 'BEGIN {exit !(r >= 0.80)}'; then
  echo "bench-replication: goal met (best ratio >= 0.80)"
else
  echo "bench-replication: goal NOT met (best ratio < 0.80)"
fi

# ---- 2. a remote agent through two daemons ---------------------------------------------
DAEMON=$BUILD/daemon/polykvd
CLI=$BUILD/cli/polykv-cli
if [[ ! -x "$DAEMON" || ! -x "$CLI" || ! -f "$MODEL" ]]; then
  echo "bench-replication: part 2 SKIPPED: needs $DAEMON, $CLI and the SmolLM2 GGUF at $MODEL"
  exit 0
fi
PORT=$((DESC_PORT + 1))
EPA=tcp://$IPA:$PORT
EPB=tcp://$IPB:$PORT
"$CLI" keys generate "$TMP/a.key" >"$TMP/a.pub" 2>/dev/null
"$CLI" keys generate "$TMP/b.key" >"$TMP/b.pub" 2>/dev/null
printf '%s %s\n%s %s\n' "$(cat "$TMP/a.pub")" "$EPA" "$(cat "$TMP/b.pub")" "$EPB" >"$TMP/peers"
mkdir -p "$TMP/a" "$TMP/b"
UCX_TLS=tcp ip netns exec "$NA" "$DAEMON" --endpoint "ipc://$TMP/a/c.sock" --backend host \
  --threads 1 --listen "$EPA" --key-file "$TMP/a.key" --peer-keys-file "$TMP/peers" \
  --log-level info >"$TMP/a.log" 2>&1 </dev/null &
PIDS+=($!)
UCX_TLS=tcp ip netns exec "$NB" "$DAEMON" --endpoint "ipc://$TMP/b/c.sock" --backend host \
  --threads 1 --listen "$EPB" --peer "$EPA" --key-file "$TMP/b.key" \
  --peer-keys-file "$TMP/peers" --log-level info >"$TMP/b.log" 2>&1 </dev/null &
PIDS+=($!)
wait_for "$TMP/b.log" "is up" "${PIDS[-1]}"
{
  printf '<|im_start|>system\nYou answer questions about this article.\n\n'
  cat "$ROOT/data/wikitext-2/robert_boulter.txt"
  printf '<|im_end|>\n'
} >"$TMP/document.txt"
POOL=$("$CLI" pools create --endpoint "ipc://$TMP/a/c.sock" --model "$MODEL" \
  --document "$TMP/document.txt" --no-bos </dev/null 2>/dev/null | tail -n 1)
if [[ ! "$POOL" =~ ^[0-9a-f]{64}$ ]]; then
  echo "bench-replication: pools create failed" >&2
  cat "$TMP/a.log" >&2
  exit 1
fi
agent_b() {
  UCX_TLS=tcp ip netns exec "$NB" "$CLI" agent --endpoint "ipc://$TMP/b/c.sock" --pool "$POOL" \
    --model "$MODEL" --chat --prompt "Who is Robert Boulter?" --max-new-tokens 8 --json \
    --threads 1 "$@" </dev/null
}
FIRST=$(agent_b --baseline-prefill)
SECOND=$(agent_b)
field() { python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"; }
R_TTFT=$(field "$FIRST" "'%.1f' % j['stats']['ttft_ms']")
R_ATTACH=$(field "$FIRST" "'%.1f' % j['stats']['attach_ms']")
B_TTFT=$(field "$FIRST" "'%.1f' % j['baseline']['ttft_ms']")
L_TTFT=$(field "$SECOND" "'%.1f' % j['stats']['ttft_ms']")
SAME=$(field "$FIRST" "j['answer_ids'] == j['baseline']['answer_ids']")
TOKENS=$(field "$FIRST" "j['stats']['document_tokens']")
FETCHED=$(grep -o 'fetched pool .*' "$TMP/b.log" | head -n 1)
echo
echo "remote agent on host B, pool prefilled on host A ($TOKENS tokens, SmolLM2-135M Q4_1, 1 thread)"
printf '%-52s %-4s %10s %14s %8s\n' figure unit PolyKV "local prefill" ratio
printf '%-52s %-4s %10s %14s %8s\n' "TTFT, first agent on B (fetch + attach + prompt)" ms \
  "$R_TTFT" "$B_TTFT" "$(ratio "$B_TTFT" "$R_TTFT")x"
printf '%-52s %-4s %10s\n' "  of which attach (incl. the replication from A)" ms "$R_ATTACH"
printf '%-52s %-4s %10s %14s %8s\n' "TTFT, next agent on B (replica held by B)" ms "$L_TTFT" \
  "$B_TTFT" "$(ratio "$B_TTFT" "$L_TTFT")x"
echo "daemon B: $FETCHED"
echo "greedy answer through the replica equals the local prefill's: $SAME"
