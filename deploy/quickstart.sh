#!/usr/bin/env bash
# The main job on one machine: installs what is missing, builds, and runs it.
#
# Today the main job plans a few iterations of a small GPT job
# (deploy/configs/quickstart-gpt.json) on the synthetic FLAN-like dataset,
# compares partition methods and schedules, writes every rank's execution
# plans and a Chrome trace, then starts a planner daemon with its embedded
# Redis, fetches plans over gRPC with varipipe-ctl, shows its status and
# stops it. The executors will turn it into the full training demo (four
# executors, pp=2, dp=2).
#
# Usage: deploy/quickstart.sh [--iterations N] [--config FILE]
# Environment: JOBS (parallel build jobs; default: number of cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

config=deploy/configs/quickstart-gpt.json
iterations=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iterations) iterations="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deploy/quickstart.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

step() { printf '\n== %s\n' "$*"; }

step "1/4 dependencies"
deploy/install-deps.sh

step "2/4 build"
cmake --preset default | grep -E "Varipipe dependencies|Build files" || {
  cmake --preset default >&2 || true
  exit 1
}
cmake --build --preset default -j "${JOBS:-$(nproc)}" \
  --target varipipe-plan varipipe-planner varipipe-ctl

out=build/quickstart
step "3/4 plan $iterations iterations of $config offline"
rm -rf "$out"
mkdir -p "$out"
build/bin/varipipe-plan --config "$config" --iterations "$iterations" --compare \
  --emit-plans "$out/plans" --trace "$out/trace.json"

step "4/4 planner daemon with its embedded Redis, queried with varipipe-ctl"
build/bin/varipipe-planner --config "$config" --listen 127.0.0.1:0 --port_file "$out/port" \
  --progress_interval_s 0 2> "$out/planner.log" &
planner_pid=$!
trap 'kill "$planner_pid" 2>/dev/null; wait "$planner_pid" 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  [[ -s "$out/port" ]] && break
  kill -0 "$planner_pid" 2>/dev/null || { cat "$out/planner.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$out/port" ]] || { echo "the planner daemon did not start" >&2; cat "$out/planner.log" >&2; exit 1; }
planner="127.0.0.1:$(cat "$out/port")"
echo "planner daemon listening on $planner (log: $out/planner.log)"
echo
echo "\$ varipipe-ctl plan --iteration 0 --rank 0   (first lines)"
build/bin/varipipe-ctl --planner "$planner" plan --iteration 0 --rank 0 | head -n 12 || true
echo
echo "\$ varipipe-ctl plan --iteration 1 --rank 3   (first lines)"
build/bin/varipipe-ctl --planner "$planner" plan --iteration 1 --rank 3 | head -n 4 || true
echo
echo "\$ varipipe-ctl status"
build/bin/varipipe-ctl --planner "$planner" status
kill -TERM "$planner_pid"
wait "$planner_pid" || true
trap - EXIT
echo "planner daemon stopped"

echo
echo "quickstart finished: planned $iterations iterations offline and served plans over gRPC."
echo "  execution plans:  $out/plans/iteration_*/rank_*.json"
echo "  Chrome trace:     $out/trace.json (open in Perfetto or chrome://tracing)"
echo "Next: tests/run.sh runs the test suite; docs/architecture.md explains the system."
