#include "planner/microbatch/dp_partition.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/parallel.h"

namespace varipipe::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The stored activation a budget limits: per micro-batch (depth 1), or
// everything a device holds at once over the depth (DpBudget).
double BudgetStored(const MicroBatchCost& c, uint32_t depth) {
  return depth > 1 ? c.depth_stored_bytes / depth : c.stored_bytes;
}

// Costs of the runs [i, i + k), k = 1..width[i], by start: the runs within
// the largest limit and the peak limit whose time does not exceed the cap.
// A table serves either whole-device budgets (memory: stored_bytes) or
// pipeline-depth budgets (memory: depth_stored_bytes). Runs live in chunks
// of starts (built in parallel); time_at[i][k] is run [i, i + k + 1).
struct RunTable {
  std::vector<uint32_t> width;
  std::vector<const double*> time_at;
  std::vector<const double*> memory_at;
  bool depth_memory = false;
  std::vector<std::vector<double>> time_chunks;
  std::vector<std::vector<double>> memory_chunks;
  // Labelled tokens of the order's positions [0, i): run [i, j) has
  // labelled[j] - labelled[i] (the head's price, LabelledTokens).
  std::vector<double> labelled;
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
    const double* t = runs.time_at[i];
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

// The padded input length of the sample at `position` (PaddedInputLength).
uint32_t PaddedInput(const DpProblem& p, uint32_t position) {
  return PaddedInputLength(SequenceLength(p.samples[position], p.policy), p.policy);
}

// The padded target length of the sample at `position` (0 for decoder-only).
uint32_t PaddedTarget(const DpProblem& p, uint32_t position) {
  return PaddedTargetLength(p.samples[position].target, p.policy);
}

// The RowCache slot of a padded length: ceil(length / multiple). Padded
// lengths are multiples of `multiple` except the capped limit itself, whose
// slot is that of its rounded length, which never occurs; so distinct padded
// lengths have distinct slots.
size_t SlotOf(uint32_t padded_length, uint32_t multiple) {
  return (size_t{padded_length} + multiple - 1) / multiple;
}

// Cost-model rows of the padded lengths a decoder-only mini-batch has,
// prepared once: a run's padded length is always one of its samples' (the
// rows are the costly part of a cost evaluation).
struct RowCache {
  std::vector<int> slot;  // by SlotOf(padded length); -1: none
  std::vector<MicroBatchCostModel::Row> rows;
  std::vector<char> ok;

