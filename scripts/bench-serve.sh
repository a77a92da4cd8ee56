#!/usr/bin/env bash
# N questions about the demo document, from a cold start (no daemon, document not prefilled)
# to the last answer, in the same run:
#   host:      polykvd + pools create + ONE `polykv-cli agents serve` process answering N
#              concurrent chat requests (batched decode, OpenAI-compatible HTTP, curl clients)
#   processes: polykvd + pools create + `polykv-cli agents run` (N separate agent processes,
#              -j JOBS at once): the default set-up before the host
#   llama-server (when a binary is given: --llama-server PATH or env LLAMA_SERVER; otherwise
#              a "SKIPPED" line), the same GGUF, threads and chat messages (system = the
#              document, rendered by the model's chat template; checked to give the same token
#              ids as PolyKV's pool + prompt), temperature 0:
#     -np N:   N slots (each with its own context of document + question + answer,
#              --no-kv-unified, --cont-batching) answering all N questions at once
#     -np 1:   one slot answering them in turn, its prompt cache reusing the document
#              (cache_prompt: true)
#              cold start = llama-server's start (model load, warm-up; /health answers) to
#              the last answer
# Prints wall time, tokens, the drop of MemAvailable (sampled every 0.1 s) and the processes'
# peak RSS for each, the host's decode figures from its /metrics, and the ratio of the host's
# time to the best llama-server set-up. Then runs bench_batch_decode (decode tok/s with 1..N
# sessions, bytes read per step) when built.
#
# Usage: bash scripts/bench-serve.sh [-n N (16)] [-j JOBS (2)] [--max-new-tokens T (48)]
#          [--threads T (2): agents serve --threads and llama-server -t/-tb]
#          [--model PATH.gguf] [--build-dir DIR] [--codec SPEC]
#          [--llama-server PATH (env LLAMA_SERVER)]
#          [--llama-args "ARGS" (--no-repack: this llama.cpp build's AMX-repacked Q4_1
#           weights crash with SIGSEGV in ggml_backend_amx_mul_mat on AMX CPUs)]
#          [--host-baseline-args "ARGS": first a host run with these extra agents serve
#           arguments, e.g. "--max-prompt-rows 0" (one prompt forward per joining session),
#           compared with the default host in the same run]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N=16
JOBS=2
MAX_NEW=48
THREADS=2
CODEC=default
MODEL="${POLYKV_SMOLLM2_GGUF:-}"
BUILD="${POLYKV_BUILD_DIR:-$ROOT/build}"
LLAMA_SERVER="${LLAMA_SERVER:-}"
LLAMA_ARGS="--no-repack"
HOST_BASELINE_ARGS=""
HELP_LINES=$(awk 'NR > 1 && !/^#/ {print NR - 1; exit}' "${BASH_SOURCE[0]}")
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    -j) JOBS="$2"; shift 2 ;;
    --max-new-tokens) MAX_NEW="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --codec) CODEC="$2"; shift 2 ;;
    --llama-server) LLAMA_SERVER="$2"; shift 2 ;;
    --llama-args) LLAMA_ARGS="$2"; shift 2 ;;
    --host-baseline-args) HOST_BASELINE_ARGS="$2"; shift 2 ;;
    -h|--help) sed -n "2,${HELP_LINES}p" "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-serve: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -n $LLAMA_SERVER && ! -x $LLAMA_SERVER ]]; then
  echo "bench-serve: llama-server $LLAMA_SERVER is not an executable" >&2; exit 2
