#!/usr/bin/env bash
# The main job on one machine: installs what is missing, builds, and trains.
#
#  1. dependencies and build;
#  2. the planner's decisions for a larger GPT job, planned offline;
#  3. a synthetic multi-task dataset (JSONL, converted to Megatron format)
#     and a small Llama model as a Hugging Face checkpoint to fine-tune
#     (deploy/make-hf-llama.py: nothing can be downloaded here);
#  4. a profile of this machine: varipipe-profile --quick on 2 ranks measures
#     the training job's model components, transfers and optimizer step
#     (cached in build/profiles/, so a second run skips it);
#  5. a planner daemon with its embedded Redis, planning with that profile
#     (and calibrating it online), and 4 executors launched by
#     torchrun --no_python (pp=2, dp=2; Gloo on CPUs, NCCL on GPUs)
#     fine-tuning that Llama (deploy/configs/quickstart-train.json,
#     training.init_from) with a progress line per iteration, exporting it
#     as a Hugging Face checkpoint at the end, then a summary (measured vs
#     predicted iteration time) and a Chrome trace of one iteration.
#
# Usage: deploy/quickstart.sh [--iterations N] [--out DIR] [--skip-build] [--reprofile]
#   --iterations N  iterations to train (default: 30, the config's)
#   --out DIR       working folder (default: build/quickstart), emptied first
#   --skip-build    use the binaries in build/bin as they are
#   --reprofile     measure this machine again instead of using the cached profile
# Environment: JOBS (parallel build jobs; default: number of cores).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

iterations=30
out=build/quickstart
skip_build=0
reprofile=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iterations) iterations="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --reprofile) reprofile=1; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deploy/quickstart.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$iterations" =~ ^[0-9]+$ && "$iterations" -ge 2 ]] || {
  echo "deploy/quickstart.sh: --iterations must be an integer >= 2" >&2; exit 2; }

step() { printf '\n== %s\n' "$*"; }
started=$(date +%s)
bin="$root/build/bin"

if [[ $skip_build -eq 0 ]]; then
  step "1/5 dependencies and build"
  deploy/install-deps.sh
  cmake --preset default | grep -E "Varipipe dependencies|Build files" || {
    cmake --preset default >&2 || true
    exit 1
  }
  cmake --build --preset default -j "${JOBS:-$(nproc)}" \
    --target varipipe-plan varipipe-planner varipipe-ctl varipipe-executor varipipe-convert-jsonl \
    varipipe-profile
else
  step "1/5 dependencies and build: skipped (--skip-build)"
fi
for b in varipipe-plan varipipe-planner varipipe-ctl varipipe-executor varipipe-convert-jsonl \
    varipipe-profile; do
  [[ -x "$bin/$b" ]] || { echo "deploy/quickstart.sh: $bin/$b is missing (run without --skip-build)" >&2; exit 1; }