  const MicroBatchCostModel::Row* Find(uint32_t input_len, uint32_t multiple) const {
    const size_t k = SlotOf(input_len, multiple);
    if (k >= slot.size() || slot[k] < 0 || !ok[slot[k]]) return nullptr;
    return &rows[slot[k]];
  }
};

void PrepareRows(const DpProblem& p, RowCache& cache) {
  if (p.policy.encoder_decoder) return;  // runs pad to (max input, max target) pairs
  std::vector<uint32_t> lengths;
  for (uint32_t position : p.order) lengths.push_back(PaddedInput(p, position));
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  cache.slot.assign(SlotOf(lengths.back(), p.policy.multiple) + 1, -1);
  cache.rows.resize(lengths.size());
  cache.ok.assign(lengths.size(), 0);
  for (size_t k = 0; k < lengths.size(); ++k) cache.slot[SlotOf(lengths[k], p.policy.multiple)] = k;
  ParallelFor(lengths.size(), p.threads,
              [&](size_t k) { cache.ok[k] = p.cost->PrepareRow(lengths[k], 0, &cache.rows[k]); });
}

// Labelled tokens of the order's first i positions, i = 0..n (RunTable).
std::vector<double> LabelledPrefix(const DpProblem& p) {
  std::vector<double> prefix(p.order.size() + 1, 0);
  for (size_t i = 0; i < p.order.size(); ++i) {
    const uint32_t position = p.order[i];
    prefix[i + 1] = prefix[i] + static_cast<double>(
                                    p.labelled.empty()
                                        ? LossTokens(p.samples[position], p.policy.encoder_decoder)
                                        : p.labelled[position]);
  }
  return prefix;
}

// Phase 0: each sample alone (for errors, feasibility and the run cap).
void CostSingles(const DpProblem& p, const RowCache& cache, RunTable& runs) {
  const size_t n = p.order.size();
  runs.single.resize(n);
  std::vector<char> known(n, 0);  // not vector<bool>: chunks write it concurrently
  const size_t chunks = p.threads > 1 ? std::min<size_t>(n, 8 * static_cast<size_t>(p.threads)) : 1;
  ParallelFor(chunks, p.threads, [&](size_t k) {
    MicroBatchCostModel::Row own;
    for (size_t i = k * n / chunks; i < (k + 1) * n / chunks; ++i) {
      const uint32_t in = PaddedInput(p, p.order[i]);
      const uint32_t tg = PaddedTarget(p, p.order[i]);
      const MicroBatchCostModel::Row* row =
          cache.rows.empty() ? nullptr : cache.Find(in, p.policy.multiple);
      if (row == nullptr && p.cost->PrepareRow(in, tg, &own)) row = &own;
      known[i] = row != nullptr &&
                 p.cost->Evaluate(*row, 1, runs.labelled[i + 1] - runs.labelled[i],
                                  &runs.single[i]);
    }
  });
  runs.single_known.assign(known.begin(), known.end());
}

// A lower bound on sum t(M) over every partition (decoder-only; 0 where it
// cannot be shown). A run padded to L costs t(b, L) >= b * a(L), where a(L)
// is the least per-sample time of any batch at L. Between two grid sizes
// b_k < b_k+1 each device class's time A(b) is linear in b, so A(b) / b is
// monotone there and at least min(A(b_k) / b_k, A(b_k+1) / b_k+1); t is the
// largest class time, so t(b) / b is at least the largest of these over the
// classes. The head is at its least over labelled counts (kLeastHead): the
// least of functions linear in b, concave, so still above its chord between
// grid sizes, and no run's head costs less. Every sample of a run is at most
// the run's padded length, so a sample at l pays at least min over present
// L >= l of a(L).
double SumLowerBound(const DpProblem& p, const RowCache& cache) {
  const std::vector<uint32_t>* axis = p.cost->BatchAxis();
  if (p.policy.encoder_decoder || axis == nullptr || axis->empty() || cache.rows.empty()) return 0;
  std::vector<uint32_t> lengths;
  for (uint32_t position : p.order) lengths.push_back(PaddedInput(p, position));
  std::vector<uint32_t> distinct = lengths;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<double> least(distinct.size(), 0);
  ParallelFor(distinct.size(), p.threads, [&](size_t k) {
    const MicroBatchCostModel::Row* row = cache.Find(distinct[k], p.policy.multiple);
    if (row == nullptr) return;
    std::vector<std::array<double, 3>> per_sample;  // class time / b at each grid size
    MicroBatchCost cost;
    for (uint32_t b : *axis) {
      // The least head of any labelled count: a bound for every run.
      if (!p.cost->Evaluate(*row, b, MicroBatchCostModel::kLeastHead, &cost)) {
        break;  // beyond the grid: never a run
      }
      std::array<double, 3> share{};
      for (int c = 0; c < 3; ++c) share[c] = cost.class_time_ms[c] / b;
      per_sample.push_back(share);
    }
    if (per_sample.empty()) return;
    double a = std::numeric_limits<double>::infinity();
    for (size_t g = 0; g < per_sample.size(); ++g) {
      const std::array<double, 3>& next = per_sample[std::min(g + 1, per_sample.size() - 1)];
      double segment = 0;
      for (int c = 0; c < 3; ++c) segment = std::max(segment, std::min(per_sample[g][c], next[c]));
      a = std::min(a, segment);
    }
    least[k] = a;
  });
  for (size_t k = distinct.size() - 1; k-- > 0;) least[k] = std::min(least[k], least[k + 1]);
  double bound = 0;
  for (uint32_t length : lengths) {
    bound += least[std::lower_bound(distinct.begin(), distinct.end(), length) - distinct.begin()];
  }
  return bound;
}

// True when every sample fits a micro-batch of its own under the limit.
bool SinglesFit(const DpProblem& p, const RunTable& runs, const DpBudget& budget) {
  for (size_t i = 0; i < runs.single.size(); ++i) {
    if (!runs.single_known[i] ||
        BudgetStored(runs.single[i], budget.depth) > budget.stored_limit_bytes ||
        runs.single[i].peak_bytes > p.peak_limit_bytes) {
      return false;
    }
  }
  return true;
}

// Phase 1: costs of the runs starting at [begin, end) within the limits,
// appended to time/stored with width[i] per start. Per-range maxima of the
// lengths are kept as a run grows; runs stop growing at the first violation
// (costs grow with the run).
// The table's memory limits: a run is kept while it fits some budget.
struct TableLimits {
  bool depth = false;  // the budgets are pipeline-depth budgets
  double memory = -1;  // largest limit (depth budgets: limit * depth)
  double run_cap = kInf;
};

// The memory measure of the table's limits, and whether `cost` is within
// them.
bool WithinLimits(const DpProblem& p, const TableLimits& limits, const MicroBatchCost& cost,
                  double* held) {
  *held = limits.depth ? cost.depth_stored_bytes : cost.stored_bytes;
  return *held <= limits.memory && cost.peak_bytes <= p.peak_limit_bytes &&
         cost.time_ms <= limits.run_cap;
}

// Decoder-only runs cost t(b, L, n) for b samples padded to the longest, L,
// with n labelled tokens: the components of each padded length at b = 1,
// 2, ... are looked up once (MicroBatchCostModel::Batch), until the first
// b whose least head (kLeastHead, a bound for every n) breaks a limit
// (memory and time grow with b). A run then reprices only the head at its
// own n: far fewer grid lookups than runs when many samples share a padded
// length (large or documents-like batches).
struct RunCosts {
  std::vector<std::vector<MicroBatchCostModel::Batch>> batches;  // by cache row, then b - 1

