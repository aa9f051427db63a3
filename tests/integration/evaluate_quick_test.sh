#!/usr/bin/env bash
# deploy/evaluate.sh --quick regenerates every CSV and plot from nothing:
# each CSV has its header and rows, every method has a tuned (chosen) row for
# every model, mixture and length, and every plot is a PNG.
# Usage: evaluate_quick_test.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=$1
bin=$2/bin
out=$2/evaluation-quick
rm -rf "$out"
"$src/deploy/evaluate.sh" --quick --skip-build --bin "$bin" --out "$out"
fail() { echo "evaluate_quick_test: $*" >&2; exit 1; }
for csv in throughput memory planning trace schedules; do
  f="$out/$csv.csv"
  [[ -s "$f" ]] || fail "$f was not written"
  [[ $(wc -l < "$f") -ge 2 ]] || fail "$f has no rows"
done
head -1 "$out/throughput.csv" | grep -q '^model,mixture,cost_model,max_len,memory_mib,method,' ||
  fail "throughput.csv: unexpected header"
# 2 models x 2 mixtures x 2 lengths x 7 methods (the default search, each
# method alone, packing with full-row and with variable-length attention)
# tuned settings.
# Quoted fields (the cost model's description) may hold commas: drop them first.
chosen=$(sed -E 's/"[^"]*"//g' "$out/throughput.csv" | awk -F, 'NR > 1 && $10 == 1' | wc -l)
[[ $chosen -eq 56 ]] || fail "throughput.csv: $chosen chosen rows, expected 56"
for m in varipipe dp packing packing-varlen token-based fixed-size padding; do
  grep -q ",$m," "$out/throughput.csv" || fail "throughput.csv: no rows for $m"
done
pngs=0
for png in "$out"/*.png; do
  [[ $(head -c 4 "$png" | od -An -c | tr -d ' ') == '211PNG' ]] || fail "$png is not a PNG"
  pngs=$((pngs + 1))
done
[[ $pngs -ge 7 ]] || fail "only $pngs plots"
echo "evaluate_quick_test: $chosen tuned settings, $pngs plots in $out"
