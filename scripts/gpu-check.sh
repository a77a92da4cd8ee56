#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU checks of PolyKV in one run (under 8 minutes on one H200):
#  1. configure + build with CUDA for the local GPU's architecture only (build-gpu/);
#  2. ctest -L gpu: CUDA vs CPU within the tolerances each test states (codec, attention,
#     device ops, the CUDA model runtime, CUDA IPC);
#  3. end to end: polykvd --backend cuda publishes a pool; an agent process with --device cuda
#     attends to it in place; a CPU agent is refused (FAILED_PRECONDITION) and, with
#     --allow-copy, copies it and logs the cost; two cuda agents on one pool at once (GPU
#     memory per agent); device memory back to its level after SIGKILL of an agent and of
#     the daemon;
#  4. figures: device memcpy, codec throughput, decode tok/s (bench_gpu), TTFT via the pool vs
#     re-prefill (agent --baseline-prefill); with SmolLM2, `agents serve --device cuda` answering
#     the demo questions at once (answers equal to the single CUDA agents'), a child of the demo
#     pool prefilled on the GPU in place (no read-back), and batched decode over the demo pool
#     for 1..256 sessions against device memcpy (bench_batch_decode).
# Everything is printed and, when $OUT is set, saved as $OUT/gpu-check.log. Exit status: 0 when
# every check passed, 1 otherwise (the figures are printed either way).
# Env: POLYKV_GPU_BUILD_DIR (default build-gpu), POLYKV_GPU_MODEL (default: stories260K; a
# SmolLM2 GGUF gives meaningful figures), POLYKV_GPU_JOBS (default nproc),
# POLYKV_GPU_PREBUILT=1 (use the build dir as it is: binaries built elsewhere for this GPU's
# architecture; no configure, no build), POLYKV_GPU_SMOLLM2 (a SmolLM2 GGUF: adds the demo
# document on a cuda pool, CUDA agents vs CPU agents on the demo questions, and its figures).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${POLYKV_GPU_BUILD_DIR:-$ROOT/build-gpu}"
MODEL="${POLYKV_GPU_MODEL:-$ROOT/tests/data/models/stories260K}"
JOBS="${POLYKV_GPU_JOBS:-$(nproc)}"
LOGDIR="${OUT:-$BUILD/gpu-check}"
mkdir -p "$LOGDIR"
exec > >(tee "$LOGDIR/gpu-check.log") 2>&1

FAILED=0
WORK0="$(mktemp -d /tmp/polykv-gpu-tests.XXXXXX)"
step() { printf '\n==== %s (%ds)\n' "$*" "$SECONDS"; }
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*"; FAILED=1; }
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }

step "device"
if ! nvidia-smi; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi failed): nothing to check"
  exit 1
fi
ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 | tr -d ' .')"
echo "compute capability -> CMAKE_CUDA_ARCHITECTURES=$ARCH"

GPU_TESTS=(kernels_codec_cuda_test kernels_attention_cuda_test kernels_device_ops_cuda_test
  model_cuda_llama_test ipc_cuda_ipc_test agent_device_test integration_agents_cuda_test)
if [[ "${POLYKV_GPU_PREBUILT:-0}" == 1 ]]; then
step "prebuilt binaries in $BUILD (no build)"
for b in daemon/polykvd cli/polykv-cli bench/bench_gpu bench/bench_batch_decode; do
  [[ -x "$BUILD/$b" ]] || { echo "gpu-check: $BUILD/$b missing (POLYKV_GPU_PREBUILT=1)"; exit 1; }
done
else
step "configure + build (CUDA arch $ARCH, $JOBS jobs)"
LAUNCH=()
command -v ccache >/dev/null && LAUNCH=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPOLYKV_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPOLYKV_BUILD_TESTS=ON -DPOLYKV_BUILD_BENCHMARKS=ON \
  "${LAUNCH[@]}" >"$LOGDIR/configure.log" 2>&1 || { tail -30 "$LOGDIR/configure.log"; exit 1; }
cmake --build "$BUILD" -j"$JOBS" --target polykvd polykv-cli bench_gpu bench_batch_decode "${GPU_TESTS[@]}" \
  >"$LOGDIR/build.log" 2>&1 || { tail -40 "$LOGDIR/build.log"; exit 1; }
echo "built in ${SECONDS}s"
fi

