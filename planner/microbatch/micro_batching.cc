#include "planner/microbatch/micro_batching.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/microbatch/baselines.h"
#include "planner/microbatch/dp_partition.h"
#include "planner/parallel.h"

namespace varipipe::planner {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double MiB(double bytes) { return bytes / (1 << 20); }

// "sample ID (position I of the mini-batch)", or "sample at position I".
std::string SampleName(const MicroBatchingOptions& o, uint32_t i) {
  if (i < o.sample_ids.size()) {
    return absl::StrFormat("sample %d (position %d of the mini-batch)", o.sample_ids[i], i);
  }
  return absl::StrFormat("sample at position %d", i);
}

// Checks lengths against the maxima; truncates or fails.
absl::Status CheckAndTruncate(const MicroBatchingOptions& o, std::vector<SampleLengths>& samples,
                              std::vector<uint32_t>& truncated) {
  if (samples.empty()) return absl::InvalidArgumentError("the mini-batch has no samples");
  const bool t5 = o.dims.encoder_decoder();
  for (uint32_t i = 0; i < samples.size(); ++i) {
    SampleLengths& s = samples[i];
    if (t5 ? (s.input == 0 || s.target == 0) : s.input + s.target == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has zero length (input %d, target %d tokens)%s", SampleName(o, i), s.input, s.target,
          t5 ? "; encoder-decoder samples need input and target tokens" : ""));
    }
    const bool too_long = t5 ? (s.input > o.max_input_len || s.target > o.max_target_len)
                             : s.input + s.target > o.max_input_len;
    if (!too_long) continue;
    if (!o.truncate) {
      return absl::InvalidArgumentError(
          t5 ? absl::StrFormat("%s (input %d, target %d tokens) exceeds the maximum "
                               "lengths (input %d, target %d); set planner.truncate_long_samples "
                               "to truncate such samples",
                               SampleName(o, i), s.input, s.target, o.max_input_len,
                               o.max_target_len)
             : absl::StrFormat("%s (%d tokens: input %d + target %d) exceeds the maximum "
                               "sequence length %d; set planner.truncate_long_samples to "
                               "truncate such samples",
                               SampleName(o, i), s.input + s.target, s.input, s.target,
                               o.max_input_len));
    }
    if (t5) {
      s.input = std::min(s.input, o.max_input_len);
      s.target = std::min(s.target, o.max_target_len);
    } else {
      s.target = std::min(s.target, o.max_input_len);
      s.input = std::min(s.input, o.max_input_len - s.target);
    }
    truncated.push_back(i);
  }
  return absl::OkStatus();
}