done
command -v torchrun > /dev/null || {
  echo "deploy/quickstart.sh: torchrun is missing (deploy/install-deps.sh installs it)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)

step "2/5 the planner's decisions for deploy/configs/quickstart-gpt.json (3 iterations, offline)"
# Each iteration's plan, then every partition method's best candidate and why
# the plan beat it (* marks the plan's method).
"$bin/varipipe-plan" --config deploy/configs/quickstart-gpt.json --iterations 3 \
  2> "$out/plan-offline.log"

step "3/5 a synthetic multi-task dataset and a Hugging Face Llama checkpoint"
deploy/make-multitask-dataset.sh "$out/data/multitask.jsonl" --samples 4000 --vocab 128 --seed 7
"$bin/varipipe-convert-jsonl" --input "$out/data/multitask.jsonl" \
  --output_prefix "$out/data/multitask" --vocab_size 128 > /dev/null 2> "$out/convert.log" || {
  cat "$out/convert.log" >&2; exit 1; }
# The model to fine-tune (training.init_from: hf-base, beside job.json):
# the shape of the job's model section, random weights.
python3 deploy/make-hf-llama.py --out "$out/hf-base" --layers 4 --hidden 64 --heads 4 \
  --kv-heads 2 --ffn 128 --vocab 128 --seed 7

# The profile depends on the model and this machine: cached per config.
step "4/5 a profile of this machine (varipipe-profile --quick, 2 ranks)"
config_digest=$(sha256sum deploy/configs/quickstart-train.json | cut -c1-12)
profile="$root/build/profiles/quickstart-$config_digest.json"
mkdir -p "$root/build/profiles"
# A cached profile of an older format (the planner refuses it) is measured
# again: the format's number comes from common/cost_model_format.h.
format=$(sed -n 's/.*kCostModelFormatVersion = \([0-9]*\);.*/\1/p' "$root/common/cost_model_format.h")
cached_format=$( [[ -s "$profile" ]] &&
  grep -o '"format_version": *[0-9]*' "$profile" | grep -o '[0-9]*$' || true)
if [[ -s "$profile" && $reprofile -eq 0 && "$cached_format" == "$format" ]]; then
  echo "cached: $profile (--reprofile measures again)"
else
  [[ -s "$profile" && "$cached_format" != "$format" ]] &&
    echo "cached profile $profile is of format ${cached_format:-unknown}, not $format: profiling again"
  profile_started=$(date +%s)
  (cd "$root/build/profiles" && torchrun --standalone --nnodes 1 --nproc_per_node 2 --no_python \
    --redirects 2 --tee 2 --log_dir "$out/profile-torchrun" \
    "$bin/varipipe-profile" --config "$root/deploy/configs/quickstart-train.json" \
      --out "$profile" --quick) 2>&1 |
    sed -E -u 's/^\[default([0-9]+)\]:\[[^]]*\] \[varipipe-profile\] \[[a-z]+\] /rank \1: /' |
    grep -E --line-buffered "rank 0: (\[|transfers|optimizer|wrote)|error" || true
  [[ -s "$profile" ]] || {
    echo "deploy/quickstart.sh: profiling failed (logs: $out/profile-torchrun)" >&2; exit 1; }
  echo "profiled in $(( $(date +%s) - profile_started )) s: $profile"
fi

# The job config names its data relative to itself: data/multitask_{input,target}.
sed -E -e "s/\"iterations\": [0-9]+/\"iterations\": $iterations/" \
  -e "s#\"planner\": \{#\"planner\": { \"cost_model_path\": \"$profile\",#" \
  deploy/configs/quickstart-train.json > "$out/job.json"
echo "dataset: $out/data/multitask_{input,target}.{idx,bin}; job: $out/job.json"

step "5/5 planner daemon (embedded Redis) and 4 executors (torchrun, pp=2, dp=2)"
training_started=$(date +%s)
planner_pid=""
cleanup() {
  if [[ -n "$planner_pid" ]]; then
    kill -TERM "$planner_pid" 2> /dev/null || true
    wait "$planner_pid" 2> /dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$bin/varipipe-planner" --config "$out/job.json" --listen 127.0.0.1:0 \
  --port_file "$out/planner.port" --store_file "$out/store" --progress_interval_s 0 \
  --keep_serving 2> "$out/planner.log" &
planner_pid=$!
for _ in $(seq 1 200); do
  [[ -s "$out/planner.port" && -s "$out/store" ]] && break
  kill -0 "$planner_pid" 2> /dev/null || { cat "$out/planner.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$out/planner.port" ]] || { echo "the planner daemon did not start" >&2; cat "$out/planner.log" >&2; exit 1; }
planner="127.0.0.1:$(cat "$out/planner.port")"
echo "planner daemon on $planner (log: $out/planner.log)"

# torchrun --standalone draws a fresh run id per launch (the executors'
# rendezvous keys); rank 0 logs, the others only warnings and errors.
(cd "$out" && torchrun --standalone --nnodes 1 --nproc_per_node 4 --no_python \
  --redirects 2 --tee 2 --log_dir "$out/torchrun" \
  "$bin/varipipe-executor" --planner "$planner" --store_file "$out/store" \
    --metrics_jsonl "$out/metrics.jsonl" --status_port 0 --status_host 127.0.0.1 \
    --log_all_ranks=false --export_hf "$out/hf-trained") 2>&1 |
  sed -E -u 's/^\[default([0-9]+)\]:\[[^]]*\] \[executor\[rank [0-9]+\]\] \[info\] /rank \1: /' |
  grep -E --line-buffered -v '^\s*$' || {
    echo "deploy/quickstart.sh: the executors failed (logs: $out/torchrun)" >&2
    exit 1
  }

# The Chrome trace of one iteration, from the daemon, then stop it.
trace_iteration=$((iterations / 2))
"$bin/varipipe-ctl" --planner "$planner" --store_file "$out/store" trace \
  --iteration "$trace_iteration" \
  --out "$out/trace.json" > /dev/null
"$bin/varipipe-ctl" --planner "$planner" --store_file "$out/store" status \
  > "$out/planner-status.txt" || true
cleanup
planner_pid=""

# Summary from rank 0's metrics (one JSON object per iteration).
awk -v iterations="$iterations" -v seconds=$(( $(date +%s) - started )) \
  -v training=$(( $(date +%s) - training_started )) '
function field(line, name,    m) {
  if (match(line, "\"" name "\": [-0-9.eE+]+")) {
    m = substr(line, RSTART, RLENGTH); sub(/.*: /, "", m); return m + 0
  }
  return 0
}
{
  n++
  loss[n] = field($0, "loss")
  measured[n] = field($0, "step_ms"); predicted[n] = field($0, "predicted_ms")
  if (n > 1) {  # the first iteration includes warm-up (allocations, connections)
    tokens += field($0, "real_tokens_per_s"); eff += field($0, "padding_efficiency"); m++
  }
}
END {
  if (n < iterations) { printf "only %d of %d iterations ran\n", n, iterations; exit 1 }
  # Prediction error from iteration 5 on (the planner calibrates its profile
  # from the reports of the first iterations); all but the first on short runs.
  first = n > 6 ? 6 : 2
  k = 0; sum_measured = 0; sum_predicted = 0
  for (i = first; i <= n; i++) {
    err[++k] = (predicted[i] > measured[i] ? predicted[i] - measured[i] : measured[i] - predicted[i]) / measured[i]
    sum_measured += measured[i]; sum_predicted += predicted[i]
  }
  for (i = 2; i <= k; i++) {  # insertion sort (POSIX awk has no asort)
    v = err[i]; for (j = i - 1; j >= 1 && err[j] > v; j--) err[j + 1] = err[j]; err[j + 1] = v
  }
  median = k % 2 ? err[(k + 1) / 2] : (err[k / 2] + err[k / 2 + 1]) / 2
  printf "\n== summary: %d iterations trained in %d s (%d s in all)\n", n, training, seconds
  printf "  loss                 %.4f (iteration 0) -> %.4f (iteration %d)\n", loss[1], loss[n], n - 1
  printf "  real tokens/s        %.0f (mean over iterations 1..%d)\n", tokens / m, n - 1
  printf "  padding efficiency   %.1f%%\n", 100 * eff / m
  printf "  iteration time       measured %.1f ms, predicted %.1f ms (mean over iterations %d..%d)\n", sum_measured / k, sum_predicted / k, first - 1, n - 1
  printf "  prediction error  %.1f%% (median over iterations %d..%d)\n", 100 * median, first - 1, n - 1
}' "$out/metrics.jsonl"
echo "  Chrome trace         $out/trace.json (iteration $trace_iteration; open in Perfetto or chrome://tracing)"
echo "  checkpoints          $out/checkpoints"
echo "  Hugging Face export  $out/hf-trained (fine-tuned from $out/hf-base; the layout LlamaForCausalLM.from_pretrained reads)"
echo "  cost model           $profile (calibration: $out/planner-status.txt)"
echo "  logs                 $out/planner.log, $out/torchrun"

# The run drawn: loss and real tokens/s per iteration (deploy/plot-run.py).
if plot_error=$(deploy/plot-run.py "$out/metrics.jsonl" "$out/run.png" \
    --title "quickstart (pp=2, dp=2, small Llama)" 2>&1); then
  echo "  plot                 $out/run.png (loss and real tokens/s per iteration)"
else
  echo "  plot                 not drawn: $plot_error"
fi
