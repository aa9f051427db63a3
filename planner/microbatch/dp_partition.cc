#include "planner/microbatch/dp_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Costs of the runs [i, i + k), k = 1..width[i], stored by start: the runs
// within the largest stored limit and the peak limit whose time does not
// exceed the cap.
struct RunTable {
  std::vector<uint32_t> offset;
  std::vector<uint32_t> width;
  std::vector<double> time;
  std::vector<double> stored;
  // Each sample alone (also when over a limit), for errors and pruning.
  std::vector<MicroBatchCost> single;
  std::vector<bool> single_known;
};

// Minimum sum of times over partitions whose runs all take <= tmax, using
// the first width[i] runs from each i. f has n + 1 entries; prev[n] is the
// start of the last run ending at n.
double RunDp(const RunTable& runs, const std::vector<uint32_t>& width, double tmax,
             std::vector<double>& f, std::vector<uint32_t>& prev) {
  const size_t n = width.size();
  std::fill(f.begin(), f.end(), kInf);
  f[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const double base = f[i];
    if (base == kInf) continue;
    const double* t = runs.time.data() + runs.offset[i];
    const uint32_t w = width[i];
    for (uint32_t k = 0; k < w; ++k) {
      if (t[k] > tmax) break;  // times grow with the run
      const double v = base + t[k];
      if (v < f[i + k + 1]) {
        f[i + k + 1] = v;
        prev[i + k + 1] = static_cast<uint32_t>(i);
      }
    }
  }
  return f[n];
}

// Phase 1: costs of all runs within the limits, keeping per-range maxima of
// the lengths as a run grows. Runs stop growing at the first violation:
// costs grow with the run.
void BuildRuns(const DpProblem& p, double stored_limit, double run_cap, RunTable& runs) {
  const size_t n = p.order.size();
  runs.offset.resize(n);
  runs.width.resize(n);
  runs.single.resize(n);
  runs.single_known.assign(n, false);
  runs.time.reserve(n * 8);
  runs.stored.reserve(n * 8);
  MicroBatchCostModel::Row row;
  for (size_t i = 0; i < n; ++i) {
    runs.offset[i] = static_cast<uint32_t>(runs.time.size());
    uint32_t input_len = 0;
    uint32_t target_len = 0;
    bool row_ready = false;
    size_t j = i;
    MicroBatchCost cost;
    for (; j < n; ++j) {
      const SampleLengths& s = p.samples[p.order[j]];
      const uint32_t in = RoundUpLength(SequenceLength(s, p.policy), p.policy.multiple);
      const uint32_t tg = p.policy.encoder_decoder ? RoundUpLength(s.target, p.policy.multiple) : 0;
      if (in > input_len || tg > target_len || !row_ready) {
        input_len = std::max(input_len, in);
        target_len = std::max(target_len, tg);
        row_ready = p.cost->PrepareRow(input_len, target_len, &row);
        if (!row_ready) break;
      }
      if (!p.cost->Evaluate(row, static_cast<uint32_t>(j - i + 1), &cost)) break;
      if (j == i) {
        runs.single[i] = cost;
        runs.single_known[i] = true;
      }
      if (cost.stored_bytes > stored_limit || cost.peak_bytes > p.peak_limit_bytes ||
          cost.time_ms > run_cap) {
        break;
      }
      runs.time.push_back(cost.time_ms);
      runs.stored.push_back(cost.stored_bytes);
    }
    runs.width[i] = static_cast<uint32_t>(j - i);
  }
}