fi
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
# Memory baseline (BASE) and sampler (SAMPLER) of run $1; T_START once sampling runs.
begin_sampling() {
  sync; sleep 1
  BASE=$(mem_available)
  sample_memory "$WORK/mem-$1" & SAMPLER=$!
  PIDS+=("$SAMPLER")
  T_START=$(now)
}
# The start of run $1: begin_sampling, then a daemon and the pool (POOL); T_POOL once the pool
# is created.
begin_run() {
  begin_sampling "$1"
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
secs() { python3 -c "print('%.1f' % ($2 - $1))"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Request bodies. PolyKV's: the user message (the pool holds the document's system turn).
# llama-server's: the document as the system message, i.e. doc.txt without its ChatML
# wrapping (the server renders it with the model's chat template), and cache_prompt.
python3 - "$WORK" "$MAX_NEW" <<'EOF'
import json, sys
work, max_new = sys.argv[1], int(sys.argv[2])
doc = open(f"{work}/doc.txt").read()
head, tail = "<|im_start|>system\n", "<|im_end|>\n"
assert doc.startswith(head) and doc.endswith(tail), "doc.txt is not one ChatML system turn"
system = doc[len(head):-len(tail)]
for i, q in enumerate(open(f"{work}/questions.txt").read().splitlines()):
    common = {"max_tokens": max_new, "temperature": 0}
    json.dump({"model": "doc", "messages": [{"role": "user", "content": q}], **common},
              open(f"{work}/body-{i}.json", "w"))
    json.dump({"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": q}], "cache_prompt": True, **common},
              open(f"{work}/lbody-{i}.json", "w"))
EOF
NQ=$(wc -l <"$WORK/questions.txt")
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

# POSTs bodies $2-I.json (I < NQ) to chat URL $1, answers into $3-I.json: all at once
# ($4 = concurrent) or one after another ($4 = sequential).
post_all() {
  local curls=() i
  for ((i = 0; i < NQ; i++)); do
    if [[ $4 == concurrent ]]; then
      curl -s -X POST "$1" -H 'Content-Type: application/json' -d "@$2-$i.json" -o "$3-$i.json" &
      curls+=($!)
    else
      curl -s -X POST "$1" -H 'Content-Type: application/json' -d "@$2-$i.json" -o "$3-$i.json"
    fi
  done
  for c in "${curls[@]}"; do wait "$c"; done
}
# Sums usage.completion_tokens over the answers $1-I.json ("?" if one is not an answer).
count_tokens() {
  python3 - "$1" "$NQ" <<'EOF'
import json, sys
n = 0
try:
    for i in range(int(sys.argv[2])):
        n += json.load(open(f"{sys.argv[1]}-{i}.json"))["usage"]["completion_tokens"]
    print(n)
except Exception:
    print("?")
EOF
}

# "computed/cached" prompt tokens summed over the answers $1-I.json: llama-server's
# timings.prompt_n / cache_n, the host's usage (prompt_tokens - cached_tokens / cached_tokens).
prompt_split() {
  python3 - "$1" "$NQ" <<'EOF'
import json, sys
done = cached = 0
try:
    for i in range(int(sys.argv[2])):
        a = json.load(open(f"{sys.argv[1]}-{i}.json"))
        if "timings" in a:
            done += a["timings"]["prompt_n"]; cached += a["timings"]["cache_n"]
        else:
            c = a["usage"]["prompt_tokens_details"]["cached_tokens"]
            done += a["usage"]["prompt_tokens"] - c; cached += c
    print(f"{done}/{cached}")
except Exception:
    print("?")
EOF
}
# How many of the answers $1-I.json have the same text as the host's.
same_answers() {
  python3 - "$1" "$WORK/answer" "$NQ" <<'EOF'
import json, sys
def text(p):
    try: return json.load(open(p))["choices"][0]["message"]["content"]
    except Exception: return None
n = int(sys.argv[3])
print(sum(text(f"{sys.argv[1]}-{i}.json") == text(f"{sys.argv[2]}-{i}.json") is not None
          for i in range(n)))
EOF
}
# Results of each run, by "run,figure": wall / start / answer (s), tokens, drop (MiB), rss.
declare -A R

