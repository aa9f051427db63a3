// Micro-batch construction for one mini-batch: validation and truncation of
// the samples, ordering, partitioning (the dynamic program or a baseline)
// for every allowed recompute mode and memory budget, the choice between
// them by predicted iteration time, data-parallel balancing and statistics.
//
// Memory budgets (DynaPipe section 4, "Limit memory consumption"): the
// per-micro-batch stored-activation limit depends on how many micro-batches
// a schedule keeps in flight:
//   kPipelineDepth  available / c   (1F1B, interleaved, kFkB, GPipe)
//   kWholeDevice    available       (the memory-aware adaptive schedule,
//                                    which delays injection instead)
// The peak limit is always the available activation memory. Every
// (recompute mode, budget) pair is considered and the fastest feasible one
// wins: taking the first mode that fits would pick full recomputation where a
// larger budget without recomputation is faster. Pairs are solved in order,
// sharing one table of run costs per mode; each DP only searches for
// partitions that beat the best pair of the same budget so far (the
// objective compares partitions under one schedule family, not across
// budgets), and a pair that provably cannot is reported as pruned with its
// lower bound.
#ifndef VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCHING_H_
#define VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCHING_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/memory_model.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/microbatch/dp_balance.h"
#include "planner/microbatch/micro_batch.h"
#include "planner/microbatch/padding_stats.h"
#include "planner/microbatch/sample_order.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::planner {

enum class PartitionMethod { kDynamicProgramming, kTokenBased, kFixedSize, kPacking, kPadding };
const char* PartitionMethodName(PartitionMethod method);

enum class MemoryBudget { kPipelineDepth, kWholeDevice };
const char* MemoryBudgetName(MemoryBudget budget);

struct MicroBatchingOptions {
  ModelDims dims;
  uint32_t pipeline = 1;
  uint32_t virtual_chunks = 1;
  // The job's stage layout (pipeline x its chunks stages); empty: the even
  // split over pipeline x virtual_chunks.
  LayerLayout layers;
  uint32_t data_parallel = 1;
  uint32_t tensor_parallel = 1;
  // parallelism.context: ZeRO stage 1 shards optimizer state over data x
  // context ranks (the gradient group).
  uint32_t context_parallel = 1;
  ZeroStage zero = ZeroStage::k0;
  double device_memory_limit_bytes = 0;
  std::vector<Recompute> recompute_modes = {Recompute::kNone, Recompute::kSelective,
                                            Recompute::kFull};
  std::vector<MemoryBudget> budgets = {MemoryBudget::kPipelineDepth, MemoryBudget::kWholeDevice};
  PartitionMethod method = PartitionMethod::kDynamicProgramming;
  SampleOrder order = SampleOrder::kLengthSort;
  // The mini-batch's sample ids, parallel to the lengths, for error messages
  // ("sample 81234 (position 3 of the mini-batch)"); empty: positions only.
  // Must outlive the call.
  std::span<const uint64_t> sample_ids = {};
  // Padded lengths are rounded up to this, but never past the maxima below.
  uint32_t length_multiple = 8;
  double tmax_interval_ms = 0.5;
  // Longest input (decoder-only: sequence) and target a sample, and so a
  // padded micro-batch, may have (data.max_sequence_length,
  // data.max_target_length).
  uint32_t max_input_len = 0;
  uint32_t max_target_len = 0;
  // Truncate samples that are too long (for the maxima or, alone, for
  // memory) instead of failing.
  bool truncate = false;
  uint32_t fixed_micro_batch_size = 8;    // FIXED_SIZE, PADDING; PACKING rows
  uint64_t micro_batch_token_budget = 0;  // TOKEN_BASED
  // DYNAMIC_PROGRAMMING: when > 0, the samples are first packed into rows of
  // at most this many sequence tokens and never more than max_input_len (T5:
  // input tokens, and max_target_len target tokens; PackRows), and the
  // dynamic program groups the rows. A row of one sample is an unpacked one,
  // so a micro-batch may hold both.
  uint32_t packed_row_tokens = 0;
  // How packed rows are priced (model.packed_attention): per sample (from
  // the attention-core grid when the cost model has one), over the whole
  // row under a block-diagonal mask, or the faster of the two per
  // micro-batch.
  PackedAttentionPricing packed_attention = PackedAttentionPricing::kFastest;
  // Each device's own room (limit - its own model state) instead of the
  // busiest device's for all. Off: the common budget (for comparisons).
  bool per_device_memory = true;
  // Later pairs only search for partitions that beat the best pair so far
  // (pruned pairs come back without groups; SolvePrunedPair solves one).
  // Off: every pair is solved to its optimum (the per-pair path, for tests
  // and benchmarks).
  bool share_bound = true;
  // Threads for the DP's run tables (the result does not depend on it).
  int threads = 1;
  // When no pair fits: fail (true), or return the result with chosen = -1,
  // every pair's status and the explanation in `reason` (the planner reports
  // each candidate's own reason).
  bool fail_without_pair = true;
};

