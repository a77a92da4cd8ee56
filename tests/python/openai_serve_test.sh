#!/usr/bin/env bash
# The `openai` Python package (PyPI) streams from `polykv-cli agents serve`: polykvd on a
# private endpoint, a pool of stories260K token ids (or, with $POLYKV_SMOLLM2_GGUF, the demo
# article), the host on a free port; the client streams a completion (and with SmolLM2 a chat
# completion) and the streamed text / usage must equal the non-streamed answer's.
# The package comes from $POLYKV_OPENAI_PYTHON, else a venv (${POLYKV_OPENAI_VENV:-
# ~/.cache/polykv/openai-venv}) created and filled with pip here. Exit 77 (ctest: skipped)
# when the package cannot be installed (no network).
# Usage: openai_serve_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1
SRC=$2
CLI=$BUILD/cli/polykv-cli
DAEMON=$BUILD/daemon/polykvd
[[ -x $CLI && -x $DAEMON ]] || { echo "polykv-cli / polykvd not built" >&2; exit 1; }

PY=${POLYKV_OPENAI_PYTHON:-}
if [[ -z $PY ]]; then
  VENV=${POLYKV_OPENAI_VENV:-$HOME/.cache/polykv/openai-venv}
  PY=$VENV/bin/python
  if ! [[ -x $PY ]] || ! "$PY" -c "import openai" 2>/dev/null; then
    if ! { python3 -m venv "$VENV" && "$PY" -m pip install -q "openai>=1.0" </dev/null; } >&2;
    then
      echo "SKIP: cannot install the openai package into $VENV (no network?)" >&2
      exit 77
    fi
  fi
fi
"$PY" -c "import openai" || { echo "SKIP: openai does not import" >&2; exit 77; }

WORK=$(mktemp -d /tmp/polykv-openai-XXXXXX)
DPID=""
HPID=""
cleanup() {
  [[ -n $HPID ]] && kill "$HPID" 2>/dev/null && wait "$HPID" 2>/dev/null || true
  [[ -n $DPID ]] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
export POLYKV_ENDPOINT="ipc://$WORK/control.sock"
"$DAEMON" --endpoint "$POLYKV_ENDPOINT" --backend host --log-level warn \
  --shm-prefix "/polykv-oai$$-" </dev/null >"$WORK/polykvd.log" 2>&1 &
DPID=$!
for _ in $(seq 1 100); do "$CLI" ping >/dev/null 2>&1 && break; sleep 0.1; done

if [[ -n ${POLYKV_SMOLLM2_GGUF:-} && -f ${POLYKV_SMOLLM2_GGUF:-} ]]; then
  MODEL=$POLYKV_SMOLLM2_GGUF
  { printf '<|im_start|>system\nYou answer questions about this article.\n\n'
    cat "$SRC/data/wikitext-2/robert_boulter.txt"; printf '<|im_end|>\n'; } >"$WORK/doc.txt"
  POOL=$("$CLI" pools create --model "$MODEL" --document "$WORK/doc.txt" --no-bos </dev/null |
         tail -n 1)
  CHAT=1
else
  MODEL=$SRC/tests/data/models/stories260K
  IDS=$(seq -s, 1 200 | tr '\n' ' ')
  POOL=$("$CLI" pools create --model "$MODEL" --token-ids "${IDS% }" </dev/null | tail -n 1)
  CHAT=0
fi
[[ $POOL =~ ^[0-9a-f]{64}$ ]] || { echo "pools create failed: $POOL" >&2; cat "$WORK/polykvd.log"; exit 1; }

"$CLI" agents serve --pool "$POOL" --model "$MODEL" --listen 127.0.0.1:0 --alias doc \
  </dev/null >"$WORK/host.log" 2>&1 &
HPID=$!
PORT=""
for _ in $(seq 1 600); do
  PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/host.log")
  [[ -n $PORT ]] && break
  kill -0 "$HPID" 2>/dev/null || { cat "$WORK/host.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n $PORT ]] || { echo "host did not start" >&2; cat "$WORK/host.log" >&2; exit 1; }

"$PY" - "$PORT" "$CHAT" <<'EOF'
import sys
import openai

port, chat = int(sys.argv[1]), sys.argv[2] == "1"
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
models = [m.id for m in client.models.list()]
assert models == ["doc"], models

prompt = "Robert Boulter is" if chat else [5, 6, 7, 8]
whole = client.completions.create(model="doc", prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
ids = []
finish = None
usage = None
stream = client.completions.create(model="doc", prompt=prompt, max_tokens=16, temperature=0,
                                   stream=True, stream_options={"include_usage": True},
                                   extra_body={"ignore_eos": True, "return_token_ids": True})
chunks = 0
for chunk in stream:
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        ids += (c.model_extra or {}).get("token_ids") or []
        finish = c.finish_reason or finish
want = whole.choices[0].model_extra["token_ids"]
assert chunks >= 3, chunks
assert ids == want, (ids, want)
assert finish == "length", finish
assert usage.completion_tokens == 16, usage
assert usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens_details.cached_tokens
assert usage.prompt_tokens_details.cached_tokens > 100, usage
print(f"completions: {chunks} chunks streamed, ids equal the whole answer ({len(ids)} tokens)")

if chat:
    q = [{"role": "user", "content": "Who is Robert Boulter?"}]
    whole = client.chat.completions.create(model="doc", messages=q, max_tokens=32, temperature=0)
    text = ""
    for chunk in client.chat.completions.create(model="doc", messages=q, max_tokens=32,
                                                temperature=0, stream=True):
        for c in chunk.choices:
            text += c.delta.content or ""
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    assert text.strip(), "empty chat answer"
    print("chat: streamed answer:", text)

try:
    client.completions.create(model="no-such-model", prompt=prompt, max_tokens=1)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404
print("OK")
EOF
kill "$HPID"
wait "$HPID"
HPID=""
