#!/usr/bin/env bash
# Installs what is missing, builds, runs the whole CTest suite and prints a
# final "N passed, N failed" line. Exit status 0 only when every test passed.
#
# Usage: tests/run.sh [--quick] [--preset NAME] [-- extra ctest arguments]
#   --quick        skip tests labelled `slow`
#   --preset NAME  CMake preset to build (default: default; see CMakePresets.json)
#
# Environment: JOBS (parallel build and test jobs; default: number of cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

preset=default
quick=0
ctest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --preset) preset="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_args+=("$@"); break ;;
    *) echo "tests/run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
jobs=${JOBS:-$(nproc)}

step() { printf '\n== %s\n' "$*"; }

step "dependencies"
deploy/install-deps.sh

step "configure (preset $preset)"
# One line listing every dependency and its version, then the build folder.
cmake --preset "$preset" | grep -E "Varipipe dependencies|Build files" || {
  echo "tests/run.sh: cmake configure failed for preset '$preset'" >&2
  cmake --preset "$preset" >&2 || true
  exit 1
}
build_dir=$(python3 -c '
import json, sys
presets = {p["name"]: p for p in json.load(open("CMakePresets.json"))["configurePresets"]}
p = presets[sys.argv[1]]
while "binaryDir" not in p: p = presets[p["inherits"]]
print(p["binaryDir"].replace("${sourceDir}/", ""))' "$preset")

step "build ($jobs jobs)"
start=$(date +%s)
cmake --build --preset "$preset" -j "$jobs"
echo "build took $(( $(date +%s) - start )) s"
if command -v ccache >/dev/null; then ccache --show-stats 2>/dev/null | grep -iE "hits|misses" | head -3 || true; fi

step "test"
label_args=()
[[ $quick -eq 1 ]] && label_args=(-LE slow)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --no-tests=error \
  "${label_args[@]}" "${ctest_args[@]}" 2>&1 | tee "$log"
ctest_status=${PIPESTATUS[0]}
set -e

# Show that the Redis tests ran against a real server.
grep -h "^redis-server .* on 127\.0\.0\.1:" "$build_dir/Testing/Temporary/LastTest.log" \
  2>/dev/null | sort -u | sed 's/^/  real server: /' || true

summary=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1 || true)
if [[ -z "$summary" ]]; then
  echo "0 passed, 1 failed (ctest produced no summary; exit status $ctest_status)"
  exit 1
fi
failed=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$summary")
total=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$summary")
echo
echo "$(( total - failed )) passed, $failed failed"
[[ $ctest_status -eq 0 && $failed -eq 0 ]]