  // Fills the batches of every row; `n` bounds b.
  void Build(const DpProblem& p, const RowCache& cache, const TableLimits& limits, size_t n) {
    batches.assign(cache.rows.size(), {});
    ParallelFor(cache.rows.size(), p.threads, [&](size_t k) {
      if (!cache.ok[k]) return;
      // Filled locally and moved in once: neighbouring rows' vector headers
      // share cache lines, and growing them in place from two threads makes
      // those lines bounce between cores.
      std::vector<MicroBatchCostModel::Batch> row;
      row.reserve(std::min<size_t>(n, 4096));
      MicroBatchCostModel::Batch batch;
      MicroBatchCost least;
      double held = 0;
      for (uint32_t b = 1; b <= n; ++b) {
        if (!p.cost->PrepareBatch(cache.rows[k], b, &batch) ||
            !p.cost->Evaluate(batch, MicroBatchCostModel::kLeastHead, &least) ||
            !WithinLimits(p, limits, least, &held)) {
          break;
        }
        row.push_back(batch);
      }
      batches[k] = std::move(row);
    });
  }
};

// The cache row of each position's own padded length. Rows are sorted by
// length, so a run's row is the largest of its positions' rows.
std::vector<int> RowsByPosition(const DpProblem& p, const RowCache& cache) {
  std::vector<int> rows(p.order.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    rows[j] = cache.slot[SlotOf(PaddedInput(p, p.order[j]), p.policy.multiple)];
  }
  return rows;
}

// Phase 1 with RunCosts: runs [i, j] while j - i + 1 is within the batches
// of the run's row and the run, at its labelled tokens, within the limits
// (the first violation ends them). Storage for the widest possible runs is
// reserved once.
void LookUpRunsFrom(const DpProblem& p, const TableLimits& limits, const std::vector<int>& row_at,
                    const RunCosts& costs, const std::vector<double>& labelled, size_t begin,
                    size_t end, std::vector<uint32_t>& width, std::vector<size_t>& offset,
                    std::vector<double>& time, std::vector<double>& memory) {
  const size_t n = row_at.size();
  size_t total = 0;
  for (size_t i = begin; i < end; ++i) {
    int row = -1;
    size_t j = i;
    for (; j < n; ++j) {
      row = std::max(row, row_at[j]);
      if (j - i + 1 > costs.batches[row].size()) break;
    }
    total += j - i;
  }
  time.reserve(total);
  memory.reserve(total);
  MicroBatchCost cost;
  double held = 0;
  for (size_t i = begin; i < end; ++i) {
    offset[i] = time.size();
    int row = -1;
    size_t j = i;
    for (; j < n; ++j) {
      row = std::max(row, row_at[j]);
      if (j - i + 1 > costs.batches[row].size() ||
          !p.cost->Evaluate(costs.batches[row][j - i], labelled[j + 1] - labelled[i], &cost) ||
          !WithinLimits(p, limits, cost, &held)) {
        break;
      }
      time.push_back(cost.time_ms);
      memory.push_back(held);
    }
    width[i] = static_cast<uint32_t>(j - i);
  }
}

void BuildRunsFrom(const DpProblem& p, const RowCache& cache, const TableLimits& limits,
                   const std::vector<double>& runs_labelled, size_t begin, size_t end,
                   std::vector<uint32_t>& width,
                   std::vector<size_t>& offset, std::vector<double>& time,
                   std::vector<double>& memory) {
  const size_t n = p.order.size();
  MicroBatchCostModel::Row own;
  for (size_t i = begin; i < end; ++i) {
    offset[i] = time.size();
    uint32_t input_len = 0;
    uint32_t target_len = 0;
    const MicroBatchCostModel::Row* row = nullptr;
    size_t j = i;
    MicroBatchCost cost;
    for (; j < n; ++j) {
      const uint32_t in = PaddedInput(p, p.order[j]);
      const uint32_t tg = PaddedTarget(p, p.order[j]);
      if (in > input_len || tg > target_len || row == nullptr) {
        input_len = std::max(input_len, in);
        target_len = std::max(target_len, tg);
        row = cache.rows.empty() ? nullptr : cache.Find(input_len, p.policy.multiple);
        if (row == nullptr && p.cost->PrepareRow(input_len, target_len, &own)) row = &own;
        if (row == nullptr) break;
      }
      double held = 0;
      if (!p.cost->Evaluate(*row, static_cast<uint32_t>(j - i + 1),
                            runs_labelled[j + 1] - runs_labelled[i], &cost) ||
          !WithinLimits(p, limits, cost, &held)) {
        break;
      }
      time.push_back(cost.time_ms);
      memory.push_back(held);
    }
    width[i] = static_cast<uint32_t>(j - i);
  }
}

// Phase 1 over every start, in chunks of starts on p.threads threads; each
// chunk keeps its own storage, so the table does not depend on the thread
// count and is never copied.
void BuildRuns(const DpProblem& p, const TableLimits& limits, const RowCache& cache,
               RunTable& runs) {
  const size_t n = p.order.size();
  runs.width.assign(n, 0);
  runs.depth_memory = limits.depth;
  const size_t chunks = p.threads > 1 ? std::min<size_t>(n, 8 * static_cast<size_t>(p.threads)) : 1;
  // Cleared, not freed: storage is reused from the last table (DpWorkspace).
  runs.time_chunks.resize(chunks);
  runs.memory_chunks.resize(chunks);
  for (size_t k = 0; k < chunks; ++k) {
    runs.time_chunks[k].clear();
    runs.memory_chunks[k].clear();
  }
  std::vector<size_t> offset(n, 0);
  // Decoder-only: every padded length has a row (PrepareRows).
  const bool lookup = !cache.rows.empty();
  RunCosts costs;
  if (lookup) costs.Build(p, cache, limits, n);
  const std::vector<int> row_at = lookup ? RowsByPosition(p, cache) : std::vector<int>();
  ParallelFor(chunks, p.threads, [&](size_t k) {
    // Each chunk grows a local vector (its storage taken over from the
    // table, so it is reused), never the table's own: neighbouring chunks'
    // vector headers share cache lines, which would bounce between cores.
    std::vector<double> time;
    std::vector<double> memory;
    time.swap(runs.time_chunks[k]);
    memory.swap(runs.memory_chunks[k]);
    // Room for a typical width up front: growing tables of millions of runs
    // by doubling copies them and faults in fresh pages each time.
    const size_t starts = (k + 1) * n / chunks - k * n / chunks;
    if (!lookup) {
      time.reserve(starts * std::min<size_t>(n, 128));
      memory.reserve(starts * std::min<size_t>(n, 128));
    }
    if (lookup) {
      LookUpRunsFrom(p, limits, row_at, costs, runs.labelled, k * n / chunks, (k + 1) * n / chunks,
                     runs.width, offset, time, memory);
    } else {
      BuildRunsFrom(p, cache, limits, runs.labelled, k * n / chunks, (k + 1) * n / chunks,
                    runs.width, offset, time, memory);
    }
    runs.time_chunks[k].swap(time);
    runs.memory_chunks[k].swap(memory);
  });
  runs.time_at.resize(n);
  runs.memory_at.resize(n);
  for (size_t k = 0; k < chunks; ++k) {
    for (size_t i = k * n / chunks; i < (k + 1) * n / chunks; ++i) {
      runs.time_at[i] = runs.time_chunks[k].data() + offset[i];
      runs.memory_at[i] = runs.memory_chunks[k].data() + offset[i];
    }
  }
}

// "sample ID (position I of the mini-batch)", or "sample I" without ids.
std::string SampleName(const DpProblem& p, uint32_t position) {
  if (position < p.sample_ids.size()) {
    return absl::StrFormat("sample %d (position %d of the mini-batch)", p.sample_ids[position],
                           position);
  }
  return absl::StrFormat("sample %d", position);
}

absl::Status DoesNotFit(const DpProblem& p, const RunTable& runs, size_t i, double stored_limit,
                        uint32_t depth) {
  const SampleLengths& s = p.samples[p.order[i]];
  if (!runs.single_known[i]) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s (input %d, target %d tokens) lies beyond the cost model's grid (recompute %s)",
        SampleName(p, p.order[i]), s.input, s.target, RecomputeName(p.cost->recompute())));
  }
  const MicroBatchCost& alone = runs.single[i];
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s (input %d, target %d tokens) does not fit a micro-batch on its own with "
      "recompute %s: it needs %.1f MiB stored / %.1f MiB peak activation, the limits are "
      "%.1f / %.1f MiB",
      SampleName(p, p.order[i]), s.input, s.target, RecomputeName(p.cost->recompute()),
      BudgetStored(alone, depth) / (1 << 20), alone.peak_bytes / (1 << 20),
      stored_limit / (1 << 20), p.peak_limit_bytes / (1 << 20)));
}

