#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time from its seed corpus and
# fails on any crash, leak, timeout, out-of-memory or sanitizer report.
#
# Usage: run_fuzzer.sh FUZZER SEED_DIR WORK_DIR [SECONDS [DICT]]
#   SEED_DIR  the checked-in seeds (read only: new inputs go to WORK_DIR)
#   WORK_DIR  emptied first; receives the inputs found (corpus/) and, on a
#             failure, the input that caused it (crash-*, leak-*, ...)
#   SECONDS   run time (default 20); VARIPIPE_FUZZ_SECONDS overrides it
#   DICT      a libFuzzer dictionary (-dict)
# Ends with one line: "<name>: N executions in S s (E per 20 s), corpus C".
set -euo pipefail
fuzzer=$(realpath "${1:?fuzzer binary}")
seeds=$(realpath "${2:?seed corpus directory}")
work=$(realpath -m "${3:?work directory}")
seconds=${VARIPIPE_FUZZ_SECONDS:-${4:-20}}
name=$(basename "$fuzzer")
dict_args=()
if [[ -n "${5:-}" ]]; then dict_args=(-dict="$(realpath "$5")"); fi

# Sanitizer reports with file and line: the symbolizer of Debian's llvm-14.
if [[ -z "${ASAN_SYMBOLIZER_PATH:-}" ]]; then
  symbolizer=$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)
  if [[ -n "$symbolizer" ]]; then export ASAN_SYMBOLIZER_PATH=$symbolizer; fi
fi

rm -rf "$work"
mkdir -p "$work/corpus"
# The targets' scratch files (tests/fuzz/fuzz_scratch.h) go to a directory
# removed here: libFuzzer may end the process without running exit handlers.
scratch_base=${VARIPIPE_FUZZ_TMPDIR:-/tmp}
if [[ -z "${VARIPIPE_FUZZ_TMPDIR:-}" && -d /dev/shm && -w /dev/shm ]]; then scratch_base=/dev/shm; fi
scratch=$(mktemp -d "$scratch_base/varipipe-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export VARIPIPE_FUZZ_TMPDIR=$scratch
log="$work/fuzz.log"
# -timeout: one input running longer is a hang (a failure); -rss_limit_mb and
# -malloc_limit_mb: using more memory is a failure. Leaks are detected
# (libFuzzer's default with AddressSanitizer).
set +e
(cd "$work" && ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1:abort_on_error=0" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-}:print_stacktrace=1:halt_on_error=1" \
  "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/" -print_final_stats=1 "${dict_args[@]}" "$work/corpus" "$seeds") \
  >"$log" 2>&1
status=$?
set -e

executions=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
elapsed=$(sed -nE 's/^Done [0-9]+ runs in ([0-9]+) second.*/\1/p' "$log" | tail -1)
corpus=$(find "$work/corpus" -type f | wc -l)
artifacts=$(find "$work" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
  -o -name 'timeout-*' -o -name 'oom-*' \) || true)
if [[ $status -ne 0 || -n "$artifacts" ]] ||
   grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:" "$log"; then
  tail -n 80 "$log"
  echo "$name: FAILED (exit status $status) after ${executions:-?} executions;" \
       "failing input: ${artifacts:-none saved} (log: $log)"
  exit 1
fi
per20=""
if [[ -n "$executions" && -n "$elapsed" && "$elapsed" -gt 0 ]]; then
  per20=" ($(( executions * 20 / elapsed )) per 20 s)"
fi
echo "$name: ${executions:-?} executions in ${elapsed:-?} s$per20, corpus $((corpus)) new inputs"
