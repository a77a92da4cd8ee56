#!/usr/bin/env bash
# Installs the `client` component of a PolyKV build into a temp prefix, checks that
# libpolykv_client.so is self-contained and exports only the C API, then configures, builds
# and runs a tiny external project that uses find_package(polykv) + polykv::client_cpp.
# Usage: install_consumer_test.sh <cmake> <polykv build dir> <consumer source dir> [link flags]
set -euo pipefail
CMAKE=$1 BUILD=$2 CONSUMER_SRC=$3 LINK_FLAGS=${4:-}
TMP=$(mktemp -d /tmp/polykv-install-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
"$CMAKE" --install "$BUILD" --prefix "$TMP/inst" --component client >"$TMP/install.log"
LIB=$(ls "$TMP"/inst/lib*/libpolykv_client.so.* 2>/dev/null | head -n1)
[[ -n "$LIB" ]] || { echo "FAIL: libpolykv_client.so not installed"; cat "$TMP/install.log"; exit 1; }
for f in include/polykv/client.h include/polykv/client.hpp; do
  [[ -f "$TMP/inst/$f" ]] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$TMP"/inst/lib*/cmake/polykv/polykvConfig.cmake "$TMP"/inst/lib*/cmake/polykv/polykvConfigVersion.cmake >/dev/null
# No static PolyKV library is installed, and the .so needs no other PolyKV library.
if ls "$TMP"/inst/lib*/*.a >/dev/null 2>&1; then echo "FAIL: static libraries installed"; exit 1; fi
if ldd "$LIB" | grep -E "not found|libpolykv_(ipc|kernels|model|common)"; then
  echo "FAIL: $LIB is not self-contained"; exit 1
fi
# Only the C API is exported.
SYMS=$(nm -D --defined-only "$LIB" | awk '$2 ~ /[TDBRWVi]/ {print $3}' | sed 's/@.*//')
BAD=$(echo "$SYMS" | grep -v '^polykv_' || true)
if [[ -n "$BAD" ]]; then echo "FAIL: non-API symbols exported:"; echo "$BAD" | head; exit 1; fi
echo "$SYMS" | grep -qx 'polykv_decode_layer' || { echo "FAIL: API missing"; exit 1; }
"$CMAKE" -S "$CONSUMER_SRC" -B "$TMP/build" -DCMAKE_PREFIX_PATH="$TMP/inst" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS="$LINK_FLAGS" >"$TMP/configure.log" 2>&1 ||
  { cat "$TMP/configure.log"; exit 1; }
"$CMAKE" --build "$TMP/build" >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }
"$TMP/build/consumer" "ipc://$TMP/none.sock"
echo "PASS"