step "ctest -L gpu (CUDA vs CPU) + the agent device seam"
if ctest --test-dir "$BUILD" -L gpu -E NOT_BUILT --output-on-failure --timeout "${POLYKV_GPU_TEST_TIMEOUT:-300}" -j4; then
  pass "ctest -L gpu"
else
  fail "ctest -L gpu"
  # The failing tests once more under compute-sanitizer (memcheck), when it is there.
  if command -v compute-sanitizer >/dev/null; then
    for t in "${GPU_TESTS[@]}"; do
      bin="$(find "$BUILD/tests" -name "$t" -type f | head -1)"
      [[ -n "$bin" ]] || continue
      timeout 60 "$bin" --gtest_brief=1 >"$WORK0/$t.log" 2>&1 && continue
      bad="$(grep -E '^\[  FAILED  \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$WORK0/$t.log" |
        awk '{print $4}' | sort -u | paste -sd: -)"
      step "compute-sanitizer $t ${bad:-(crashed)}"
      timeout 90 compute-sanitizer --tool memcheck --print-limit 12 "$bin" \
        ${bad:+--gtest_filter="$bad"} 2>&1 | tail -80
    done
  fi
fi
ctest --test-dir "$BUILD" -R '^AgentDeviceTest' --output-on-failure && pass "agent device seam" ||
  fail "agent device seam"

# ---- end to end: a daemon with a CUDA pool, agent processes ---------------------------------
DAEMON="$BUILD/daemon/polykvd"
CLI="$BUILD/cli/polykv-cli"
WORK="$(mktemp -d /tmp/polykv-gpu-check.XXXXXX)"
export POLYKV_ENDPOINT="ipc://$WORK/control.sock"
DPID=""
cleanup() {
  [[ -n "$DPID" ]] && kill -9 "$DPID" 2>/dev/null
  rm -rf "$WORK" "$WORK0"
}
trap cleanup EXIT
start_daemon() {  # extra polykvd flags as arguments
  "$DAEMON" --endpoint "$POLYKV_ENDPOINT" --backend cuda --log-level info \
    --lease-seconds 5 "$@" >"$WORK/polykvd.log" 2>&1 </dev/null &
  DPID=$!
  for _ in $(seq 100); do "$CLI" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  cat "$WORK/polykvd.log"
  return 1
}

step "end to end: polykvd --backend cuda"
BASE_MIB="$(gpu_used_mib)"
echo "GPU memory used before the daemon: ${BASE_MIB} MiB"
if ! start_daemon; then
  fail "polykvd --backend cuda did not start"
  exit 1
fi
DOC_IDS="$(seq -s, 1 2 1023 | awk -F, '{o=""; for(i=1;i<=NF;i++){o=o (i>1?",":"") ($i%500)+1}; print o}')"
POOL="$("$CLI" pools --json create --model "$MODEL" --token-ids "$DOC_IDS" 2>"$WORK/create.err" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' 2>/dev/null)"
if [[ -z "$POOL" ]]; then
  cat "$WORK/create.err"
  fail "pools create on the cuda backend"
  exit 1
fi
pass "pool $POOL published on the cuda backend"
PROMPT="1,403,407,261"

"$CLI" agent --pool "$POOL" --model "$MODEL" --prompt-ids "$PROMPT" --device cuda \
  --max-new-tokens 32 --ignore-eos --baseline-prefill --json >"$WORK/cuda.json" 2>"$WORK/cuda.err"
if [[ $? -eq 0 ]] && grep -q '"route":"cuda-in-place"' "$WORK/cuda.json"; then
  pass "agent --device cuda attends in place to the CUDA pool"
else
  cat "$WORK/cuda.err"
  fail "agent --device cuda"
fi

"$CLI" agent --pool "$POOL" --model "$MODEL" --prompt-ids "$PROMPT" --device cpu \
  --max-new-tokens 4 >"$WORK/cpu.out" 2>"$WORK/cpu.err"
if grep -q "FAILED_PRECONDITION" "$WORK/cpu.err" && grep -q -- "--allow-copy" "$WORK/cpu.err"; then
  pass "CPU agent refused without --allow-copy: $(head -c 160 "$WORK/cpu.err")..."
else
  cat "$WORK/cpu.out" "$WORK/cpu.err"
  fail "CPU agent on a CUDA pool was not refused"
fi

"$CLI" agent --pool "$POOL" --model "$MODEL" --prompt-ids "$PROMPT" --device cpu --allow-copy \
  --max-new-tokens 32 --ignore-eos --json >"$WORK/copy.json" 2>"$WORK/copy.err"
