#!/usr/bin/env bash
# Installs what is missing, builds, runs the whole CTest suite and prints a
# final "N passed, N failed" line. Exit status 0 only when every test passed.
#
# Usage: tests/run.sh [--quick] [--label L] [--repeat N] [--preset NAME] [-- ctest arguments]
#   --quick        skip tests labelled `slow`, and the fuzz targets
#   --label L      run only tests labelled L (unit, integration, slow, ...);
#                  `--label fuzz` builds and runs only the fuzz targets
#   --repeat N     stress mode: run the selected tests N times, each round with
#                  twice as many parallel jobs as cores, and list every test that
#                  failed in any round (exit status 1 if one did)
#   --preset NAME  CMake preset to build (default: default; see CMakePresets.json)
#
# The full run (no --quick, --label, --repeat or ctest arguments) ends with
# the fuzz targets: the `fuzz` preset (clang-14, sanitizers; build-fuzz/) is
# built and each target runs for VARIPIPE_FUZZ_SECONDS (default 20) under
# CTest label `fuzz`; their results count in the same total.
#
# Environment: JOBS (parallel build and test jobs; default: number of cores;
# in stress mode the tests run with 2 x JOBS), VARIPIPE_FUZZ_SECONDS.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

preset=default
quick=0
label=""
repeat=0
ctest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --preset) preset="${2:?--preset needs a name}"; shift 2 ;;
    --label) label="${2:?--label needs a label}"; shift 2 ;;
    --repeat)
      repeat="${2:-}"
      if ! [[ "$repeat" =~ ^[1-9][0-9]*$ ]]; then
        echo "tests/run.sh: --repeat needs a positive count (got '${2:-}')" >&2
        exit 2
      fi
      shift 2 ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_args+=("$@"); break ;;
    *) echo "tests/run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
jobs=${JOBS:-$(nproc)}

# The suite of the preset, the fuzz targets (their own build), or both.
run_suite=1
run_fuzz=0
if [[ "$label" == fuzz ]]; then
  run_suite=0
  run_fuzz=1
  if [[ $repeat -gt 0 ]]; then
    echo "tests/run.sh: --repeat does not apply to --label fuzz" >&2
    exit 2
  fi