# ---- 1. the host ------------------------------------------------------------------------
# Host run $1 (answers in $2-I.json, /metrics in metrics-$1) with agents serve arguments $3..;
# sets R[$1,...], and T0 / TP1 / TR1 / T1 (start, pool created, host listening, last answer),
# HOST_HWM and DAEMON_HWM.
run_host() {
  local tag=$1 answers=$2 port=""
  shift 2
  begin_run "$tag"
  T0=$T_START TP1=$T_POOL
  "$CLI" agents serve --pool "$POOL" --model "$MODEL" --listen 127.0.0.1:0 --alias doc \
    --max-sessions "$N" --threads "$THREADS" "$@" </dev/null >"$WORK/$tag.log" 2>&1 &
  HPID=$!
  PIDS+=("$HPID")
  for _ in $(seq 1 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/$tag.log" \
      2>/dev/null || true)
    [[ -n $port ]] && break
    sleep 0.05
  done
  [[ -n $port ]] || { cat "$WORK/$tag.log" >&2; exit 1; }
  TR1=$(now)
  post_all "http://127.0.0.1:$port/v1/chat/completions" "$WORK/body" "$answers" concurrent
  T1=$(now)
  HOST_HWM=$(hwm_mib "$HPID")
  DAEMON_HWM=$(hwm_mib "$DPID")
  curl -s "http://127.0.0.1:$port/metrics" >"$WORK/metrics-$tag"
  end_sampling "$tag" "R[$tag,drop]"
  kill "$HPID" "$DPID"; wait "$HPID" "$DPID" 2>/dev/null || true
  R[$tag,wall]=$(secs "$T0" "$T1")
  R[$tag,start]=$(secs "$T0" "$TR1")
  R[$tag,answer]=$(secs "$TR1" "$T1")
  R[$tag,tokens]=$(count_tokens "$answers")
  R[$tag,prompt]=$(prompt_split "$answers")
  R[$tag,rss]=$HOST_HWM
  R[$tag,prefill]=$(awk '$1 == "polykv_host_prefill_seconds_total" {printf "%.2f", $2}' \
    "$WORK/metrics-$tag")
  R[$tag,forwards]=$(awk '$1 == "polykv_host_prompt_forwards_total" {print $2}' \
    "$WORK/metrics-$tag")
}
if [[ -n $HOST_BASELINE_ARGS ]]; then
  # shellcheck disable=SC2086  # HOST_BASELINE_ARGS: several arguments
  run_host hostb "$WORK/answerb" $HOST_BASELINE_ARGS
fi
run_host host "$WORK/answer"
HOST_TOKENS=${R[host,tokens]}
HOST_DROP=${R[host,drop]}
metric() { awk -v k="$1" '$1 == k {print $2}' "$WORK/metrics-host"; }
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

# ---- 3. llama-server: N slots at once, and 1 slot in turn with its prompt cache --------------
# Context per slot: the longest prompt (document + question, as the host counted it) + T new
# tokens, rounded up to a multiple of 256.
CTX_SLOT=$(python3 - "$WORK/answer" "$NQ" "$MAX_NEW" <<'EOF'
import json, sys
p = max(json.load(open(f"{sys.argv[1]}-{i}.json"))["usage"]["prompt_tokens"]
        for i in range(int(sys.argv[2])))
print((p + int(sys.argv[3]) + 255) // 256 * 256)
EOF
)
# Checks (untimed, against the running server at port $1) that llama-server renders every
# question's messages as doc.txt + a continuation, and that its token ids equal PolyKV's:
# the pool's document (polykv-cli tokenize --no-bos, as pools create) + the continuation,
# with as many tokens as the host's usage.prompt_tokens for that question.
check_prompts() {
  python3 - "$1" "$WORK" "$NQ" "$CLI" "$MODEL" <<'EOF'
import json, subprocess, sys, urllib.request
port, work, nq, cli, model = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
def polykv_ids(args):
    out = subprocess.run([cli, "tokenize", "--model", model, "--no-bos"] + args, check=True,
                         capture_output=True, text=True).stdout.split()
    return [int(t) for t in out]
doc = open(f"{work}/doc.txt").read()
doc_ids = polykv_ids(["--file", f"{work}/doc.txt"])
same, bad = 0, []
for i in range(nq):
    body = json.load(open(f"{work}/lbody-{i}.json"))
    prompt = post("/apply-template", {"messages": body["messages"]})["prompt"]
    ids = post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]
    host = json.load(open(f"{work}/answer-{i}.json"))["usage"]["prompt_tokens"]
    ok = prompt.startswith(doc)
    if ok:
        mine = doc_ids + polykv_ids([prompt[len(doc):]])
        ok = ids == mine and len(mine) == host
    same += ok
    if not ok: bad.append(i)
n_ids = len(ids)
if bad:
    print(f"prompts: MISMATCH: llama-server's rendering of questions {bad} differs from PolyKV's")
else:
    print(f"prompts: {same}/{nq} rendered by llama-server as doc.txt + the host's continuation, "
          f"the same token ids as PolyKV's (e.g. {n_ids} for the last question)")
EOF
}
# llama-server run $1 with $2 slots, requests $3 (concurrent / sequential).
run_llama() {
  local tag=$1 slots=$2 mode=$3 lport lpid t_ready t_end
  lport=$(free_port)
  begin_sampling "$tag"
  # shellcheck disable=SC2086  # LLAMA_ARGS: several arguments
  "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$lport" -t "$THREADS" -tb "$THREADS" \
    -np "$slots" -c "$((slots * CTX_SLOT))" --no-kv-unified --cont-batching \
    --threads-http "$((slots + 4))" $LLAMA_ARGS </dev/null >"$WORK/$tag.log" 2>&1 &
  lpid=$!
  PIDS+=("$lpid")
  for _ in $(seq 1 6000); do
    curl -sf "http://127.0.0.1:$lport/health" >/dev/null 2>&1 && break
    kill -0 "$lpid" 2>/dev/null || { tail -n 20 "$WORK/$tag.log" >&2; echo "bench-serve: llama-server exited" >&2; exit 1; }
    sleep 0.05
  done
  t_ready=$(now)
  post_all "http://127.0.0.1:$lport/v1/chat/completions" "$WORK/lbody" "$WORK/$tag" "$mode"
  t_end=$(now)
  R[$tag,rss]=$(hwm_mib "$lpid")
  end_sampling "$tag" "R[$tag,drop]"
  R[$tag,wall]=$(secs "$T_START" "$t_end")
  R[$tag,start]=$(secs "$T_START" "$t_ready")
  R[$tag,answer]=$(secs "$t_ready" "$t_end")
  R[$tag,tokens]=$(count_tokens "$WORK/$tag")
  R[$tag,same]=$(same_answers "$WORK/$tag")
  R[$tag,prompt]=$(prompt_split "$WORK/$tag")
  [[ $mode == sequential ]] && PROMPT_CHECK=$(check_prompts "$lport")
  kill "$lpid"; wait "$lpid" 2>/dev/null || true
}
LLAMA_RUNS=()
if [[ -n $LLAMA_SERVER ]]; then
  run_llama "llama-np$N" "$N" concurrent
  run_llama llama-np1 1 sequential
  LLAMA_RUNS=("llama-np$N" llama-np1)
fi

printf '\n%s questions, %s new tokens max, %s, codec %s, %s cores, %s threads\n' "$N" "$MAX_NEW" \
  "$(basename "$MODEL")" "$CODEC" "$(nproc)" "$THREADS"
# Other work on the cores slows llama-server far more than PolyKV (measured: its decode fell
# from 31 to 3 tok/s beside a 2-job build on 2 cores; the host's from 66 to 39): compare on an
# idle machine.
printf 'load average at the start / the end: %s / %s\n' "$LOAD_START" "$(cut -d' ' -f1-3 /proc/loadavg)"
HOST_S=${R[host,wall]}
PROC_S=$(secs "$T2" "$T3")
printf '%-52s %14s %14s %8s\n' "figure (cold start -> last answer)" "agents serve" \
  "agents run -j$JOBS" "ratio"
printf '%-52s %14s %14s %7.2fx\n' "wall time, s" "$HOST_S" "$PROC_S" \
  "$(python3 -c "print($HOST_S / $PROC_S)")"
printf '%-52s %14s %14s\n' "  of which daemon start + pools create, s" "$(secs "$T0" "$TP1")" \
  "$(secs "$T2" "$TP2")"
printf '%-52s %14s %14s\n' "  of which host start (load, attach), s" "$(secs "$TP1" "$TR1")" "-"
printf '%-52s %14s %14s\n' "  of which answering all questions, s" "${R[host,answer]}" \
  "$(secs "$TP2" "$T3")"
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

if [[ -n $HOST_BASELINE_ARGS ]]; then
  printf '\n%-44s %20s %16s %8s\n' "agents serve, same run" "$HOST_BASELINE_ARGS" "default" "ratio"
  for f in wall answer prefill forwards tokens rss; do
    case $f in
      wall) label="wall time (cold start -> last answer), s" ;;
      answer) label="  of which answering all questions, s" ;;
      prefill) label="seconds in prompt forwards" ;;
      forwards) label="prompt forwards" ;;
      tokens) label="tokens generated" ;;
      rss) label="peak RSS of the host, MiB" ;;
    esac
    printf '%-44s %20s %16s %7sx\n' "$label" "${R[hostb,$f]}" "${R[host,$f]}" \
      "$(python3 -c "print('%.2f' % (float('${R[host,$f]}') / float('${R[hostb,$f]}')))" 2>/dev/null || echo "?")"
  done
  printf '%-44s %20s\n' "answers equal to the default host's" \
    "$(same_answers "$WORK/answerb")/$NQ"