absl::Status DoesNotFit(const DpProblem& p, const RunTable& runs, size_t i, double stored_limit) {
  const SampleLengths& s = p.samples[p.order[i]];
  if (!runs.single_known[i]) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "sample %d (input %d, target %d tokens) lies beyond the cost model's grid (recompute %s)",
        p.order[i], s.input, s.target, RecomputeName(p.cost->recompute())));
  }
  const MicroBatchCost& alone = runs.single[i];
  return absl::ResourceExhaustedError(absl::StrFormat(
      "sample %d (input %d, target %d tokens) does not fit a micro-batch on its own with "
      "recompute %s: it needs %.1f MiB stored / %.1f MiB peak activation, the limits are "
      "%.1f / %.1f MiB",
      p.order[i], s.input, s.target, RecomputeName(p.cost->recompute()),
      alone.stored_bytes / (1 << 20), alone.peak_bytes / (1 << 20), stored_limit / (1 << 20),
      p.peak_limit_bytes / (1 << 20)));
}

// Phases 2-4 for one stored limit over a built table.
absl::StatusOr<DpSolution> SolveBudget(const DpProblem& p, const RunTable& runs,
                                       double stored_limit, double cutoff, double run_cap) {
  const size_t n = p.order.size();
  std::vector<uint32_t> width(n);
  double tmax_floor = 0;
  bool too_slow = false;
  for (size_t i = 0; i < n; ++i) {
    const MicroBatchCost& alone = runs.single[i];
    if (!runs.single_known[i] || alone.stored_bytes > stored_limit ||
        alone.peak_bytes > p.peak_limit_bytes) {
      return DoesNotFit(p, runs, i, stored_limit);
    }
    // Every partition holds each sample in some run at least as slow as the
    // sample alone.
    tmax_floor = std::max(tmax_floor, alone.time_ms);
    too_slow |= alone.time_ms > run_cap;
    // The first run over the limit ends the usable runs (memory grows with
    // the run; a scan rather than a binary search stays safe on noisy
    // profiles).
    const double* stored = runs.stored.data() + runs.offset[i];
    uint32_t w = 0;
    while (w < runs.width[i] && stored[w] <= stored_limit) ++w;
    width[i] = w;
  }
  DpSolution solution;
  const auto pruned = [&](double lower_bound) {
    solution.pruned = true;
    solution.lower_bound_ms = std::min(cutoff, lower_bound);
    return solution;
  };
  if (too_slow) return pruned(cutoff);

  std::vector<double> f(n + 1);
  std::vector<uint32_t> prev(n + 1, 0);
  const double unconstrained = RunDp(runs, width, kInf, f, prev);
  const auto bound = [&](double tmax) {
    return PipelineObjective(tmax, unconstrained, p.pipeline_stages, p.virtual_chunks,
                             p.data_parallel);
  };
  if (p.bound_search && bound(tmax_floor) >= cutoff) return pruned(bound(tmax_floor));

  // Phase 2: candidates. The largest value within each interval stands for
  // all of them.
  std::vector<double> values;
  values.reserve(runs.time.size());
  for (size_t i = 0; i < n; ++i) {
    const double* t = runs.time.data() + runs.offset[i];
    for (uint32_t k = 0; k < width[i]; ++k) {
      if (t[k] >= tmax_floor) values.push_back(t[k]);
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::vector<double> candidates;
  for (size_t k = 0; k < values.size();) {
    size_t last = k;
    while (last + 1 < values.size() && values[last + 1] <= values[k] + p.tmax_interval_ms) ++last;
    candidates.push_back(values[last]);
    k = last + 1;
  }

  // Phase 3: the DP per candidate in increasing order, stopping once
  // (c - 1) * tmax / v + f(N; inf) / |D| cannot beat the best.
  std::vector<uint32_t> best_prev;
  double best = cutoff;
  double best_max = 0;
  double best_sum = 0;
  solution.tmax_candidates = static_cast<int>(candidates.size());
  for (double tmax : candidates) {
    if (p.bound_search && bound(tmax) >= best) break;
    ++solution.tmax_evaluated;
    const double sum = RunDp(runs, width, tmax, f, prev);
    if (sum == kInf) continue;
    // The objective uses the solution's actual largest time (<= tmax).
    double actual_max = 0;
    for (size_t end = n; end > 0; end = prev[end]) {
      actual_max = std::max(actual_max, runs.time[runs.offset[prev[end]] + (end - prev[end] - 1)]);
    }
    const double objective =
        PipelineObjective(actual_max, sum, p.pipeline_stages, p.virtual_chunks, p.data_parallel);
    if (objective < best) {
      best = objective;
      best_max = actual_max;
      best_sum = sum;
      best_prev = prev;
    }
  }
  if (best_prev.empty()) {
    if (cutoff == kInf) {
      return absl::InternalError("micro-batch DP found no partition although every sample fits");
    }
    return pruned(bound(tmax_floor));
  }

  // Phase 4: the runs of the best partition, front to back.
  std::vector<std::pair<uint32_t, uint32_t>> cuts;
  for (size_t end = n; end > 0; end = best_prev[end]) {
    cuts.emplace_back(best_prev[end], static_cast<uint32_t>(end));
  }
  std::reverse(cuts.begin(), cuts.end());
  for (const auto& [begin, end] : cuts) {
    MicroBatchGroup group;
    group.samples.assign(p.order.begin() + begin, p.order.begin() + end);
    PadToLongest(p.samples, p.policy, group);
    MicroBatchCost cost;
    p.cost->Evaluate(static_cast<uint32_t>(group.size()), group.input_len, group.target_len, &cost);
    solution.groups.push_back(std::move(group));
    solution.costs.push_back(cost);
  }
  solution.objective_ms = best;
  solution.max_time_ms = best_max;
  solution.sum_time_ms = best_sum;
  return solution;
}

}  // namespace

double PipelineObjective(double max_time_ms, double sum_time_ms, uint32_t pipeline_stages,
                         uint32_t virtual_chunks, uint32_t data_parallel) {
  return (pipeline_stages - 1.0) * max_time_ms / std::max<uint32_t>(1, virtual_chunks) +
         sum_time_ms / std::max<uint32_t>(1, data_parallel);
}

std::vector<absl::StatusOr<DpSolution>> SolveMicroBatchDpBudgets(
    const DpProblem& p, std::span<const double> stored_limits, double* cutoff) {
  std::vector<absl::StatusOr<DpSolution>> results;
  absl::Status invalid;
  if (p.cost == nullptr) {
    invalid = absl::InvalidArgumentError("micro-batch DP: no cost model");
  } else if (p.order.empty()) {
    invalid = absl::InvalidArgumentError("micro-batch DP: empty mini-batch");
  } else if (p.pipeline_stages == 0 || p.data_parallel == 0 || p.virtual_chunks == 0 ||
             p.policy.multiple == 0 || !(p.tmax_interval_ms >= 0)) {
    invalid = absl::InvalidArgumentError("micro-batch DP: invalid parameters");
  }
  if (!invalid.ok()) {
    results.assign(stored_limits.size(), invalid);
    return results;
  }
  // A run slower than this cannot be part of a partition that beats the
  // cutoff: (c - 1) * max t / v alone would reach it.
  const auto run_cap_for = [&](double c) {
    return p.pipeline_stages > 1 && p.bound_search ? c * p.virtual_chunks / (p.pipeline_stages - 1)
                                                   : kInf;
  };
  RunTable runs;
  const double largest =
      stored_limits.empty() ? 0 : *std::max_element(stored_limits.begin(), stored_limits.end());
  BuildRuns(p, largest, run_cap_for(*cutoff), runs);
  for (double limit : stored_limits) {
    absl::StatusOr<DpSolution> solution =
        SolveBudget(p, runs, limit, *cutoff, run_cap_for(*cutoff));
    if (solution.ok() && !solution->pruned) *cutoff = std::min(*cutoff, solution->objective_ms);
    results.push_back(std::move(solution));
  }
  return results;
}

absl::StatusOr<DpSolution> SolveMicroBatchDp(const DpProblem& p) {
  double cutoff = p.objective_cutoff_ms;
  const double limit = p.stored_limit_bytes;
  return std::move(SolveMicroBatchDpBudgets(p, std::span<const double>(&limit, 1), &cutoff)[0]);
}

}  // namespace varipipe::planner
