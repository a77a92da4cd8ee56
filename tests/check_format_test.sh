#!/usr/bin/env bash
# scripts/check-format.sh can fail: without clang-format-14, or with another major version
# named in its place, it exits 1 naming the package (it used to print SKIPPED and exit 0);
# with clang-format-14 it passes on a clean file and fails on a misformatted one.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect CODE TEXT -- command...
  local code=$1 text=$2
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $code, text \"$text\"):"
    echo "$out" | tail -5
    fail=1
  else
    echo "ok: exit $rc, \"$text\""
  fi
}
expect 1 "not found: run scripts/install-deps.sh" -- \
  env POLYKV_CLANG_FORMAT="$tmp/absent" bash "$src/scripts/check-format.sh"
printf '#!/bin/sh\necho "Debian clang-format version 15.0.7"\n' >"$tmp/clang-format-15"
chmod +x "$tmp/clang-format-15"
expect 1 "is clang-format 15" -- \
  env POLYKV_CLANG_FORMAT="$tmp/clang-format-15" bash "$src/scripts/check-format.sh"
if ! command -v clang-format-14 >/dev/null; then
  echo "FAIL: clang-format-14 is not installed (scripts/install-deps.sh installs it)"
  exit 1
fi
# A copy of the check in an exported tree (no .git) with one clean and then one bad file.
mkdir -p "$tmp/tree/scripts"
cp "$src/scripts/check-format.sh" "$tmp/tree/scripts/"
cp "$src/.clang-format" "$tmp/tree/"
printf 'int Add(int a, int b) { return a + b; }\n' >"$tmp/tree/ok.cc"
expect 0 "1 files clean (clang-format 14)" -- bash "$tmp/tree/scripts/check-format.sh"
printf 'int  Add( int a,int b ){return a+b;}\n' >"$tmp/tree/bad.cc"
expect 1 "1 of 2 files differ" -- bash "$tmp/tree/scripts/check-format.sh"
exit $fail