// Phase 2 prerequisites for one limit: each start's usable width (the first
// run over the limit ends them: memory grows with the run; a scan rather
// than a binary search stays safe on noisy profiles), the largest single
// time (every partition holds each sample in a run at least as slow as the
// sample alone) and whether some sample alone exceeds the run cap.
struct BudgetRuns {
  std::vector<uint32_t> width;
  double tmax_floor = 0;
  bool too_slow = false;
};

absl::StatusOr<BudgetRuns> UsableRuns(const DpProblem& p, const RunTable& runs, double stored_limit,
                                      uint32_t depth, double run_cap) {
  const size_t n = p.order.size();
  BudgetRuns out;
  out.width.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const MicroBatchCost& alone = runs.single[i];
    if (!runs.single_known[i] || BudgetStored(alone, depth) > stored_limit ||
        alone.peak_bytes > p.peak_limit_bytes) {
      return DoesNotFit(p, runs, i, stored_limit, depth);
    }
    out.tmax_floor = std::max(out.tmax_floor, alone.time_ms);
    out.too_slow |= alone.time_ms > run_cap;
  }
  // The table holds the budget's own memory measure (BuildTable).
  const double limit = depth > 1 ? stored_limit * depth : stored_limit;
  const size_t chunks = p.threads > 1 ? std::min<size_t>(n, 8 * static_cast<size_t>(p.threads)) : 1;
  ParallelFor(chunks, p.threads, [&](size_t k) {
    for (size_t i = k * n / chunks; i < (k + 1) * n / chunks; ++i) {
      const double* stored = runs.memory_at[i];
      uint32_t w = 0;
      while (w < runs.width[i] && stored[w] <= limit) ++w;
      out.width[i] = w;
    }
  });
  return out;
}