// Shortens samples that do not fit a micro-batch of their own under the most
// permissive pair: the last allowed recompute mode with the whole device, or,
// when no schedule takes the whole-device budget, with the pipeline-depth
// budget: every device class holds its depth of the sample's stored
// activations plus its transient (what the DP's depth budgets require,
// SolveDepthBudget).
absl::Status TruncateForMemory(const MicroBatchCostModel& cost, const MicroBatchingOptions& o,
                               const LengthPolicy& policy, double limit,
                               std::vector<SampleLengths>& samples,
                               std::vector<uint32_t>& truncated) {
  const bool whole_device =
      std::find(o.budgets.begin(), o.budgets.end(), MemoryBudget::kWholeDevice) != o.budgets.end();
  const auto fits_depth = [&](const MicroBatchCost& c) {
    const std::array<double, 3>& depth = cost.ClassDepths();
    for (size_t k = 0; k < depth.size(); ++k) {
      if (depth[k] * c.class_stored_bytes[k] + c.class_transient_bytes[k] > limit) return false;
    }
    return c.depth_stored_bytes <= limit;
  };
  const auto fits = [&](const SampleLengths& s) {
    MicroBatchCost c;
    return cost.Evaluate(1, PaddedInputLength(SequenceLength(s, policy), policy),
                         PaddedTargetLength(s.target, policy), nullptr,
                         static_cast<double>(LossTokens(s, policy.encoder_decoder)), &c) &&
           c.peak_bytes <= limit && (whole_device ? c.stored_bytes <= limit : fits_depth(c));
  };
  for (uint32_t i = 0; i < samples.size(); ++i) {
    SampleLengths& s = samples[i];
    if (fits(s)) continue;
    // Shorten the input first (keeping at least one token), then the target.
    uint32_t lo = 1;
    uint32_t hi = s.input;
    SampleLengths probe = s;
    probe.input = 1;
    if (fits(probe)) {
      while (lo < hi) {  // largest input that fits
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        probe.input = mid;
        if (fits(probe))
          lo = mid;
        else
          hi = mid - 1;
      }
      s.input = lo;
    } else {
      s.input = 1;
      lo = 1;
      hi = s.target;
      probe = s;
      probe.target = 1;
      if (!fits(probe)) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "%s does not fit memory even truncated to one token (recompute %s, %.1f MiB "
            "for activations)",
            SampleName(o, i), RecomputeName(cost.recompute()), MiB(limit)));
      }
      while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        probe.target = mid;
        if (fits(probe))
          lo = mid;
        else
          hi = mid - 1;
      }
      s.target = lo;
    }
    if (truncated.empty() || truncated.back() != i) truncated.push_back(i);
  }
  std::sort(truncated.begin(), truncated.end());
  truncated.erase(std::unique(truncated.begin(), truncated.end()), truncated.end());
  return absl::OkStatus();
}

// Padded lengths capped at the options' maxima (the job's data limits).
LengthPolicy PolicyOf(const MicroBatchingOptions& o) {
  const bool t5 = o.dims.encoder_decoder();
  return {.encoder_decoder = t5,
          .multiple = o.length_multiple,
          .max_input = o.max_input_len,
          .max_target = t5 ? o.max_target_len : 0};
}

// The cost of every group of a baseline partition under one recompute
// mode, each distinct shape (size, padded lengths, labelled tokens)
// evaluated once (a partition into single samples repeats shapes); an
// error names the first group beyond the model. The head is priced at the
// group's labelled tokens (LabelledTokens).
// Packed rows under per-sample attention depend on their samples, not only
// their shape: each is evaluated on its own.
absl::StatusOr<std::vector<MicroBatchCost>> CostGroups(const MicroBatchCostModel& cost,
                                                       const std::vector<MicroBatchGroup>& groups,
                                                       std::span<const SampleLengths> samples,
                                                       const MicroBatchingOptions& o) {
  absl::flat_hash_map<std::tuple<uint64_t, uint32_t, uint32_t, uint64_t>, MicroBatchCost> by_shape;
  std::vector<MicroBatchCost> costs;
  costs.reserve(groups.size());
  const bool per_sample = o.packed_attention != PackedAttentionPricing::kBlockDiagonalMask &&
                          cost.prices_per_sample_attention();
  for (size_t g = 0; g < groups.size(); ++g) {
    const MicroBatchGroup& group = groups[g];
    const std::optional<PackedSamples> packed =
        per_sample ? PackedSamplesOf(group, samples, PolicyOf(o), o.packed_attention)
                   : std::nullopt;
    const uint64_t labelled = LabelledTokens(group, samples, o.dims.encoder_decoder());
    MicroBatchCost own;
    MicroBatchCost* slot = &own;
    bool evaluate = true;
    if (!packed) {
      auto [it, added] = by_shape.try_emplace(
          std::make_tuple(group.size(), group.input_len, group.target_len, labelled));
      slot = &it->second;
      evaluate = added;
    }
    if (evaluate &&
        !cost.Evaluate(static_cast<uint32_t>(group.size()), group.input_len, group.target_len,
                       packed ? &*packed : nullptr, static_cast<double>(labelled), slot)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "micro-batch %d (%d x %d%s tokens) lies beyond the cost model's grid", g, group.size(),
          group.input_len, group.target_len ? absl::StrCat("+", group.target_len) : ""));
    }
    costs.push_back(*slot);
  }
  return costs;
}

