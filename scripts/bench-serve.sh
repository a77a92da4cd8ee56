#!/usr/bin/env bash
# N questions about the demo document, from a cold start (no daemon, document not prefilled)
# to the last answer, two ways in the same run:
#   host:      polykvd + pools create + ONE `polykv-cli agents serve` process answering N
#              concurrent chat requests (batched decode, OpenAI-compatible HTTP, curl clients)
#   processes: polykvd + pools create + `polykv-cli agents run` (N separate agent processes,
#              -j JOBS at once): the default set-up before the host
# Prints wall time, tokens, the drop of MemAvailable (sampled every 0.1 s) and the processes'
# peak RSS for each, and the host's decode figures from its /metrics. Then runs
# bench_batch_decode (decode tok/s with 1..N sessions, bytes read per step) when built.
#
# Usage: bash scripts/bench-serve.sh [-n N (16)] [-j JOBS (2)] [--max-new-tokens T (48)]
#                                    [--model PATH.gguf] [--build-dir DIR] [--codec SPEC]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N=16
JOBS=2
MAX_NEW=48
CODEC=default
MODEL="${POLYKV_SMOLLM2_GGUF:-}"
BUILD="${POLYKV_BUILD_DIR:-$ROOT/build}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    -j) JOBS="$2"; shift 2 ;;
    --max-new-tokens) MAX_NEW="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --codec) CODEC="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench-serve: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $MODEL && -f $MODEL ]] || MODEL="$(bash "$ROOT/scripts/fetch-model.sh" | tail -n 1)"
CLI="$BUILD/cli/polykv-cli"
DAEMON="$BUILD/daemon/polykvd"
[[ -x $CLI && -x $DAEMON ]] || { echo "bench-serve: build polykv-cli and polykvd first" >&2; exit 1; }
WORK="$(mktemp -d /tmp/polykv-bench-serve-XXXXXX)"
export POLYKV_ENDPOINT="ipc://$WORK/control.sock"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

{ printf '<|im_start|>system\nYou answer questions about this article.\n\n'
  cat "$ROOT/data/wikitext-2/robert_boulter.txt"; printf '<|im_end|>\n'; } >"$WORK/doc.txt"
grep -v '^#' "$ROOT/data/questions.txt" | grep -v '^$' | head -n "$N" >"$WORK/questions.txt"