// Options for `method` under a validated job config (defaults applied).
MicroBatchingOptions MicroBatchingOptionsFromConfig(const v1::JobConfig& config,
                                                    PartitionMethod method);
PartitionMethod PartitionMethodFromProto(v1::PartitionMethod method);

// The job's pricing of packed rows.
PackedAttentionPricing PackedAttentionPricingOf(const v1::JobConfig& config);

// The samples of `group`'s packed rows as the cost model prices per-sample
// attention (their lengths after truncation, from `samples`; only_if_faster
// under kFastest); nullopt for an unpacked group or under the mask.
std::optional<PackedSamples> PackedSamplesOf(const MicroBatchGroup& group,
                                             std::span<const SampleLengths> samples,
                                             const LengthPolicy& policy,
                                             PackedAttentionPricing pricing);

// One (recompute mode, memory budget) pair.
struct MicroBatchingCandidate {
  Recompute recompute = Recompute::kNone;
  MemoryBudget budget = MemoryBudget::kPipelineDepth;
  // In reference bytes (MicroBatchingResult::available_activation_bytes is
  // the reference): the budget's limit, possibly tightened for transients
  // (DpBudget).
  double stored_limit_bytes = 0;
  double peak_limit_bytes = 0;
  // Why the pair is infeasible; OK when it produced a partition.
  absl::Status status;
  std::vector<MicroBatchGroup> groups;  // empty unless solved()
  std::vector<MicroBatchCost> costs;    // parallel to groups
  // Predicted iteration time: (c - 1) * max t / v + sum t / |D| (ms).
  double objective_ms = 0;
  double max_time_ms = 0;
  double sum_time_ms = 0;
  int tmax_candidates = 0;
  int tmax_evaluated = 0;
  double solve_ms = 0;
  // The DP proved this pair cannot beat an earlier pair; objective_ms is
  // then a lower bound and groups are empty.
  bool pruned = false;
  // For a pair with groups: their data-parallel assignment and padding.
  ReplicaAssignment replicas;
  PaddingStats padding;

  bool solved() const { return status.ok() && !pruned; }
};

struct MicroBatchingResult {
  // The mini-batch after truncation; groups index into it.
  std::vector<SampleLengths> samples;
  // Positions whose lengths were truncated.
  std::vector<uint32_t> truncated;
  // The partition order of the samples.
  std::vector<uint32_t> order;
  // Each pipeline device's activation room (limit - its own model state;
  // with per_device_memory off, every device gets the smallest).
  std::vector<double> available_per_device;
  // The smallest room: the reference of the candidates' memory numbers.
  double available_activation_bytes = 0;
  // The dynamic program over packed rows (packed_row_tokens > 0): each
  // row's samples (positions into `samples`), each row's total lengths
  // (GPT: the whole sequence as input) and the rows' partition order. The
  // candidates' groups still index `samples`, with row_starts where a row
  // holds several. Empty otherwise.
  std::vector<std::vector<uint32_t>> packed_rows;
  std::vector<SampleLengths> row_lengths;
  // Parallel to row_lengths: each row's labelled tokens, its samples' sum
  // (LabelledTokens: what the row's loss head runs on).
  std::vector<uint64_t> row_labelled;
  std::vector<uint32_t> row_order;
  std::vector<MicroBatchingCandidate> candidates;
  int chosen = -1;
  // Human-readable explanation of the choice and of every rejected pair.
  std::string reason;
  // Assignment of the chosen groups to data-parallel replicas.
  ReplicaAssignment replicas;
  PaddingStats padding;
  double ordering_ms = 0;
  double total_ms = 0;

  const MicroBatchingCandidate& best() const { return candidates[chosen]; }
};

// InvalidArgument for an empty mini-batch, a zero-length sample or (without
// truncation) a sample over the maximum lengths, naming the sample;
// ResourceExhausted when no pair fits memory (naming the sample that fits
// nowhere, or the model state); NotFound when the cost model lacks grids.
absl::StatusOr<MicroBatchingResult> PlanMicroBatches(std::span<const SampleLengths> samples,
                                                     const CostModel& model,
                                                     const MicroBatchingOptions& options);

// Solves the pruned pair result->candidates[index] to its optimum (no
// cutoff), with its replicas and padding; `options` and `model` as given to
// PlanMicroBatches. The chosen pair is unchanged.
absl::Status SolvePrunedPair(const CostModel& model, const MicroBatchingOptions& options,
                             size_t index, MicroBatchingResult* result);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_MICRO_BATCHING_H_