fi
if [[ ${#LLAMA_RUNS[@]} -eq 0 ]]; then
  printf '\nSKIPPED: llama-server runs (set LLAMA_SERVER or pass --llama-server PATH)\n'
else
  printf '\nSide by side with llama-server (%s; -t %s -tb %s, %s positions per slot, %s)\n' \
    "$("$LLAMA_SERVER" --version 2>&1 | sed -n 's/^version: //p' | head -n 1)" "$THREADS" \
    "$THREADS" "$CTX_SLOT" "${LLAMA_ARGS:-no extra arguments}"
  printf '%s\n' "$PROMPT_CHECK"
  printf '%-44s %14s %16s %16s\n' "figure (cold start -> last answer)" "agents serve" \
    "llama -np $N" "llama -np 1 turn"
  row() {  # label, figure
    printf '%-44s %14s %16s %16s\n' "$1" "${R[host,$2]}" "${R[llama-np$N,$2]}" "${R[llama-np1,$2]}"
  }
  row "wall time, s" wall
  row "  of which start (PolyKV: daemon, pool, host;" start
  printf '%-44s\n' "    llama-server: load, warm-up), s"
  row "  of which answering all questions, s" answer
  row "tokens generated" tokens
  row "prompt tokens computed/cached (pool, cache)" prompt
  R[host,same]="-"
  row "answers equal to agents serve's" same
  row "peak drop of MemAvailable, MiB" drop
  row "peak RSS (host / llama-server), MiB" rss
  python3 - "${R[host,wall]}" "${R[llama-np$N,wall]}" "${R[llama-np1,wall]}" "$N" <<'EOF'
import sys
host, many, one, n = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
best, name = min((many, f"-np {n} at once"), (one, "-np 1 in turn"))
print(f"agents serve / best llama-server set-up ({name}): {host / best:.2f}x wall time "
      f"(issue 31 must-show: <= 0.5x); vs -np {n}: {host / many:.2f}x, vs -np 1: {host / one:.2f}x")
EOF
fi
if [[ -x $BUILD/bench/bench_batch_decode ]]; then
  printf '\n==> bench_batch_decode (decode tok/s, 1 vs many sessions, same run)\n'
  POLYKV_SOURCE_DIR="$ROOT" "$BUILD/bench/bench_batch_decode" --model "$MODEL" --sessions "1,2,4,8,$N" --steps "$MAX_NEW"
fi
