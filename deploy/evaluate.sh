#!/usr/bin/env bash
# Regenerates the evaluation in simulation (docs/evaluation.md): the
# project's planner and simulator (varipipe-evaluate) on GPT-6.7B (pp = 4,
# dp = 2) and T5-11B (pp = 8), FLAN-like and documents-like mixtures, with
# the analytic A100 cost model and every measured cost model in
# deploy/cost-models/ named after a config (e.g. gpt-6.7b-pp4*.json or a
# DynaPipe profile directory gpt-6.7b-pp4*/). Writes CSVs and PNG plots
# (python3-matplotlib) and the page docs/evaluation.md.
#
# Usage: deploy/evaluate.sh [--quick] [--out DIR] [--bin DIR] [--skip-build]
#   --quick        small run for CI: 2 mini-batches, lengths 512 and 2048,
#                  two memory limits, 3 draws per spread; writes no page
#   --out DIR      where CSVs and PNGs go (default: docs/evaluation; the page
#                  goes to DIR/../evaluation.md)
#   --bin DIR      directory of varipipe-evaluate (default: build/bin)
#   --skip-build   do not build varipipe-evaluate first
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

quick=0
out=docs/evaluation
bin=build/bin
skip_build=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deploy/evaluate.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

if [[ $skip_build -eq 0 && ! -x "$bin/varipipe-evaluate" ]]; then
  cmake --preset default > /dev/null
  cmake --build --preset default -j "${JOBS:-$(nproc)}" --target varipipe-evaluate
fi
evaluate="$bin/varipipe-evaluate"
[[ -x "$evaluate" ]] || { echo "deploy/evaluate.sh: $evaluate is missing" >&2; exit 1; }
# Debian's python3 (with python3-matplotlib) even when another python3 comes
# first on PATH.
python=""
for p in /usr/bin/python3 python3; do
  if "$p" -c "import matplotlib" 2> /dev/null; then python=$p; break; fi
done
[[ -n "$python" ]] || {
  echo "deploy/evaluate.sh: python3-matplotlib is missing (deploy/install-deps.sh installs it)" >&2
  exit 1; }

if [[ $quick -eq 1 ]]; then
  mini_batches=2; memory_batches=2; planning_batches=4; trials=3
  lengths=512,2048
  memory_gpt=32768,40960; memory_t5=65536,81920
else
  # The full run: about 5 minutes on 2 cores (docs/evaluation.md).
  mini_batches=16; memory_batches=8; planning_batches=64; trials=20
  lengths=512,1024,2048,4096,8192
  memory_gpt=24576,32768,40960,49152,65536,81920
  memory_t5=40960,49152,57344,65536,73728,81920
fi
mkdir -p "$out"
started=$(date +%s)

# Cost models: "analytic" and each measured one whose name starts with a
# config's name.
models=(gpt-6.7b-pp4 t5-11b-pp8)
declare -A memory=([gpt-6.7b-pp4]=$memory_gpt [t5-11b-pp8]=$memory_t5)
jobs_file=$(mktemp)
trap 'rm -f "$jobs_file"' EXIT
for model in "${models[@]}"; do
  cost_models=("")
  if [[ -d deploy/cost-models ]]; then
    for f in deploy/cost-models/"$model"*; do
      [[ -e "$f" ]] && cost_models+=("$f")
    done
  fi
  for cm in "${cost_models[@]}"; do
    tag=analytic
    [[ -n "$cm" ]] && tag=$(basename "${cm%.json}")
    for mixture in flan documents; do
      common=(--config "deploy/configs/$model.json" --mixture "$mixture" --cost_model "$cm")
      stem="$out/.parts/$model.$mixture.$tag"
      printf '%s\n' "$(printf '%q ' "$evaluate" --experiment throughput "${common[@]}" \
        --max_lengths "$lengths" --mini_batches "$mini_batches") > $stem.throughput.csv" \
        "$(printf '%q ' "$evaluate" --experiment throughput "${common[@]}" \
        --max_lengths 2048 --memory_mib "${memory[$model]}" --mini_batches "$memory_batches") > $stem.memory.csv" \
        "$(printf '%q ' "$evaluate" --experiment planning "${common[@]}" \
        --max_lengths "$lengths" --mini_batches "$planning_batches") > $stem.planning.csv" \
        >> "$jobs_file"
      if [[ $mixture == flan ]]; then
        printf '%s\n' "$(printf '%q ' "$evaluate" --experiment trace "${common[@]}" \
          --max_lengths 2048 --trace "$stem.trace.json") > $stem.trace.csv" >> "$jobs_file"
      fi
    done
  done
done
printf '%s\n' "$(printf '%q ' "$evaluate" --experiment schedules --trials "$trials") > $out/.parts/schedules.csv" >> "$jobs_file"

rm -rf "$out/.parts"
mkdir -p "$out/.parts"
echo "evaluate: $(wc -l < "$jobs_file") runs of varipipe-evaluate, ${JOBS:-$(nproc)} at a time"
# Each line is one independent run; failures stop the evaluation.
xargs -d '\n' -n 1 -P "${JOBS:-$(nproc)}" \
  bash -c 'eval "$1" || { echo "evaluate: failed: $1" >&2; exit 255; }' _ < "$jobs_file"

# One CSV per experiment (the header once).
for kind in throughput memory planning trace; do
  files=("$out"/.parts/*."$kind".csv)
  { head -n 1 "${files[0]}"; for f in "${files[@]}"; do tail -n +2 "$f"; done; } > "$out/$kind.csv"
done
cp "$out/.parts/schedules.csv" "$out/schedules.csv"
mkdir -p "$out/traces"
cp "$out"/.parts/*.trace.json "$out/traces/"
rm -rf "$out/.parts"

# "66 s" or "6 minutes".
duration() { if [[ $1 -lt 120 ]]; then echo "$1 s"; else echo "$(( ($1 + 30) / 60 )) minutes"; fi; }
page=()
[[ $quick -eq 0 ]] && page=(--page "$out/../evaluation.md")
elapsed=$(( $(date +%s) - started ))
"$python" deploy/plot-evaluation.py --dir "$out" "${page[@]}" \
  --settings "mini-batches: $mini_batches per setting ($memory_batches per memory limit, $planning_batches for planning times)" \
  --run_time "its last run planned and simulated for $(duration "$elapsed") on a $(nproc)-core machine"
echo "evaluate: CSVs and plots in $out ($(( $(date +%s) - started )) s)"