// A baseline partition under one (mode, budget) pair: its groups if every
// one fits the pair's limits (a pair that does not fit keeps none).
void EvaluateGroups(const MicroBatchingOptions& o, const std::vector<MicroBatchGroup>& groups,
                    const absl::StatusOr<std::vector<MicroBatchCost>>& costs,
                    MicroBatchingCandidate& c) {
  if (!costs.ok()) {
    c.status = costs.status();
    return;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const MicroBatchCost& mc = (*costs)[g];
    if (mc.stored_bytes > c.stored_limit_bytes || mc.peak_bytes > c.peak_limit_bytes) {
      const MicroBatchGroup& group = groups[g];
      c.status = absl::ResourceExhaustedError(absl::StrFormat(
          "micro-batch %d (%d rows x %d%s tokens) needs %.1f MiB stored / %.1f MiB peak, limits "
          "%.1f / %.1f MiB",
          g, group.size(), group.input_len,
          group.target_len ? absl::StrCat("+", group.target_len) : "", MiB(mc.stored_bytes),
          MiB(mc.peak_bytes), MiB(c.stored_limit_bytes), MiB(c.peak_limit_bytes)));
      return;
    }
    c.max_time_ms = std::max(c.max_time_ms, mc.time_ms);
    c.sum_time_ms += mc.time_ms;
  }
  c.groups = groups;
  c.costs = *costs;
  c.objective_ms = PipelineObjective(c.max_time_ms, c.sum_time_ms, o.pipeline, o.virtual_chunks,
                                     o.data_parallel);
}

std::vector<MicroBatchGroup> BaselineGroups(std::span<const SampleLengths> samples,
                                            const MicroBatchingOptions& o,
                                            const LengthPolicy& policy) {
  switch (o.method) {
    case PartitionMethod::kTokenBased:
      return PartitionTokenBased(samples, policy,
                                 std::max<uint64_t>(1, o.micro_batch_token_budget));
    case PartitionMethod::kFixedSize:
      return PartitionFixedSize(samples, policy, std::max<uint32_t>(1, o.fixed_micro_batch_size));
    case PartitionMethod::kPacking:
      return PartitionPacking(samples, policy, o.max_input_len, o.max_target_len,
                              std::max<uint32_t>(1, o.fixed_micro_batch_size));
    case PartitionMethod::kPadding:
    case PartitionMethod::kDynamicProgramming:
      break;
  }
  return PartitionPadding(samples, policy, std::max<uint32_t>(1, o.fixed_micro_batch_size));
}

std::string CandidateName(const MicroBatchingCandidate& c) {
  return absl::StrCat("recompute ", RecomputeName(c.recompute), " with ",
                      MemoryBudgetName(c.budget), " budget");
}

bool ValidOptions(const MicroBatchingOptions& o) {
  return o.pipeline > 0 && o.data_parallel > 0 && o.virtual_chunks > 0 && o.tensor_parallel > 0 &&
         o.length_multiple > 0 && o.device_memory_limit_bytes > 0 && !o.recompute_modes.empty() &&
         !o.budgets.empty() && o.max_input_len > 0 &&
         !(o.dims.encoder_decoder() && o.max_target_len == 0);
}

// The cost model of one recompute mode, memory in reference bytes.
absl::StatusOr<MicroBatchCostModel> CostModelFor(const CostModel& model, const StageLayout& layout,
                                                 const MicroBatchingOptions& o,
                                                 const MicroBatchingResult& result,
                                                 Recompute mode) {
  absl::StatusOr<MicroBatchCostModel> cost =
      MicroBatchCostModel::Create(model, layout, mode, o.tensor_parallel);
  if (cost.ok())
    cost->SetDeviceRoom(result.available_per_device, result.available_activation_bytes);
  return cost;
}

