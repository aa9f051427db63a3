#include "planner/microbatch/dp_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Costs of every feasible run [i, i + k), k = 1..width[i], stored by start.
struct RunTable {
  std::vector<uint32_t> offset;  // start of run i's entries in `time`
  std::vector<uint32_t> width;   // feasible run lengths from i
  std::vector<double> time;
};

// Minimum sum of times over partitions whose runs all take <= tmax.
// f has n + 1 entries; prev[n] is the start of the last run ending at n.
double RunDp(const RunTable& runs, double tmax, std::vector<double>& f,
             std::vector<uint32_t>& prev) {
  const size_t n = runs.width.size();
  std::fill(f.begin(), f.end(), kInf);
  f[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const double base = f[i];
    if (base == kInf) continue;
    const double* t = runs.time.data() + runs.offset[i];
    const uint32_t w = runs.width[i];
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

}  // namespace

double PipelineObjective(double max_time_ms, double sum_time_ms, uint32_t pipeline_stages,
                         uint32_t virtual_chunks, uint32_t data_parallel) {
  return (pipeline_stages - 1.0) * max_time_ms / std::max<uint32_t>(1, virtual_chunks) +
         sum_time_ms / std::max<uint32_t>(1, data_parallel);
}

absl::StatusOr<DpSolution> SolveMicroBatchDp(const DpProblem& p) {
  if (p.cost == nullptr) return absl::InvalidArgumentError("micro-batch DP: no cost model");
  if (p.order.empty()) return absl::InvalidArgumentError("micro-batch DP: empty mini-batch");
  if (p.pipeline_stages == 0 || p.data_parallel == 0 || p.virtual_chunks == 0 ||
      p.policy.multiple == 0 || !(p.tmax_interval_ms >= 0)) {
    return absl::InvalidArgumentError("micro-batch DP: invalid parameters");
  }
  const size_t n = p.order.size();
  RunTable runs;
  runs.offset.resize(n);
  runs.width.resize(n);
  runs.time.reserve(n * 8);
  MicroBatchCostModel::Row row;
  std::vector<double> singles(n);

  // Phase 1: costs of all feasible runs, with running maxima of the lengths.
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
      if (!p.cost->Evaluate(row, static_cast<uint32_t>(j - i + 1), &cost) ||
          cost.stored_bytes > p.stored_limit_bytes || cost.peak_bytes > p.peak_limit_bytes) {
        break;
      }
      runs.time.push_back(cost.time_ms);
    }
    runs.width[i] = static_cast<uint32_t>(j - i);
    if (runs.width[i] == 0) {
      const SampleLengths& s = p.samples[p.order[i]];
      MicroBatchCost alone;
      const bool known = p.cost->Evaluate(
          1, RoundUpLength(SequenceLength(s, p.policy), p.policy.multiple),
          p.policy.encoder_decoder ? RoundUpLength(s.target, p.policy.multiple) : 0, &alone);
      return absl::ResourceExhaustedError(
          known ? absl::StrFormat(
                      "sample %d (input %d, target %d tokens) does not fit a micro-batch on its "
                      "own with recompute %s: it needs %.1f MiB stored / %.1f MiB peak "
                      "activation, the limits are %.1f / %.1f MiB",
                      p.order[i], s.input, s.target, RecomputeName(p.cost->recompute()),
                      alone.stored_bytes / (1 << 20), alone.peak_bytes / (1 << 20),
                      p.stored_limit_bytes / (1 << 20), p.peak_limit_bytes / (1 << 20))
                : absl::StrFormat("sample %d (input %d, target %d tokens) lies beyond the cost "
                                  "model's grid (recompute %s)",
                                  p.order[i], s.input, s.target,
                                  RecomputeName(p.cost->recompute())));
    }
    singles[i] = runs.time[runs.offset[i]];
  }

  // Phase 2: tmax candidates. Every partition contains each sample in some
  // run, whose time is at least that sample's own time.
  const double tmax_floor = *std::max_element(singles.begin(), singles.end());
  std::vector<double> values;
  values.reserve(runs.time.size());
  for (double t : runs.time) {
    if (t >= tmax_floor) values.push_back(t);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::vector<double> candidates;
  for (size_t k = 0; k < values.size();) {
    // The largest value within the interval stands for all of them.
    size_t last = k;
    while (last + 1 < values.size() && values[last + 1] <= values[k] + p.tmax_interval_ms) ++last;
    candidates.push_back(values[last]);
    k = last + 1;
  }

  // Phase 3: the DP per candidate, in increasing order, with the bound.
  std::vector<double> f(n + 1);
  std::vector<uint32_t> prev(n + 1, 0);
  std::vector<uint32_t> best_prev;
  const double unconstrained = RunDp(runs, kInf, f, prev);
  double best = kInf;
  double best_max = 0;
  double best_sum = 0;
  DpSolution solution;
  solution.tmax_candidates = static_cast<int>(candidates.size());
  for (double tmax : candidates) {
    const double bound = PipelineObjective(tmax, unconstrained, p.pipeline_stages,
                                           p.virtual_chunks, p.data_parallel);
    if (bound >= best) break;
    ++solution.tmax_evaluated;
    const double sum = RunDp(runs, tmax, f, prev);
    if (sum == kInf) continue;
    // The objective uses the solution's actual largest time (<= tmax).
    double actual_max = 0;
    for (size_t end = n; end > 0; end = prev[end]) {
      actual_max = std::max(actual_max, runs.time[runs.offset[prev[end]] + (end - prev[end] - 1)]);
    }
    const double objective = PipelineObjective(actual_max, sum, p.pipeline_stages,
                                               p.virtual_chunks, p.data_parallel);
    if (objective < best) {
      best = objective;
      best_max = actual_max;
      best_sum = sum;
      best_prev = prev;
    }
  }
  if (best == kInf) {
    return absl::InternalError("micro-batch DP found no partition although every sample fits");
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
    p.cost->Evaluate(static_cast<uint32_t>(group.size()), group.input_len, group.target_len,
                     &cost);
    solution.groups.push_back(std::move(group));
    solution.costs.push_back(cost);
  }
  solution.objective_ms = best;
  solution.max_time_ms = best_max;
  solution.sum_time_ms = best_sum;
  return solution;
}

}  // namespace varipipe::planner