// Phase 2: tmax candidates from the usable run times from the floor up.
// Exact (interval 0): every distinct time. With an interval w the times are
// binned into [floor + k w, floor + (k + 1) w) and each bin's largest time
// stands for the bin's (all within (candidate - w, candidate]): linear in
// the runs, where a run's time depends on its samples' labelled tokens and
// nearly every run's time is distinct. Too many bins for the runs: the
// sorted times, each candidate the largest within w of the first it stands
// for.
std::vector<double> TmaxCandidates(const DpProblem& p, const RunTable& runs,
                                   const BudgetRuns& usable) {
  std::vector<double> values;
  double largest = usable.tmax_floor;
  for (size_t i = 0; i < usable.width.size(); ++i) {
    const double* t = runs.time_at[i];
    for (uint32_t k = 0; k < usable.width[i]; ++k) {
      if (t[k] >= usable.tmax_floor) {
        values.push_back(t[k]);
        largest = std::max(largest, t[k]);
      }
    }
  }
  const double w = p.tmax_interval_ms;
  const double bins = w > 0 ? std::floor((largest - usable.tmax_floor) / w) + 1 : kInf;
  std::vector<double> candidates;
  if (bins <= 4.0 * static_cast<double>(values.size()) + 1024) {
    std::vector<double> most(static_cast<size_t>(bins), -1);
    for (double v : values) {
      const size_t k = std::min(static_cast<size_t>((v - usable.tmax_floor) / w), most.size() - 1);
      most[k] = std::max(most[k], v);
    }
    for (double v : most) {
      if (v >= 0) candidates.push_back(v);
    }
    return candidates;
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  for (size_t k = 0; k < values.size();) {
    size_t last = k;
    while (last + 1 < values.size() && values[last + 1] <= values[k] + w) ++last;
    candidates.push_back(values[last]);
    k = last + 1;
  }
  return candidates;
}

// The best partition of phase 3: its objective, times and cut points.
struct BestPartition {
  double objective = kInf;
  double max_time = 0;
  double sum_time = 0;
  std::vector<uint32_t> prev;  // empty: none beat the cutoff
};
// One tmax candidate's DP: f(N; tmax), the largest run time of its
// partition (<= tmax) and the partition's cut points.
struct CandidateRun {
  double sum = kInf;
  double actual_max = 0;
  std::vector<uint32_t> prev;
};

void SolveCandidate(const RunTable& runs, const BudgetRuns& usable, double tmax,
                    std::vector<double>& f, CandidateRun& out) {
  const size_t n = usable.width.size();
  out.prev.assign(n + 1, 0);
  out.sum = RunDp(runs, usable.width, tmax, f, out.prev);
  out.actual_max = 0;
  if (out.sum == kInf) return;
  for (size_t end = n; end > 0; end = out.prev[end]) {
    out.actual_max = std::max(out.actual_max, runs.time_at[out.prev[end]][end - out.prev[end] - 1]);
  }
}

// The candidates of phase 3, solved on demand. With threads, each miss also
// solves the candidate the search most likely needs next (`ahead`) on a
// second thread: the search itself, and so its result, is the same for any
// thread count; only its DP runs overlap.
class CandidateSolver {
 public:
  // `candidates` may be filled after construction, before any Take.
  CandidateSolver(const DpProblem& p, const RunTable& runs, const BudgetRuns& usable,
                  const std::vector<double>& candidates)
      : p_(p), runs_(runs), usable_(usable), candidates_(candidates) {
    for (std::vector<double>& f : f_) f.resize(usable.width.size() + 1);
  }

  // f(N; infinity); `ahead` (or none) may be solved with it.
  double Unconstrained(std::optional<size_t> ahead) {
    CandidateRun run;
    Solve(kInf, ahead, run);
    return run.sum;
  }

  // Candidate k's run; `ahead` (or none) may be solved with it.
  CandidateRun Take(size_t k, std::optional<size_t> ahead) {
    if (auto it = solved_.find(k); it != solved_.end()) {
      CandidateRun run = std::move(it->second);
      solved_.erase(it);
      return run;
    }
    CandidateRun run;
    Solve(candidates_[k], ahead == k ? std::nullopt : ahead, run);
    return run;
  }

 private:
  // The DP at tmax into `run`; with threads, candidate `ahead` beside it.
  void Solve(double tmax, std::optional<size_t> ahead, CandidateRun& run) {
    if (p_.threads < 2 || !ahead.has_value() || solved_.contains(*ahead)) {
      SolveCandidate(runs_, usable_, tmax, f_[0], run);
      return;
    }
    CandidateRun next;
    ParallelFor(2, 2, [&](size_t t) {
      if (t == 0) {
        SolveCandidate(runs_, usable_, tmax, f_[0], run);
      } else {
        SolveCandidate(runs_, usable_, candidates_[*ahead], f_[1], next);
      }
    });
    solved_.emplace(*ahead, std::move(next));
  }

  const DpProblem& p_;
  const RunTable& runs_;
  const BudgetRuns& usable_;
  const std::vector<double>& candidates_;
  std::array<std::vector<double>, 2> f_;
  std::map<size_t, CandidateRun> solved_;
};

// An interval of tmax candidates; f(N; tmax) for every tmax of it is at
// least sum_bound.
struct Interval {
  size_t first;
  size_t last;
  double sum_bound;
};

size_t Middle(const Interval& in, bool bisect) {
  return bisect ? in.first + (in.last - in.first) / 2 : in.first;
}

// The candidate phase 3 solves after `middle` of `in` when the lower half
// (or else the upper half, or else the interval on top of the stack) is not
// skipped: the usual path of the search.
std::optional<size_t> LikelyNext(const Interval& in, size_t middle,
                                 const std::vector<Interval>& stack, bool bisect) {
  if (middle > in.first) return Middle({in.first, middle - 1, 0}, bisect);
  if (middle < in.last) return Middle({middle + 1, in.last, 0}, bisect);
  if (!stack.empty()) return Middle(stack.back(), bisect);
  return std::nullopt;
}

// Phase 3: branch and bound over the candidates. f(N; tmax) never grows
// with tmax, so every candidate k in [a, b] has an objective of at least
// (c - 1) * tmax_a / v + f(N; tmax_b+1) / |D| (f(N; infinity) past the last
// candidate); an interval whose bound cannot beat the best is skipped, and
// otherwise its middle candidate is solved and both halves are searched,
// the lower one first. With exact candidates (interval 0) the optimum's
// own candidate is never skipped, so the result is optimal; with buckets it
// is within (c - 1) * interval / v, as before. Ties go to the smaller tmax.
BestPartition SearchCandidates(const DpProblem& p, CandidateSolver& solver,
                               std::span<const double> candidates, double unconstrained,
                               double cutoff, int* evaluated) {
  BestPartition best;
  best.objective = cutoff;
  size_t best_index = candidates.size();
  std::vector<Interval> stack;
  if (!candidates.empty()) stack.push_back({0, candidates.size() - 1, unconstrained});
  while (!stack.empty()) {
    const Interval in = stack.back();
    stack.pop_back();
    const double bound = PipelineObjective(candidates[in.first], in.sum_bound, p.pipeline_stages,
                                           p.virtual_chunks, p.data_parallel);
    if (p.bound_search &&
        (bound > best.objective || (bound == best.objective &&
                                    (best_index == candidates.size() || in.first >= best_index)))) {
      continue;
    }
    const size_t middle = Middle(in, p.bound_search);
    ++*evaluated;
    CandidateRun run = solver.Take(middle, LikelyNext(in, middle, stack, p.bound_search));
    if (run.sum != kInf) {
      // The objective uses the solution's actual largest time (<= tmax).
      const double objective = PipelineObjective(run.actual_max, run.sum, p.pipeline_stages,
                                                 p.virtual_chunks, p.data_parallel);
      // Strictly better than the cutoff; among equals, the smaller tmax.
      const bool found = best_index < candidates.size();
      if (objective < best.objective ||
          (found && objective == best.objective && middle < best_index)) {
        best = {objective, run.actual_max, run.sum, std::move(run.prev)};
        best_index = middle;
      }
    }
    if (middle < in.last) stack.push_back({middle + 1, in.last, in.sum_bound});
    if (middle > in.first && run.sum != kInf) stack.push_back({in.first, middle - 1, run.sum});
  }
  return best;
}

// Phase 4: the runs of the best partition, front to back, with their costs.
void BuildSolution(const DpProblem& p, const RunTable& runs, const BestPartition& best,
                   DpSolution& solution) {
  std::vector<std::pair<uint32_t, uint32_t>> cuts;
  for (size_t end = p.order.size(); end > 0; end = best.prev[end]) {
    cuts.emplace_back(best.prev[end], static_cast<uint32_t>(end));
  }
  std::reverse(cuts.begin(), cuts.end());
  for (const auto& [begin, end] : cuts) {
    MicroBatchGroup group;
    group.samples.assign(p.order.begin() + begin, p.order.begin() + end);
    PadToLongest(p.samples, p.policy, group);
    MicroBatchCost cost;
    p.cost->Evaluate(static_cast<uint32_t>(group.size()), group.input_len, group.target_len,
                     nullptr, runs.labelled[end] - runs.labelled[begin], &cost);
    solution.groups.push_back(std::move(group));
    solution.costs.push_back(cost);
  }
  solution.objective_ms = best.objective;
  solution.max_time_ms = best.max_time;
  solution.sum_time_ms = best.sum_time;
}

// Phases 2-4 for one stored limit over a built table.
absl::StatusOr<DpSolution> SolveBudget(const DpProblem& p, const RunTable& runs,
                                       double stored_limit, uint32_t depth, double cutoff,
                                       double run_cap) {
  absl::StatusOr<BudgetRuns> usable = UsableRuns(p, runs, stored_limit, depth, run_cap);
  if (!usable.ok()) return usable.status();
  DpSolution solution;
  const auto pruned = [&](double lower_bound) {
    solution.pruned = true;
    solution.lower_bound_ms = std::min(cutoff, lower_bound);
    return solution;
  };
  if (usable->too_slow) return pruned(cutoff);
  // With threads the candidates come first, so that the first one the
  // search solves runs beside the unconstrained DP; otherwise they are
  // collected only when the floor does not prune.
  const bool ahead = p.threads > 1 && p.bound_search;
  std::vector<double> candidates;
  if (ahead) candidates = TmaxCandidates(p, runs, *usable);
  CandidateSolver solver(p, runs, *usable, candidates);
  std::optional<size_t> first;
  if (ahead && !candidates.empty()) first = Middle({0, candidates.size() - 1, 0}, true);
  const double unconstrained = solver.Unconstrained(first);
  const double floor_bound = PipelineObjective(usable->tmax_floor, unconstrained, p.pipeline_stages,
                                               p.virtual_chunks, p.data_parallel);
  if (p.bound_search && floor_bound >= cutoff) return pruned(floor_bound);
  if (!ahead) candidates = TmaxCandidates(p, runs, *usable);
  solution.tmax_candidates = static_cast<int>(candidates.size());
  const BestPartition best =
      SearchCandidates(p, solver, candidates, unconstrained, cutoff, &solution.tmax_evaluated);
  if (best.prev.empty()) {
    if (cutoff == kInf) {
      return absl::InternalError("micro-batch DP found no partition although every sample fits");
    }
    return pruned(floor_bound);
  }
  BuildSolution(p, runs, best, solution);
  return solution;
}

}  // namespace