// Rooms per device, truncation and the sample order.
absl::Status PrepareSamples(const CostModel& model, const StageLayout& layout,
                            const MicroBatchingOptions& o, MicroBatchingResult& result) {
  if (absl::Status s = CheckAndTruncate(o, result.samples, result.truncated); !s.ok()) return s;
  absl::StatusOr<std::vector<double>> rooms = AvailableActivationBytesPerDevice(
      model, layout, o.zero, o.data_parallel * std::max(1u, o.context_parallel),
      o.device_memory_limit_bytes);
  if (!rooms.ok()) return rooms.status();
  const double smallest = *std::min_element(rooms->begin(), rooms->end());
  if (!o.per_device_memory) rooms->assign(rooms->size(), smallest);
  result.available_per_device = *std::move(rooms);
  result.available_activation_bytes = smallest;
  const LengthPolicy policy = PolicyOf(o);
  if (o.truncate) {
    absl::StatusOr<MicroBatchCostModel> permissive =
        CostModelFor(model, layout, o, result, o.recompute_modes.back());
    if (!permissive.ok()) return permissive.status();
    if (absl::Status s =
            TruncateForMemory(*permissive, o, policy, smallest, result.samples, result.truncated);
        !s.ok()) {
      return s;
    }
  }
  const Clock::time_point order_start = Clock::now();
  result.order = OrderSamples(result.samples, policy, o.order);
  if (o.method == PartitionMethod::kDynamicProgramming && o.packed_row_tokens > 0) {
    // Rows within the maxima, so their padded lengths hold them.
    result.packed_rows =
        PackRows(result.samples, policy, std::min(o.packed_row_tokens, o.max_input_len),
                 policy.encoder_decoder ? o.max_target_len : 0);
    for (const std::vector<uint32_t>& row : result.packed_rows) {
      SampleLengths total{.input = 0, .target = 0};
      uint64_t labelled = 0;
      for (uint32_t position : row) {
        const SampleLengths& s = result.samples[position];
        total.input += SequenceLength(s, policy);
        if (policy.encoder_decoder) total.target += s.target;
        labelled += LossTokens(s, policy.encoder_decoder);
      }
      result.row_lengths.push_back(total);
      result.row_labelled.push_back(labelled);
    }
    result.row_order = OrderSamples(result.row_lengths, policy, o.order);
  }
  result.ordering_ms = MsSince(order_start);
  return absl::OkStatus();
}

// A solution over packed rows (MicroBatchingResult::packed_rows) as groups
// of samples: each group's rows in order, row_starts where a row holds more
// than one sample (a group of single-sample rows is an unpacked one). The
// padded lengths are the rows'.
void ExpandPackedRows(const MicroBatchingResult& result, MicroBatchingCandidate& c) {
  for (MicroBatchGroup& group : c.groups) {
    MicroBatchGroup expanded;
    bool packed = false;
    for (uint32_t row : group.samples) {
      const std::vector<uint32_t>& members = result.packed_rows[row];
      expanded.row_starts.push_back(static_cast<uint32_t>(expanded.samples.size()));
      expanded.samples.insert(expanded.samples.end(), members.begin(), members.end());
      packed |= members.size() > 1;
    }
    if (!packed) expanded.row_starts.clear();
    expanded.input_len = group.input_len;
    expanded.target_len = group.target_len;
    group = std::move(expanded);
  }
}

// The (mode, budget) pairs of one mode, limits set, no solution yet.
std::vector<MicroBatchingCandidate> PairsOf(const MicroBatchingOptions& o, double available,
                                            Recompute mode) {
  std::vector<MicroBatchingCandidate> pairs;
  for (MemoryBudget budget : o.budgets) {
    MicroBatchingCandidate c;
    c.recompute = mode;
    c.budget = budget;
    c.peak_limit_bytes = available;
    c.stored_limit_bytes =
        budget == MemoryBudget::kWholeDevice ? available : available / o.pipeline;
    pairs.push_back(std::move(c));
  }
  return pairs;
}

