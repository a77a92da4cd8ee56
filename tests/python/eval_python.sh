#!/usr/bin/env bash
# Runs a Python test with the eval venv's interpreter (the one `polykv-cli eval` uses):
# $POLYKV_EVAL_PYTHON, else ${POLYKV_EVAL_VENV:-$HOME/.cache/polykv/eval-venv}/bin/python.
# A missing interpreter is a FAILURE (exit 1), not a skip: scripts/test.sh installs it.
set -euo pipefail
py=${POLYKV_EVAL_PYTHON:-${POLYKV_EVAL_VENV:-$HOME/.cache/polykv/eval-venv}/bin/python}
if [ ! -x "$py" ]; then
  echo "FAIL: no eval Python at $py: run 'bash scripts/install-eval-deps.sh' (it prints the" \
       "venv's python; scripts/test.sh exports it as POLYKV_EVAL_PYTHON)" >&2
  exit 1
fi
exec "$py" "$@"