elif [[ -z "$label" && $quick -eq 0 && $repeat -eq 0 && ${#ctest_args[@]} -eq 0 ]]; then
  run_fuzz=1
fi

step() { printf '\n== %s\n' "$*"; }

step "dependencies"
deploy/install-deps.sh

# Configures and builds `$1`; prints the build folder's path on the last line.
configure_and_build() {
  local name=$1 start
  step "configure (preset $name)"
  # One line listing every dependency and its version, then the build folder.
  cmake --preset "$name" | grep -E "Varipipe dependencies|Build files" || {
    echo "tests/run.sh: cmake configure failed for preset '$name'" >&2
    cmake --preset "$name" >&2 || true
    exit 1
  }
  step "build (preset $name, $jobs jobs)"
  start=$(date +%s)
  cmake --build --preset "$name" -j "$jobs"
  echo "build took $(( $(date +%s) - start )) s"
  if command -v ccache >/dev/null; then
    ccache --show-stats 2>/dev/null | grep -iE "hits|misses" | head -3 || true
  fi
}

# The build folder of preset `$1` (relative to the source tree).
preset_dir() {
  python3 -c '
import json, sys
presets = {p["name"]: p for p in json.load(open("CMakePresets.json"))["configurePresets"]}
p = presets[sys.argv[1]]
while "binaryDir" not in p: p = presets[p["inherits"]]
print(p["binaryDir"].replace("${sourceDir}/", ""))' "$1"
}

build_dir=$(preset_dir "$preset")
if [[ $run_suite -eq 1 ]]; then configure_and_build "$preset"; fi
label_args=()
[[ $quick -eq 1 ]] && label_args+=(-LE slow)
[[ -n "$label" ]] && label_args+=(-L "$label")

# Runs ctest once with `$1` parallel jobs, output to the console and to `$2`;
# returns ctest's exit status.
run_ctest() {
  local parallel=$1 out=$2 status
  set +e
  ctest --test-dir "$build_dir" -j "$parallel" --output-on-failure --no-tests=error \
    "${label_args[@]}" "${ctest_args[@]}" 2>&1 | tee "$out"
  status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

# "N tests passed, M tests failed out of T" -> "M T" (empty when absent).
failed_and_total() {
  grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$1" | tail -1 |
    sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\1 \2/'
}

if [[ $repeat -gt 0 ]]; then
  # Stress mode: the same tests, round after round, under twice the load the
  # machine has cores for; a test that fails in any round is flaky (or broken).
  parallel=$(( 2 * jobs ))
  stress_dir="$build_dir/Testing/stress"
  rm -rf "$stress_dir"
  mkdir -p "$stress_dir"
  passed_all=0
  failed_all=0
  for round in $(seq 1 "$repeat"); do
    step "stress round $round of $repeat (-j $parallel)"
    round_log="$stress_dir/round-$round.log"
    run_ctest "$parallel" "$round_log" || true
    read -r failed total < <(failed_and_total "$round_log") || true
    if [[ -z "${total:-}" ]]; then
      echo "tests/run.sh: round $round produced no ctest summary (see $round_log)" >&2
      failed=1; total=1
      echo "(no summary in round $round)" >> "$stress_dir/failed-tests"
    fi
    passed_all=$(( passed_all + total - failed ))
    failed_all=$(( failed_all + failed ))
    # ctest lists failures as "  12 - suite.Test (Failed)" after this line.
    sed -n '/The following tests FAILED:/,$p' "$round_log" |
      sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) .*/\1/p' |
      sed "s/\$/ (round $round)/" >> "$stress_dir/failed-tests"
  done
  echo
  echo "stress: $repeat rounds at -j $parallel, logs in $stress_dir"
  if [[ -s "$stress_dir/failed-tests" ]]; then
    echo "tests that failed at least once (name, failures, rounds):"
    sed -E 's/ \(round ([0-9]+)\)$/ \1/' "$stress_dir/failed-tests" |
      awk '{n[$1]++; r[$1] = r[$1] (r[$1] ? "," : "") $2} END {for (t in n) printf "  %s: %d of '"$repeat"' (rounds %s)\n", t, n[t], r[t]}' |
      sort
  else
    echo "no test failed in any round"
  fi
  echo
  echo "$passed_all passed, $failed_all failed"
  [[ $failed_all -eq 0 ]]
  exit
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed_sum=0
failed_sum=0
problems=()

# Adds the summary of ctest log `$1` (exit status `$2`, run `$3`) to the sums.
count() {
  local failed total
  read -r failed total < <(failed_and_total "$1") || true
  if [[ -z "${total:-}" ]]; then
    failed_sum=$(( failed_sum + 1 ))
    problems+=("$3: ctest produced no summary (exit status $2)")
    return
  fi
  passed_sum=$(( passed_sum + total - failed ))
  failed_sum=$(( failed_sum + failed ))
  if [[ $2 -ne 0 && $failed -eq 0 ]]; then
    failed_sum=$(( failed_sum + 1 ))
    problems+=("$3: ctest exit status $2")
  fi
}

if [[ $run_suite -eq 1 ]]; then
  step "test"
  ctest_status=0
  run_ctest "$jobs" "$log" || ctest_status=$?
  # Show that the Redis tests ran against a real server.
  grep -h "^redis-server .* on 127\.0\.0\.1:" "$build_dir/Testing/Temporary/LastTest.log" \
    2>/dev/null | sort -u | sed 's/^/  real server: /' || true
  count "$log" "$ctest_status" "suite"
fi

if [[ $run_fuzz -eq 1 ]]; then
  configure_and_build fuzz
  fuzz_dir=$(preset_dir fuzz)
  step "fuzz (${VARIPIPE_FUZZ_SECONDS:-20} s per target, $jobs at a time)"
  fuzz_status=0
  set +e
  ctest --test-dir "$fuzz_dir" -j "$jobs" --output-on-failure --no-tests=error -L fuzz 2>&1 |
    tee "$log"
  fuzz_status=${PIPESTATUS[0]}
  set -e
  # Each target's executions (run_fuzzer.sh's last line).
  grep -hE "^[a-z_]+_fuzzer: " "$fuzz_dir/Testing/Temporary/LastTest.log" 2>/dev/null |
    sed 's/^/  /' || true
  count "$log" "$fuzz_status" "fuzz"
fi

echo
for problem in "${problems[@]}"; do echo "tests/run.sh: $problem"; done
echo "$passed_sum passed, $failed_sum failed"
[[ $failed_sum -eq 0 ]]