void TakeSolution(absl::StatusOr<DpSolution>& solution, MicroBatchingCandidate& c) {
  if (!solution.ok()) {
    c.status = solution.status();
    return;
  }
  c.tmax_candidates = solution->tmax_candidates;
  c.tmax_evaluated = solution->tmax_evaluated;
  c.stored_limit_bytes = solution->stored_limit_bytes;
  if (solution->pruned) {
    c.pruned = true;
    c.objective_ms = solution->lower_bound_ms;
    return;
  }
  c.groups = std::move(solution->groups);
  c.costs = std::move(solution->costs);
  c.objective_ms = solution->objective_ms;
  c.max_time_ms = solution->max_time_ms;
  c.sum_time_ms = solution->sum_time_ms;
}

// The DP for `pairs` (one mode) sharing one run table; cutoffs[k] (null:
// none) is the objective pair k must beat, lowered by its solution.
void SolvePairsDp(const MicroBatchCostModel& cost, const MicroBatchingOptions& o,
                  const MicroBatchingResult& result, std::span<double* const> cutoffs,
                  DpWorkspace* workspace, std::vector<MicroBatchingCandidate>& pairs) {
  // Over packed rows the rows are the DP's samples (no sample ids: a row
  // is not one sample).
  const bool rows = !result.packed_rows.empty();
  const DpProblem problem{.samples = rows ? result.row_lengths : result.samples,
                          .order = rows ? result.row_order : result.order,
                          .sample_ids = rows ? std::span<const uint64_t>() : o.sample_ids,
                          .labelled = rows ? std::span<const uint64_t>(result.row_labelled)
                                           : std::span<const uint64_t>(),
                          .policy = PolicyOf(o),
                          .cost = &cost,
                          .pipeline_stages = o.pipeline,
                          .virtual_chunks = o.virtual_chunks,
                          .data_parallel = o.data_parallel,
                          .peak_limit_bytes = result.available_activation_bytes,
                          .tmax_interval_ms = o.tmax_interval_ms,
                          .threads = o.threads,
                          .workspace = workspace};
  std::vector<DpBudget> budgets;
  for (size_t k = 0; k < pairs.size(); ++k) {
    const MicroBatchingCandidate& c = pairs[k];
    budgets.push_back({.stored_limit_bytes = c.stored_limit_bytes,
                       .depth = c.budget == MemoryBudget::kPipelineDepth ? o.pipeline : 1u,
                       .cutoff = cutoffs[k]});
  }
  std::vector<absl::StatusOr<DpSolution>> solutions = SolveMicroBatchDpBudgets(problem, budgets);
  for (size_t k = 0; k < pairs.size(); ++k) {
    TakeSolution(solutions[k], pairs[k]);
    if (rows) ExpandPackedRows(result, pairs[k]);
  }
}

// Balancing and padding of a solved pair.
void FinishPair(const MicroBatchingOptions& o, const MicroBatchingResult& result,
                MicroBatchingCandidate& c) {
  if (!c.solved()) return;
  std::vector<double> times;
  for (const MicroBatchCost& mc : c.costs) times.push_back(mc.time_ms);
  c.replicas = BalanceReplicas(times, o.data_parallel);
  c.padding = ComputePaddingStats(result.samples, c.groups, PolicyOf(o));
}

