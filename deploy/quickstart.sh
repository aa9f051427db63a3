#!/usr/bin/env bash
# The main job on one machine: installs what is missing, builds, and runs it.
#
# Today the main job plans a few iterations of a small GPT job
# (deploy/configs/quickstart-gpt.json) on the synthetic FLAN-like dataset,
# compares partition methods and schedules, and writes every rank's
# execution plans and a Chrome trace. As the planner service and executors
# land it grows into the full demo: a planner daemon with its embedded Redis
# and four executors training with pp=2, dp=2.
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

step "1/3 dependencies"
deploy/install-deps.sh

step "2/3 build"
cmake --preset default | grep -E "Varipipe dependencies|Build files" || {
  cmake --preset default >&2 || true
  exit 1
}
cmake --build --preset default -j "${JOBS:-$(nproc)}" --target varipipe-plan

out=build/quickstart
step "3/3 plan $iterations iterations of $config"
rm -rf "$out"
mkdir -p "$out"
build/bin/varipipe-plan --config "$config" --iterations "$iterations" --compare \
  --emit-plans "$out/plans" --trace "$out/trace.json"

echo
echo "quickstart finished: planned $iterations iterations."
echo "  execution plans:  $out/plans/iteration_*/rank_*.json"
echo "  Chrome trace:     $out/trace.json (open in Perfetto or chrome://tracing)"
echo "Next: tests/run.sh runs the test suite; docs/architecture.md explains the system."
