#!/usr/bin/env bash
# Checks that every tracked C/C++/CUDA source is clean under the repository's .clang-format
# (clang-format-14 --dry-run -Werror). Files whose first lines say "GENERATED" (the Unicode
# tables from model/tools/gen_unicode_data.py) are the generator's output and are left out.
# The tree is formatted with clang-format 14 (Debian bookworm's clang-format-14, which
# scripts/install-deps.sh installs by that name); other major versions format some constructs
# differently, so the check runs clang-format-14 itself and fails when it is absent (a check
# that skips cannot fail). $POLYKV_CLANG_FORMAT names another binary of major version 14.
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."

want_major=14
fmt=${POLYKV_CLANG_FORMAT:-clang-format-$want_major}
if ! command -v "$fmt" >/dev/null; then
  echo "check-format: $fmt not found: run scripts/install-deps.sh (Debian package" \
    "clang-format-$want_major)" >&2
  exit 1
fi
have=$("$fmt" --version | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p')
if [ "$have" != "$want_major" ]; then
  echo "check-format: $fmt is clang-format $have; the tree is formatted with $want_major" \
    "(install clang-format-$want_major)" >&2
  exit 1
fi

files=()
while IFS= read -r f; do
  head -n 5 "$f" | grep -q "GENERATED" && continue
  files+=("$f")
done < <(if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
           git ls-files '*.cc' '*.h' '*.hpp' '*.cu' '*.cuh' '*.c'
         else  # an exported tree without .git: the same folders, build outputs left out
           find . -path ./build -prune -o -path './build-*' -prune -o -path ./.git -prune -o \
             -type f \( -name '*.cc' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' \
             -o -name '*.cuh' -o -name '*.c' \) -print | sed 's|^\./||' | sort
         fi)

if [ "${1:-}" = --fix ]; then
  "$fmt" -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files" >&2
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ "${#bad[@]}" -ne 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-format: run scripts/check-format.sh --fix (clang-format $want_major)" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files clean (clang-format $have)" >&2