// Every pair of every mode, in order of the options.
void SolveAllPairs(const CostModel& model, const StageLayout& layout, const MicroBatchingOptions& o,
                   MicroBatchingResult& result) {
  std::vector<MicroBatchGroup> baseline;
  if (o.method != PartitionMethod::kDynamicProgramming) {
    baseline = BaselineGroups(result.samples, o, PolicyOf(o));
  }
  // The bound is shared by the pipeline-depth pairs only. The objective
  // compares partitions well where every device can hold its depth of them
  // (1F1B-like schedules); under the whole-device budget the adaptive
  // schedule holds as many as fit, so a mode with a worse objective (full
  // recomputation: smaller activations, more in flight) often simulates
  // faster, and each whole-device pair is solved to its own optimum. Nor
  // is a whole-device objective comparable to a depth one.
  double depth_best = std::numeric_limits<double>::infinity();
  DpWorkspace workspace;  // one table's storage for every mode
  for (Recompute mode : o.recompute_modes) {
    const Clock::time_point mode_start = Clock::now();
    absl::StatusOr<MicroBatchCostModel> cost = CostModelFor(model, layout, o, result, mode);
    std::vector<MicroBatchingCandidate> pairs = PairsOf(o, result.available_activation_bytes, mode);
    if (!cost.ok()) {
      for (MicroBatchingCandidate& c : pairs) c.status = cost.status();
    } else if (o.method == PartitionMethod::kDynamicProgramming) {
      std::vector<double*> cutoffs;
      for (const MicroBatchingCandidate& c : pairs) {
        const bool shared = o.share_bound && c.budget == MemoryBudget::kPipelineDepth;
        cutoffs.push_back(shared ? &depth_best : nullptr);
      }
      SolvePairsDp(*cost, o, result, cutoffs, &workspace, pairs);
    } else {
      const absl::StatusOr<std::vector<MicroBatchCost>> costs =
          CostGroups(*cost, baseline, result.samples, o);
      for (MicroBatchingCandidate& c : pairs) EvaluateGroups(o, baseline, costs, c);
    }
    // One solve covers every budget of the mode; its time is shared.
    const double mode_ms = MsSince(mode_start);
    for (MicroBatchingCandidate& c : pairs) {
      c.solve_ms = mode_ms / pairs.size();
      result.candidates.push_back(std::move(c));
    }
  }
  // Each pair's balancing and padding on its own (any thread count).
  ParallelFor(result.candidates.size(), o.threads,
              [&](size_t k) { FinishPair(o, result, result.candidates[k]); });
}

absl::Status NoPairFits(const MicroBatchingResult& result) {
  std::vector<std::string> lines;
  for (const MicroBatchingCandidate& c : result.candidates) {
    lines.push_back(absl::StrCat(CandidateName(c), ": ", c.status.message()));
  }
  // A missing grid is a setup error; otherwise memory is the problem.
  const bool all_missing =
      std::all_of(result.candidates.begin(), result.candidates.end(),
                  [](const MicroBatchingCandidate& c) { return absl::IsNotFound(c.status); });
  const std::string message =
      absl::StrCat("no recompute mode and memory budget can hold the mini-batch (",
                   absl::StrFormat("%.1f MiB", MiB(result.available_activation_bytes)),
                   " per device for activations):\n  ", absl::StrJoin(lines, "\n  "));
  return all_missing ? absl::NotFoundError(message) : absl::ResourceExhaustedError(message);
}

