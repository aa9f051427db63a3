#!/usr/bin/env bash
# Writes a small synthetic multi-task dataset as JSONL ({"input": [...],
# "target": [...]} per line, token ids 1..VOCAB-1), for the quickstart and
# for trying the system without real data. Three tasks with very different
# lengths, all learnable: continue an arithmetic progression, continue a
# repeated motif (one of a few fixed motifs), and copy a short sequence.
#
# Usage: deploy/make-multitask-dataset.sh OUT.jsonl [--samples N] [--vocab V] [--seed S]
# Convert it for training with:
#   varipipe-convert-jsonl --input OUT.jsonl --output_prefix PREFIX --vocab_size V
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
out=""
samples=4000
vocab=128
seed=7
while [[ $# -gt 0 ]]; do
  case "$1" in
    --samples) samples="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "make-multitask-dataset.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
[[ -n "$out" ]] || { echo "make-multitask-dataset.sh: the output file is required (try --help)" >&2; exit 2; }
[[ "$samples" =~ ^[0-9]+$ && "$samples" -gt 0 ]] || { echo "make-multitask-dataset.sh: --samples must be a positive integer" >&2; exit 2; }
[[ "$vocab" =~ ^[0-9]+$ && "$vocab" -ge 16 ]] || { echo "make-multitask-dataset.sh: --vocab must be an integer >= 16" >&2; exit 2; }

mkdir -p "$(dirname "$out")"
awk -v n="$samples" -v vocab="$vocab" -v seed="$seed" '
function rint(lo, hi) { return lo + int(rand() * (hi - lo + 1)) }
# Log-uniform lengths: many short samples, a long tail.
function length_between(lo, hi) { return int(exp(log(lo) + rand() * (log(hi) - log(lo)))) }
function emit(seq, ni, nt,    k, line) {
  line = "{\"input\": ["
  for (k = 0; k < ni; ++k) line = line (k ? ", " : "") seq[k]
  line = line "], \"target\": ["
  for (k = ni; k < ni + nt; ++k) line = line (k > ni ? ", " : "") seq[k]
  print line "]}"
}
BEGIN {
  srand(seed)
  range = vocab - 1
  for (m = 0; m < 6; ++m) {
    motif_len[m] = rint(2, 5)
    for (k = 0; k < motif_len[m]; ++k) motif[m, k] = rint(1, range)
  }
  for (i = 0; i < n; ++i) {
    task = i % 3
    delete seq
    if (task == 0) {            # progression: long inputs, short targets
      ni = length_between(16, 300); nt = rint(4, 16)
      start = rint(0, range - 1); step = rint(1, 2)
      for (k = 0; k < ni + nt; ++k) seq[k] = 1 + (start + step * k) % range
    } else if (task == 1) {     # motif: medium inputs and targets
      ni = length_between(8, 120); nt = rint(8, 48)
      m = rint(0, 5); phase = rint(0, motif_len[m] - 1)
      for (k = 0; k < ni + nt; ++k) seq[k] = motif[m, (phase + k) % motif_len[m]]
    } else {                    # copy: short inputs, target = input
      ni = rint(3, 24); nt = ni
      for (k = 0; k < ni; ++k) { seq[k] = rint(1, range); seq[ni + k] = seq[k] }
    }
    emit(seq, ni, nt)
  }
}' > "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $samples samples (progression, motif and copy tasks, vocabulary $vocab) to $out"