double PipelineObjective(double max_time_ms, double sum_time_ms, uint32_t pipeline_stages,
                         uint32_t virtual_chunks, uint32_t data_parallel) {
  return (pipeline_stages - 1.0) * max_time_ms / std::max<uint32_t>(1, virtual_chunks) +
         sum_time_ms / std::max<uint32_t>(1, data_parallel);
}

namespace {

// Whether every device class can hold its depth of the solution's largest
// stored activations plus its largest transient; when not, the transient to
// reserve (the largest of a class that does not fit).
double TransientToReserve(const DpProblem& p, const DpSolution& solution) {
  const std::array<double, 3>& depth = p.cost->ClassDepths();
  std::array<double, 3> stored{};
  std::array<double, 3> transient{};
  for (const MicroBatchCost& c : solution.costs) {
    for (int k = 0; k < 3; ++k) {
      stored[k] = std::max(stored[k], c.class_stored_bytes[k]);
      transient[k] = std::max(transient[k], c.class_transient_bytes[k]);
    }
  }
  double reserve = 0;
  for (int k = 0; k < 3; ++k) {
    if (depth[k] * stored[k] + transient[k] > p.peak_limit_bytes) {
      reserve = std::max(reserve, transient[k]);
    }
  }
  return reserve;
}

// Whether a solution fits a depth budget: what each device holds at once
// within the limit, and room left for each class's transient.
bool FitsDepth(const DpProblem& p, const DpBudget& budget, const DpSolution& solution) {
  for (const MicroBatchCost& c : solution.costs) {
    if (c.depth_stored_bytes > budget.stored_limit_bytes * budget.depth ||
        c.peak_bytes > p.peak_limit_bytes) {
      return false;
    }
  }
  return TransientToReserve(p, solution) == 0;
}

// SolveBudget under a budget with depth: while some device class cannot hold
// its depth of the largest stored activations plus its largest transient,
// the limit on what a device holds at once drops to peak - that transient
// (at most 8 rounds; the simulator's check catches anything left).
absl::StatusOr<DpSolution> SolveDepthBudget(const DpProblem& p, const RunTable& runs,
                                            const DpBudget& budget, double cutoff, double run_cap) {
  double limit = budget.stored_limit_bytes;
  for (int round = 0;; ++round) {
    absl::StatusOr<DpSolution> solution =
        SolveBudget(p, runs, limit, budget.depth, cutoff, run_cap);
    if (solution.ok()) solution->stored_limit_bytes = limit;
    if (!solution.ok() || solution->pruned || budget.depth <= 1 || round == 8) return solution;
    const double reserve = TransientToReserve(p, *solution);
    const double tighter = (p.peak_limit_bytes - reserve) / budget.depth;
    if (reserve == 0 || !(tighter < limit)) return solution;
    limit = tighter;
  }
}

// The objective of the DP at tmax = the slowest sample alone, over a table
// of only the runs that fast (cheap): a feasible partition of a whole-device
// budget, so an upper bound of its optimum. Infinite when none is found.
double QuickObjective(const DpProblem& p, const DpBudget& budget, const RunTable& probe,
                      double max_single) {
  absl::StatusOr<BudgetRuns> usable =
      UsableRuns(p, probe, budget.stored_limit_bytes, budget.depth, kInf);
  if (!usable.ok()) return kInf;
  std::vector<double> f(p.order.size() + 1);
  std::vector<uint32_t> prev(p.order.size() + 1, 0);
  const double sum = RunDp(probe, usable->width, max_single, f, prev);
  if (sum == kInf) return kInf;
  double actual_max = 0;
  for (size_t end = p.order.size(); end > 0; end = prev[end]) {
    actual_max = std::max(actual_max, probe.time_at[prev[end]][end - prev[end] - 1]);
  }
  return PipelineObjective(actual_max, sum, p.pipeline_stages, p.virtual_chunks, p.data_parallel);
}

// The slowest run worth building for any feasible budget (every sample fits
// alone in at least one). A run slower than cap puts a partition's
// objective above (c - 1) * cap / v + (lower bound of sum t) / |D|; cap
// makes that the largest over budgets of the best known upper bound of the
// budget's optimum: its cutoff, the all-singles objective, and on large
// batches for whole-device budgets (whose limit never tightens) the DP at
// the slowest single time over a small table. The bound and the small table
// cost one row per distinct length and a table of short runs: worth it on
// large batches only.
double TableRunCap(const DpProblem& p, std::span<const DpBudget> budgets, const RowCache& cache,
                   const RunTable& runs, const TableLimits& limits) {
  if (p.pipeline_stages <= 1 || !p.bound_search) return kInf;
  double max_single = 0;
  double sum_single = 0;
  for (const MicroBatchCost& c : runs.single) {
    max_single = std::max(max_single, c.time_ms);
    sum_single += c.time_ms;
  }
  const double singles = PipelineObjective(max_single, sum_single, p.pipeline_stages,
                                           p.virtual_chunks, p.data_parallel);
  const bool large = p.order.size() > 1024;
  const bool quick = large && !limits.depth;
  RunTable probe;
  if (quick) {
    if (p.workspace != nullptr) {
      probe.time_chunks = std::move(p.workspace->probe_time_chunks);
      probe.memory_chunks = std::move(p.workspace->probe_memory_chunks);
    }
    probe.single = runs.single;
    probe.labelled = runs.labelled;
    probe.single_known = runs.single_known;
    TableLimits small = limits;
    small.run_cap = max_single;
    BuildRuns(p, small, cache, probe);
  }
  double upper = 0;
  const auto upper_bound = [&](const DpProblem& q) {
    for (const DpBudget& b : budgets) {
      if (!SinglesFit(q, runs, b)) continue;
      double bound = std::min(singles, b.cutoff != nullptr ? *b.cutoff : kInf);
      if (quick) bound = std::min(bound, QuickObjective(q, b, probe, max_single));
      upper = std::max(upper, bound);
    }
  };
  double lower_sum = 0;
  if (large && p.threads > 1) {  // the quick DPs beside the lower bound
    DpProblem one = p;
    one.threads = 1;
    ParallelFor(2, 2, [&](size_t task) {
      if (task == 0) {
        upper_bound(one);
      } else {
        lower_sum = SumLowerBound(one, cache);
      }
    });
  } else {
    upper_bound(p);
    if (large) lower_sum = SumLowerBound(p, cache);
  }
  if (quick && p.workspace != nullptr) {
    p.workspace->probe_time_chunks = std::move(probe.time_chunks);
    p.workspace->probe_memory_chunks = std::move(probe.memory_chunks);
  }
  return (upper - lower_sum / p.data_parallel) * p.virtual_chunks / (p.pipeline_stages - 1);
}

double CutoffOf(const DpBudget& b) { return b.cutoff != nullptr ? *b.cutoff : kInf; }

// A run slower than this cannot be part of a partition that beats the
// cutoff: (c - 1) * max t / v alone would reach it.
double RunCapFor(const DpProblem& p, double cutoff) {
  return p.pipeline_stages > 1 && p.bound_search
             ? cutoff * p.virtual_chunks / (p.pipeline_stages - 1)
             : kInf;
}

// Phase 1 for every budget where each sample fits alone (the others need no
// runs: they report the sample that does not fit). The runs kept fit some
// budget and are no slower than TableRunCap, so run widths do not grow with
// the mini-batch (planning cost linear in the data-parallel width).
void BuildTable(const DpProblem& p, std::span<const DpBudget> budgets, const RowCache& cache,
                RunTable& runs) {
  TableLimits limits;
  double loosest = 0;  // runs up to the loosest cutoff's cap serve every budget
  bool any_feasible = false;
  for (const DpBudget& b : budgets) {
    if (!SinglesFit(p, runs, b)) continue;
    limits.depth = b.depth > 1;  // REQUIRES: all budgets of one kind (SolveAll)
    limits.memory = std::max(limits.memory, b.stored_limit_bytes * std::max(1u, b.depth));
    loosest = std::max(loosest, CutoffOf(b));
    any_feasible = true;
  }
  if (!any_feasible) {
    runs.width.assign(p.order.size(), 0);
    runs.time_at.assign(p.order.size(), nullptr);
    runs.memory_at.assign(p.order.size(), nullptr);
    return;
  }
  limits.run_cap = std::min(RunCapFor(p, loosest), TableRunCap(p, budgets, cache, runs, limits));
  BuildRuns(p, limits, cache, runs);
}

// Phases 1-4 per budget, whole-device budgets first, on a table built for
// them alone: where a whole-device optimum also fits a pipeline-depth
// budget of the same mode (full recomputation: small activations), it is
// that budget's optimum too (the depth budget admits a subset of the
// partitions) and the depth budget needs neither a table nor a DP. The
// other depth budgets get a table of their own. Results in input order;
// cutoffs lowered by every solution.
std::vector<absl::StatusOr<DpSolution>> SolveAll(const DpProblem& p,
                                                 std::span<const DpBudget> budgets,
                                                 const RowCache& cache, RunTable& runs) {
  std::vector<absl::StatusOr<DpSolution>> solved(budgets.size(), absl::UnknownError("not solved"));
  const auto solve = [&](size_t k) {
    const double cutoff = CutoffOf(budgets[k]);
    solved[k] = SolveDepthBudget(p, runs, budgets[k], cutoff, RunCapFor(p, cutoff));
    if (solved[k].ok() && !solved[k]->pruned && budgets[k].cutoff != nullptr) {
      *budgets[k].cutoff = std::min(*budgets[k].cutoff, solved[k]->objective_ms);
    }
  };
  std::vector<DpBudget> whole_budgets;
  for (const DpBudget& b : budgets) {
    if (b.depth <= 1) whole_budgets.push_back(b);
  }
  const DpSolution* whole = nullptr;
  if (!whole_budgets.empty()) {
    BuildTable(p, whole_budgets, cache, runs);
    for (size_t k = 0; k < budgets.size(); ++k) {
      if (budgets[k].depth > 1) continue;
      solve(k);
      if (solved[k].ok() && !solved[k]->pruned) whole = &*solved[k];
    }
  }
  std::vector<size_t> rest;
  std::vector<DpBudget> rest_budgets;
  for (size_t k = 0; k < budgets.size(); ++k) {
    const DpBudget& budget = budgets[k];
    if (budget.depth <= 1) continue;
    if (whole != nullptr && whole->objective_ms < CutoffOf(budget) &&
        FitsDepth(p, budget, *whole)) {
      solved[k] = *whole;
      solved[k]->stored_limit_bytes = budget.stored_limit_bytes;
      if (budget.cutoff != nullptr) *budget.cutoff = std::min(*budget.cutoff, whole->objective_ms);
      continue;
    }
    rest.push_back(k);
    rest_budgets.push_back(budget);
  }
  if (rest.empty()) return solved;
  BuildTable(p, rest_budgets, cache, runs);
  for (size_t k : rest) solve(k);
  return solved;
}

}  // namespace