std::string Explain(const MicroBatchingResult& result) {
  const MicroBatchingCandidate& best = result.best();
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat("chose %s: %d micro-batches, predicted %.2f ms per iteration",
                                  CandidateName(best), best.groups.size(), best.objective_ms));
  for (size_t k = 0; k < result.candidates.size(); ++k) {
    if (static_cast<int>(k) == result.chosen) continue;
    const MicroBatchingCandidate& c = result.candidates[k];
    if (!c.status.ok()) {
      lines.push_back(absl::StrCat("  ", CandidateName(c), ": infeasible: ", c.status.message()));
    } else if (c.pruned) {
      lines.push_back(absl::StrFormat("  %s: slower (at least %.2f ms; search stopped early)",
                                      CandidateName(c), c.objective_ms));
    } else {
      lines.push_back(absl::StrFormat("  %s: %.2f ms (%+.1f%%)", CandidateName(c), c.objective_ms,
                                      100 * (c.objective_ms / best.objective_ms - 1)));
    }
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace

const char* PartitionMethodName(PartitionMethod method) {
  switch (method) {
    case PartitionMethod::kDynamicProgramming:
      return "dynamic_programming";
    case PartitionMethod::kTokenBased:
      return "token_based";
    case PartitionMethod::kFixedSize:
      return "fixed_size";
    case PartitionMethod::kPacking:
      return "packing";
    case PartitionMethod::kPadding:
      return "padding";
  }
  return "unknown";
}

const char* MemoryBudgetName(MemoryBudget budget) {
  return budget == MemoryBudget::kPipelineDepth ? "pipeline-depth (available / c)"
                                                : "whole-device (available)";
}

PartitionMethod PartitionMethodFromProto(v1::PartitionMethod method) {
  switch (method) {
    case v1::TOKEN_BASED:
      return PartitionMethod::kTokenBased;
    case v1::FIXED_SIZE:
      return PartitionMethod::kFixedSize;
    case v1::PACKING:
      return PartitionMethod::kPacking;
    case v1::PADDING:
      return PartitionMethod::kPadding;
    default:
      return PartitionMethod::kDynamicProgramming;
  }
}

namespace {

// The options' stage layout: o.layers (its stages a multiple of the
// pipeline), or the even split.
absl::StatusOr<StageLayout> LayoutOf(const MicroBatchingOptions& o) {
  if (o.layers.stages() == 0 || o.pipeline == 0 || o.layers.stages() % o.pipeline != 0) {
    return MakeStageLayout(o.dims, o.pipeline, o.virtual_chunks, nullptr, o.tensor_parallel);
  }
  return MakeStageLayout(o.dims, o.pipeline, o.layers.stages() / o.pipeline, &o.layers,
                         o.tensor_parallel);
}

}  // namespace

MicroBatchingOptions MicroBatchingOptionsFromConfig(const v1::JobConfig& config,
                                                    PartitionMethod method) {
  MicroBatchingOptions o;
  o.dims = ModelDimsFromJob(config);
  if (absl::StatusOr<StageLayout> job = JobStageLayout(config); job.ok()) o.layers = job->layers;
  o.pipeline = config.parallelism().pipeline();
  o.virtual_chunks = config.parallelism().virtual_chunks();
  o.data_parallel = config.parallelism().data();
  o.tensor_parallel = config.parallelism().tensor();
  o.context_parallel = std::max(1u, config.parallelism().context());
  // Validation admits stages 0 and 1 (common/config/job_config.cc).
  o.zero = static_cast<ZeroStage>(std::min(config.training().zero_stage(), 3u));
  o.device_memory_limit_bytes =
      static_cast<double>(config.cluster().device_memory_limit_mib()) * (1 << 20);
  o.recompute_modes.clear();
  for (int mode : config.planner().recompute_modes()) {
    o.recompute_modes.push_back(RecomputeFromProto(static_cast<v1::RecomputeMode>(mode)));
  }
  o.budgets.clear();
  bool depth = false;
  bool whole = false;
  for (int schedule : config.planner().schedules()) {
    (schedule == v1::ADAPTIVE || schedule == v1::ADAPTIVE_ZERO_BUBBLE ? whole : depth) = true;
  }
  if (depth) o.budgets.push_back(MemoryBudget::kPipelineDepth);
  if (whole) o.budgets.push_back(MemoryBudget::kWholeDevice);
  o.method = method;
  o.order = config.planner().sample_order() == v1::TWO_D_TOUR ? SampleOrder::kTwoDTour
                                                              : SampleOrder::kLengthSort;
  o.length_multiple = config.planner().length_multiple();
  o.tmax_interval_ms = config.planner().tmax_interval_ms();
  o.max_input_len = config.data().max_sequence_length();
  o.max_target_len = config.data().max_target_length();
  o.truncate = config.planner().truncate_long_samples();
  o.fixed_micro_batch_size = config.planner().fixed_micro_batch_size();
  o.micro_batch_token_budget = config.planner().micro_batch_token_budget();
  o.packed_attention = PackedAttentionPricingOf(config);
  return o;
}

PackedAttentionPricing PackedAttentionPricingOf(const v1::JobConfig& config) {
  switch (config.model().packed_attention()) {
    case v1::BLOCK_DIAGONAL_MASK:
      return PackedAttentionPricing::kBlockDiagonalMask;
    case v1::PER_SAMPLE:
      return PackedAttentionPricing::kPerSample;
    default:
      return PackedAttentionPricing::kFastest;
  }
}

std::optional<PackedSamples> PackedSamplesOf(const MicroBatchGroup& group,
                                             std::span<const SampleLengths> samples,
                                             const LengthPolicy& policy,
                                             PackedAttentionPricing pricing) {
  if (group.row_starts.empty() || pricing == PackedAttentionPricing::kBlockDiagonalMask) {
    return std::nullopt;
  }
  PackedSamples packed;
  packed.rows = static_cast<uint32_t>(group.row_starts.size());
  packed.only_if_faster = pricing == PackedAttentionPricing::kFastest;
  packed.samples.reserve(group.samples.size());
  for (uint32_t position : group.samples) {
    const SampleLengths& s = samples[position];
    packed.samples.push_back(
        {.input = SequenceLength(s, policy), .target = policy.encoder_decoder ? s.target : 0});
  }
  return packed;
}

absl::StatusOr<MicroBatchingResult> PlanMicroBatches(std::span<const SampleLengths> samples,
                                                     const CostModel& model,
                                                     const MicroBatchingOptions& o) {
  const Clock::time_point start = Clock::now();
  if (!ValidOptions(o)) {
    return absl::InvalidArgumentError(
        "micro-batching options: degrees, length multiple, memory limit, maximum lengths, "
        "recompute modes and budgets must all be set");
  }
  absl::StatusOr<StageLayout> layout = LayoutOf(o);
  if (!layout.ok()) return layout.status();
  MicroBatchingResult result;
  result.samples.assign(samples.begin(), samples.end());
  if (absl::Status s = PrepareSamples(model, *layout, o, result); !s.ok()) return s;
  SolveAllPairs(model, *layout, o, result);
  for (size_t k = 0; k < result.candidates.size(); ++k) {
    const MicroBatchingCandidate& c = result.candidates[k];
    if (c.solved() &&
        (result.chosen < 0 || c.objective_ms < result.candidates[result.chosen].objective_ms)) {
      result.chosen = static_cast<int>(k);
    }
  }
  if (result.chosen < 0) {
    const absl::Status none = NoPairFits(result);
    if (o.fail_without_pair) return none;
    result.reason = std::string(none.message());
    result.total_ms = MsSince(start);
    return result;
  }
  result.reason = Explain(result);
  result.replicas = result.best().replicas;
  result.padding = result.best().padding;
  result.total_ms = MsSince(start);
  return result;
}

absl::Status SolvePrunedPair(const CostModel& model, const MicroBatchingOptions& o, size_t index,
                             MicroBatchingResult* result) {
  if (index >= result->candidates.size() || !result->candidates[index].pruned) {
    return absl::InvalidArgumentError("SolvePrunedPair: not a pruned pair");
  }
  absl::StatusOr<StageLayout> layout = LayoutOf(o);
  if (!layout.ok()) return layout.status();
  MicroBatchingCandidate& c = result->candidates[index];
  absl::StatusOr<MicroBatchCostModel> cost = CostModelFor(model, *layout, o, *result, c.recompute);
  if (!cost.ok()) return cost.status();
  std::vector<MicroBatchingCandidate> pairs = {
      PairsOf(o, result->available_activation_bytes, c.recompute)[0]};
  pairs[0].budget = c.budget;
  pairs[0].stored_limit_bytes = c.budget == MemoryBudget::kWholeDevice
                                    ? result->available_activation_bytes
                                    : result->available_activation_bytes / o.pipeline;
  double* const no_cutoff[] = {nullptr};
  SolvePairsDp(*cost, o, *result, no_cutoff, nullptr, pairs);
  FinishPair(o, *result, pairs[0]);
  pairs[0].solve_ms = c.solve_ms;
  c = std::move(pairs[0]);
  return c.status;
}

}  // namespace varipipe::planner
