#!/usr/bin/env bash
# Configures the project in throw-away build folders to check the
# VARIPIPE_WITH_CUDA option: OFF configures without CUDA and leaves the NCCL
# sources out; AUTO compiles them when CUDA and NCCL are installed; a bad
# value is rejected with a message naming the option.
# Usage: configure_options_test.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

configure() {  # configure NAME ARGS...
  local name=$1; shift
  cmake -S "$src" -B "$tmp/$name" -G Ninja -DVARIPIPE_BUILD_TESTS=OFF "$@" >"$tmp/$name.log" 2>&1
}

configure off -DVARIPIPE_WITH_CUDA=OFF || { cat "$tmp/off.log"; fail "configure with CUDA OFF failed"; }
grep -q "CUDA/NCCL off (VARIPIPE_WITH_CUDA=OFF)" "$tmp/off.log" || fail "no 'CUDA/NCCL off' in the dependency line"
if grep -q "nccl_status" "$tmp/off/build.ninja"; then fail "NCCL sources are built with CUDA OFF"; fi
echo "ok: VARIPIPE_WITH_CUDA=OFF configures without CUDA/NCCL"
grep "Varipipe dependencies" "$tmp/off.log"

# Whether CUDA and NCCL are installed is decided exactly as the build decides
# it: by what AUTO finds.
configure auto -DVARIPIPE_WITH_CUDA=AUTO || { cat "$tmp/auto.log"; fail "configure with CUDA AUTO failed"; }
if grep -q "NCCL [0-9]" "$tmp/auto.log"; then
  grep -q "nccl_status" "$tmp/auto/build.ninja" || fail "NCCL sources are not built with CUDA AUTO"
  echo "ok: VARIPIPE_WITH_CUDA=AUTO finds CUDA and NCCL and builds the NCCL sources"
  configure on -DVARIPIPE_WITH_CUDA=ON || { cat "$tmp/on.log"; fail "CUDA ON failed though AUTO found CUDA"; }
  echo "ok: VARIPIPE_WITH_CUDA=ON configures"
else
  if grep -q "nccl_status" "$tmp/auto/build.ninja"; then fail "NCCL sources built without CUDA"; fi
  echo "ok: VARIPIPE_WITH_CUDA=AUTO without CUDA/NCCL leaves the NCCL sources out"
  configure on -DVARIPIPE_WITH_CUDA=ON && fail "VARIPIPE_WITH_CUDA=ON succeeded without CUDA"
  grep -q "VARIPIPE_WITH_CUDA=ON but the CUDA Toolkit or NCCL was not found" "$tmp/on.log" \
    || fail "no clear message for VARIPIPE_WITH_CUDA=ON without CUDA"
  echo "ok: VARIPIPE_WITH_CUDA=ON without CUDA fails with a clear message"
fi

configure bad -DVARIPIPE_WITH_CUDA=maybe && fail "VARIPIPE_WITH_CUDA=maybe was accepted"
grep -q "VARIPIPE_WITH_CUDA must be AUTO, ON or OFF (got 'MAYBE')" "$tmp/bad.log" \
  || { cat "$tmp/bad.log"; fail "no clear message for a bad VARIPIPE_WITH_CUDA"; }
echo "ok: a bad VARIPIPE_WITH_CUDA value is rejected"