std::vector<absl::StatusOr<DpSolution>> SolveMicroBatchDpBudgets(
    const DpProblem& p, std::span<const double> stored_limits, double* cutoff) {
  std::vector<DpBudget> budgets;
  for (double limit : stored_limits) {
    budgets.push_back({.stored_limit_bytes = limit, .cutoff = cutoff});
  }
  return SolveMicroBatchDpBudgets(p, budgets);
}

namespace {

// InvalidArgument naming the first sample of the order over the policy's
// limits: its padded lengths could not hold it.
absl::Status CheckWithinLimits(const DpProblem& p) {
  for (uint32_t position : p.order) {
    const SampleLengths& s = p.samples[position];
    const uint32_t input = SequenceLength(s, p.policy);
    const bool long_input = p.policy.max_input > 0 && input > p.policy.max_input;
    const bool long_target =
        p.policy.encoder_decoder && p.policy.max_target > 0 && s.target > p.policy.max_target;
    if (long_input || long_target) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "micro-batch DP: sample at position %d (%d input, %d target tokens) exceeds the "
          "length limits (%d input, %d target)",
          position, input, s.target, p.policy.max_input, p.policy.max_target));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<absl::StatusOr<DpSolution>> SolveMicroBatchDpBudgets(
    const DpProblem& p, std::span<const DpBudget> budgets) {
  std::vector<absl::StatusOr<DpSolution>> results;
  absl::Status invalid;
  if (p.cost == nullptr) {
    invalid = absl::InvalidArgumentError("micro-batch DP: no cost model");
  } else if (p.order.empty()) {
    invalid = absl::InvalidArgumentError("micro-batch DP: empty mini-batch");
  } else if (p.pipeline_stages == 0 || p.data_parallel == 0 || p.virtual_chunks == 0 ||
             p.policy.multiple == 0 || !(p.tmax_interval_ms >= 0)) {
    invalid = absl::InvalidArgumentError("micro-batch DP: invalid parameters");
  } else {
    invalid = CheckWithinLimits(p);
  }
  if (!invalid.ok()) {
    results.assign(budgets.size(), invalid);
    return results;
  }
  RowCache cache;
  PrepareRows(p, cache);
  RunTable runs;
  DpWorkspace* const ws = p.workspace;
  if (ws != nullptr) {
    runs.time_chunks = std::move(ws->time_chunks);
    runs.memory_chunks = std::move(ws->memory_chunks);
  }
  runs.labelled = LabelledPrefix(p);
  CostSingles(p, cache, runs);
  std::vector<absl::StatusOr<DpSolution>> solved = SolveAll(p, budgets, cache, runs);
  if (ws != nullptr) {
    ws->time_chunks = std::move(runs.time_chunks);
    ws->memory_chunks = std::move(runs.memory_chunks);
  }
  return solved;
}

absl::StatusOr<DpSolution> SolveMicroBatchDp(const DpProblem& p) {
  double cutoff = p.objective_cutoff_ms;
  const double limit = p.stored_limit_bytes;
  return std::move(SolveMicroBatchDpBudgets(p, std::span<const double>(&limit, 1), &cutoff)[0]);
}

}  // namespace varipipe::planner