if [[ $? -eq 0 ]] && grep -q "allow-copy: pool" "$WORK/copy.err"; then
  pass "CPU agent --allow-copy: $(grep 'allow-copy: pool' "$WORK/copy.err")"
else
  cat "$WORK/copy.err"
  fail "CPU agent --allow-copy"
fi
python3 - "$WORK/cuda.json" "$WORK/copy.json" <<'EOF' || FAILED=1
import json, sys
c = json.load(open(sys.argv[1])); h = json.load(open(sys.argv[2]))
same = c["answer_ids"] == h["answer_ids"]
print(("PASS" if same else "FAIL"), "greedy answer, CUDA agent vs CPU agent (copied pool):",
      "equal" if same else f'{c["answer_ids"]} vs {h["answer_ids"]}')
s = c["stats"]
print(f'FIGURE cuda agent: TTFT via pool {s["ttft_ms"]:.1f} ms vs re-prefill '
      f'{c["baseline"]["ttft_ms"]:.1f} ms; decode {s["tokens_per_s"]:.1f} tok/s; device '
      f'memory {s["device_bytes"]/1048576:.1f} MiB; baseline answer equal: {c["baseline"]["match"]}')
sys.exit(0 if same else 1)
EOF

step "two cuda agents on one pool at once; GPU memory per agent"
HOLD="$WORK/hold"
touch "$HOLD"
BEFORE_AGENTS="$(gpu_used_mib)"
PIDS=()
for i in 1 2; do
  "$CLI" agent --pool "$POOL" --model "$MODEL" --prompt-ids "$PROMPT" --device cuda \
    --max-new-tokens 16 --json --hold-while-exists "$HOLD" >"$WORK/two$i.json" 2>"$WORK/two$i.err" &
  PIDS+=($!)
done
for _ in $(seq 300); do
  n=$(grep -l "holding the pool" "$WORK"/two*.err 2>/dev/null | wc -l)
  [[ "$n" -eq 2 ]] && break
  sleep 0.1
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
WITH_AGENTS="$(gpu_used_mib)"
echo "FIGURE GPU memory per agent: $(((WITH_AGENTS - BEFORE_AGENTS) / 2)) MiB (device total ${BEFORE_AGENTS} -> ${WITH_AGENTS} MiB)"
# SIGKILL one agent while it holds the pool: its device memory must come back.
kill -9 "${PIDS[0]}" 2>/dev/null
rm -f "$HOLD"
wait "${PIDS[1]}" && pass "second agent answered while the first was killed" ||
  fail "second agent"
wait "${PIDS[0]}" 2>/dev/null
sleep 2
AFTER_AGENTS="$(gpu_used_mib)"
if ((AFTER_AGENTS <= BEFORE_AGENTS + 16)); then
  pass "device memory after SIGKILL of an agent: ${AFTER_AGENTS} MiB (before agents ${BEFORE_AGENTS})"
else
  fail "device memory after SIGKILL of an agent: ${AFTER_AGENTS} MiB > ${BEFORE_AGENTS} + 16"
fi

step "SIGKILL of the daemon: its pools' device memory is released"
kill -9 "$DPID"
wait "$DPID" 2>/dev/null
DPID=""
sleep 2
AFTER_DAEMON="$(gpu_used_mib)"
if ((AFTER_DAEMON <= BASE_MIB + 16)); then
  pass "device memory after SIGKILL of the daemon: ${AFTER_DAEMON} MiB (before ${BASE_MIB})"
else
  fail "device memory after SIGKILL of the daemon: ${AFTER_DAEMON} MiB > ${BASE_MIB} + 16"
fi

step "figures: memcpy, codec, decode (bench_gpu)"
"$BUILD/bench/bench_gpu" --model "$MODEL" --tokens 128 || fail "bench_gpu"