mem_available() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
# Samples MemAvailable (KiB) every 0.1 s into $1 until killed.
sample_memory() { while true; do mem_available >>"$1"; sleep 0.1; done; }
peak_drop_mib() {  # baseline KiB, samples file
  awk -v base="$1" 'BEGIN {min = base} {if ($1 < min) min = $1} END {printf "%.0f", (base - min) / 1024}' "$2"
}
hwm_mib() { awk '/^VmHWM:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }
now() { date +%s.%N; }

start_daemon() {
  rm -f "$WORK/control.sock"
  "$DAEMON" --endpoint "$POLYKV_ENDPOINT" --backend host --log-level warn \
    --shm-prefix "/polykv-bs$$-$1-" </dev/null >"$WORK/polykvd-$1.log" 2>&1 &
  DPID=$!
  PIDS+=("$DPID")
  for _ in $(seq 1 200); do "$CLI" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "bench-serve: polykvd did not start" >&2; cat "$WORK/polykvd-$1.log" >&2; exit 1
}
create_pool() {
  "$CLI" pools create --model "$MODEL" --document "$WORK/doc.txt" --no-bos --codec "$CODEC" \
    </dev/null | tail -n 1
}
# The start of run $1: memory baseline (BASE) and sampler (SAMPLER), then a daemon and the
# pool (POOL); T_START before the daemon, T_POOL once the pool is created.
begin_run() {
  sync; sleep 1
  BASE=$(mem_available)
  sample_memory "$WORK/mem-$1" & SAMPLER=$!
  T_START=$(now)
  start_daemon "$1"
  POOL=$(create_pool)
  T_POOL=$(now)
}
# Stops run $1's memory sampler and sets the variable named $2 to the peak MemAvailable drop
# (MiB) against BASE.
end_sampling() {
  kill "$SAMPLER"; wait "$SAMPLER" 2>/dev/null || true
  printf -v "$2" '%s' "$(peak_drop_mib "$BASE" "$WORK/mem-$1")"
}

# ---- 1. the host ------------------------------------------------------------------------
begin_run host
T0=$T_START TP1=$T_POOL
"$CLI" agents serve --pool "$POOL" --model "$MODEL" --listen 127.0.0.1:0 --alias doc \
  --max-sessions "$N" </dev/null >"$WORK/host.log" 2>&1 &
HPID=$!
PIDS+=("$HPID")
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/host.log")
  [[ -n $PORT ]] && break
  sleep 0.05
done
[[ -n $PORT ]] || { cat "$WORK/host.log" >&2; exit 1; }
TR1=$(now)
# Request bodies first, then every client at once.
python3 - "$WORK" "$MAX_NEW" <<'EOF'
import json, sys
work, max_new = sys.argv[1], int(sys.argv[2])
for i, q in enumerate(open(f"{work}/questions.txt").read().splitlines()):
    body = {"model": "doc", "messages": [{"role": "user", "content": q}],
            "max_tokens": max_new, "temperature": 0}
    open(f"{work}/body-{i}.json", "w").write(json.dumps(body))
EOF
CURLS=()
for ((i = 0; i < $(wc -l <"$WORK/questions.txt"); i++)); do
  curl -s -X POST "http://127.0.0.1:$PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' -d "@$WORK/body-$i.json" -o "$WORK/answer-$i.json" &
  CURLS+=($!)
done
for c in "${CURLS[@]}"; do wait "$c"; done
T1=$(now)
HOST_HWM=$(hwm_mib "$HPID")
DAEMON_HWM=$(hwm_mib "$DPID")
curl -s "http://127.0.0.1:$PORT/metrics" >"$WORK/metrics"
end_sampling host HOST_DROP
HOST_TOKENS=$(cat "$WORK"/answer-*.json | python3 -c '
import json, sys
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; n = 0
while i < len(s):
    while i < len(s) and s[i].isspace(): i += 1
    if i >= len(s): break
    o, i = dec.raw_decode(s, i); n += o["usage"]["completion_tokens"]
print(n)')
kill "$HPID" "$DPID"; wait "$HPID" "$DPID" 2>/dev/null || true
metric() { awk -v k="$1" '$1 == k {print $2}' "$WORK/metrics"; }
GEN=$(metric polykv_host_generated_tokens_total)
DEC=$(metric polykv_host_decode_seconds_total)
PRE=$(metric polykv_host_prefill_seconds_total)
STEPS=$(metric polykv_host_steps_total)
ROWS=$(metric polykv_host_step_rows_total)
WB=$(metric polykv_host_weight_bytes_per_step)
PB=$(metric polykv_host_prefix_bytes_per_step)

# ---- 2. N separate agent processes ---------------------------------------------------------
begin_run proc
T2=$T_START TP2=$T_POOL
"$CLI" agents run --pool "$POOL" --model "$MODEL" --questions "$WORK/questions.txt" -n "$N" \
  -j "$JOBS" --max-new-tokens "$MAX_NEW" --no-baseline --json </dev/null >"$WORK/agents.json"
T3=$(now)
DAEMON2_HWM=$(hwm_mib "$DPID")
end_sampling proc PROC_DROP
read -r PROC_TOKENS AGENT_RSS <<<"$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
agents = j.get("agents", [])
toks = sum(a.get("result", {}).get("stats", {}).get("new_tokens", 0) for a in agents)
rss = max((a.get("peak_rss_bytes", 0) for a in agents), default=0) / 1048576
print(toks, "%.1f" % rss)' "$WORK/agents.json")"
kill "$DPID"; wait "$DPID" 2>/dev/null || true

HOST_S=$(python3 -c "print('%.1f' % ($T1 - $T0))")
PROC_S=$(python3 -c "print('%.1f' % ($T3 - $T2))")
printf '\n%s questions, %s new tokens max, %s, codec %s, %s cores\n' "$N" "$MAX_NEW" \
  "$(basename "$MODEL")" "$CODEC" "$(nproc)"
printf '%-52s %14s %14s %8s\n' "figure (cold start -> last answer)" "agents serve" \
  "agents run -j$JOBS" "ratio"
printf '%-52s %14s %14s %7.2fx\n' "wall time, s" "$HOST_S" "$PROC_S" \
  "$(python3 -c "print($HOST_S / $PROC_S)")"
printf '%-52s %14s %14s\n' "  of which daemon start + pools create, s" \
  "$(python3 -c "print('%.1f' % ($TP1 - $T0))")" "$(python3 -c "print('%.1f' % ($TP2 - $T2))")"
printf '%-52s %14s %14s\n' "  of which host start (load, attach), s" \
  "$(python3 -c "print('%.1f' % ($TR1 - $TP1))")" "-"
printf '%-52s %14s %14s\n' "  of which answering all questions, s" \
  "$(python3 -c "print('%.1f' % ($T1 - $TR1))")" "$(python3 -c "print('%.1f' % ($T3 - $TP2))")"
printf '%-52s %14s %14s\n' "tokens generated" "$HOST_TOKENS" "$PROC_TOKENS"
printf '%-52s %14s %14s\n' "peak drop of MemAvailable, MiB" "$HOST_DROP" "$PROC_DROP"
printf '%-52s %14s %14s\n' "peak RSS: host process / largest agent, MiB" "$HOST_HWM" "$AGENT_RSS"
printf '%-52s %14s %14s\n' "peak RSS of polykvd, MiB" "$DAEMON_HWM" "$DAEMON2_HWM"
python3 - "$GEN" "$DEC" "$STEPS" "$ROWS" "$WB" "$PB" "$PRE" <<'EOF'
import sys
gen, dec, steps, rows, wb, pb, pre = (float(x) for x in sys.argv[1:])
print(f"{'host: seconds in prompt forwards / batched steps':52s} {pre:14.1f} {dec:14.1f}")
print(f"{'host: decode tok/s inside batched steps':52s} {gen / dec if dec else 0:14.1f}")
print(f"{'host: batched steps, mean sessions per step':52s} {steps:14.0f} {rows / steps if steps else 0:14.2f}")
print(f"{'host: MiB read per step (weights + pool, once)':52s} {(wb + pb) / 1048576:14.2f}")
print(f"{'  N separate agents read per step, MiB':52s} {rows / steps * (wb + pb) / 1048576 if steps else 0:14.2f}")
EOF
if [[ -x $BUILD/bench/bench_batch_decode ]]; then
  printf '\n==> bench_batch_decode (decode tok/s, 1 vs many sessions, same run)\n'
  POLYKV_SOURCE_DIR="$ROOT" "$BUILD/bench/bench_batch_decode" --model "$MODEL" --sessions "1,2,4,8,$N" --steps "$MAX_NEW"
fi