# ---- the demo document with SmolLM2 (POLYKV_GPU_SMOLLM2): CUDA agents vs CPU agents --------
if [[ -n "${POLYKV_GPU_SMOLLM2:-}" && -f "${POLYKV_GPU_SMOLLM2}" ]]; then
  SMOL="$POLYKV_GPU_SMOLLM2"
  step "demo document on a cuda pool (prefilled on the GPU), SmolLM2: CUDA agents vs CPU agents (greedy, 48 tokens)"
  if start_daemon --prefill-device cuda; then
    DEMO_POOL="$("$CLI" pools create --model "$SMOL" --document "$ROOT/data/wikitext-2/robert_boulter.txt" \
      --chat-system "You answer questions about this article." --no-bos </dev/null 2>"$WORK/demo-create.err" | tail -n 1)"
    if [[ "$DEMO_POOL" =~ ^[0-9a-f]{64}$ ]]; then
      "$CLI" pools show "$DEMO_POOL" </dev/null | head -20
      GPU_PREFILL_MS="$("$CLI" pools show "$DEMO_POOL" --json </dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["prefill_ms"], 1))')"
      grep -h "prefill of" "$WORK/polykvd.log" | tail -2
      SAME=0; TOTAL=0
      while IFS= read -r q && ((TOTAL < ${POLYKV_GPU_QUESTIONS:-8})); do
        [[ -z "$q" || "$q" == \#* ]] && continue
        TOTAL=$((TOTAL + 1))
        extra=(); ((TOTAL == 1)) && extra=(--baseline-prefill)
        "$CLI" agent --pool "$DEMO_POOL" --model "$SMOL" --chat --prompt "$q" --device cuda \
          --max-new-tokens 48 --json "${extra[@]}" </dev/null >"$WORK/sq$TOTAL.cuda.json" 2>"$WORK/sq$TOTAL.cuda.err"
        "$CLI" agent --pool "$DEMO_POOL" --model "$SMOL" --chat --prompt "$q" --device cpu \
          --allow-copy --max-new-tokens 48 --json </dev/null >"$WORK/sq$TOTAL.cpu.json" 2>"$WORK/sq$TOTAL.cpu.err"
        python3 - "$WORK/sq$TOTAL.cuda.json" "$WORK/sq$TOTAL.cpu.json" "$q" <<'EOF2' && SAME=$((SAME + 1))
import json, sys
try:
    c = json.load(open(sys.argv[1])); h = json.load(open(sys.argv[2]))
except Exception as e:
    print("FAIL", sys.argv[3], "- no JSON answer:", e); sys.exit(1)
same = c["answer_ids"] == h["answer_ids"]
print("PASS" if same else "FAIL", repr(sys.argv[3]), "->", repr(c.get("answer", ""))[:120])
if not same: print("   cpu:", repr(h.get("answer", ""))[:120])
s = c["stats"]
print(f'   cuda: ttft {s["ttft_ms"]:.1f} ms, decode {s["tokens_per_s"]:.1f} tok/s, device '
      f'{s["device_bytes"]/1048576:.1f} MiB; cpu (copied pool): ttft {h["stats"]["ttft_ms"]:.1f} ms, '
      f'decode {h["stats"]["tokens_per_s"]:.1f} tok/s')
if "baseline" in c:
    b = c["baseline"]
    print(f'FIGURE SmolLM2 demo: TTFT via the cuda pool {s["ttft_ms"]:.1f} ms vs re-prefill '
          f'{b["ttft_ms"]:.1f} ms (answer equal: {b["match"]})')
sys.exit(0 if same else 1)
EOF2
        [[ -s "$WORK/sq$TOTAL.cuda.err" ]] && grep -v '^$' "$WORK/sq$TOTAL.cuda.err" | tail -3
      done <"$ROOT/data/questions.txt"
      ((SAME == TOTAL)) && pass "SmolLM2 demo: CUDA answers equal to CPU answers on $SAME/$TOTAL questions" ||
        fail "SmolLM2 demo: CUDA answers equal to CPU answers on $SAME/$TOTAL questions"
      step "agents serve --device cuda on the demo cuda pool: the $TOTAL questions at once (batched decode) vs the single CUDA agents"
      "$CLI" agents serve --pool "$DEMO_POOL" --model "$SMOL" --device cuda --listen 127.0.0.1:0 \
        --alias doc </dev/null >"$WORK/serve.log" 2>&1 &
      SPID=$!
      SPORT=""
      for _ in $(seq 1 600); do
        SPORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.log" 2>/dev/null || true)
        [[ -n $SPORT ]] && break
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
      done
      if [[ -n $SPORT ]]; then
        python3 - "$WORK" "$SPORT" "$TOTAL" "$ROOT/data/questions.txt" <<'EOF3' && pass "agents serve --device cuda: answers equal to the single CUDA agents" || fail "agents serve --device cuda: answers equal to the single CUDA agents"
import json, sys, threading, time, urllib.request
work, port, total, qfile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
qs = [l for l in open(qfile).read().splitlines() if l and not l.startswith("#")][:total]
out = [None] * len(qs)
def ask(i):
    body = json.dumps({"model": "doc", "messages": [{"role": "user", "content": qs[i]}],
                       "max_tokens": 48, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        out[i] = json.load(urllib.request.urlopen(req, timeout=300))
    except Exception as e:
        out[i] = {"error": str(e)}
t0 = time.time()
th = [threading.Thread(target=ask, args=(i,)) for i in range(len(qs))]
for t in th: t.start()
for t in th: t.join()
wall = time.time() - t0
same, tokens = 0, 0
for i, r in enumerate(out):
    single = json.load(open(f"{work}/sq{i + 1}.cuda.json"))
    if "choices" not in r:
        print("FAIL", repr(qs[i]), "->", r); continue
    text = r["choices"][0]["message"]["content"]
    tokens += r["usage"]["completion_tokens"]
    ok = text == single["answer"]
    same += ok
    print("PASS" if ok else "FAIL", repr(qs[i]), "->", repr(text)[:100])
    if not ok: print("   single cuda agent:", repr(single["answer"])[:100])
print(f"FIGURE agents serve --device cuda: {len(qs)} answers ({tokens} tokens) in {wall:.2f} s "
      f"= {tokens / wall:.0f} tok/s aggregate (cold sessions, prompts included)")
sys.exit(0 if same == len(qs) else 1)
EOF3
        curl -s "http://127.0.0.1:$SPORT/metrics" | grep -E '^polykv_host_(steps|step_rows|generated|decode_seconds)' | head -6
      else
        cat "$WORK/serve.log"; fail "agents serve --device cuda did not start"
      fi
      kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
      step "a child of the demo cuda pool (the questions), prefilled on the GPU attending to its parent in place"
      CHILD_POOL="$("$CLI" pools create --parent "$DEMO_POOL" --document "$ROOT/data/questions.txt" \
        </dev/null 2>"$WORK/child-create.err" | tail -n 1)"
      if [[ "$CHILD_POOL" =~ ^[0-9a-f]{64}$ ]]; then
        CHILD_MS="$("$CLI" pools show "$CHILD_POOL" --json </dev/null |
          python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["tokens"], "tokens,", round(j["prefill_ms"], 1), "ms")')"
        echo "FIGURE child pool prefill on the GPU over the demo cuda pool: $CHILD_MS"
        if grep -q "the host prefills its child" "$WORK/polykvd.log"; then
          grep "the host prefills its child" "$WORK/polykvd.log"; fail "the child's parent was read back to the host"
        else
          pass "child of a cuda pool prefilled on the GPU: no read-back in the daemon's log"
        fi
      else
        cat "$WORK/child-create.err"; fail "child of the demo cuda pool"
      fi
    else
      cat "$WORK/demo-create.err"; fail "SmolLM2 demo pool on the cuda backend"
    fi
    kill -9 "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=""
    # The same document prefilled by the host (--prefill-device host), same run.
    if start_daemon --prefill-device host; then
      HOST_POOL="$("$CLI" pools create --model "$SMOL" --document "$ROOT/data/wikitext-2/robert_boulter.txt" \
        --chat-system "You answer questions about this article." --no-bos </dev/null 2>/dev/null | tail -n 1)"
      HOST_PREFILL_MS="$("$CLI" pools show "$HOST_POOL" --json </dev/null 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["prefill_ms"], 1))' 2>/dev/null)"
      echo "FIGURE SmolLM2 demo document (1,451 tokens) prefill in polykvd: GPU ${GPU_PREFILL_MS:-?} ms vs host ($(nproc) cores) ${HOST_PREFILL_MS:-?} ms"
      kill -9 "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=""
    fi
  else
    fail "polykvd --backend cuda (SmolLM2 demo)"
  fi
  step "figures: SmolLM2 decode (bench_gpu)"
  "$BUILD/bench/bench_gpu" --model "$SMOL" --tokens 256 || fail "bench_gpu SmolLM2"
  step "figures: SmolLM2 batched decode on the GPU over the demo pool (bench_batch_decode --device cuda)"
  POLYKV_SOURCE_DIR="$ROOT" "$BUILD/bench/bench_batch_decode" --device cuda --model "$SMOL" \
    --sessions "${POLYKV_GPU_SESSIONS:-1,16,64,256}" --steps 32 || fail "bench_batch_decode --device cuda"
fi

step "done in ${SECONDS}s"
((FAILED == 0)) && echo "gpu-check: all checks passed" || echo "gpu-check: some checks FAILED"
exit "$FAILED"
