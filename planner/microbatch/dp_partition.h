// DynaPipe's micro-batching dynamic program (section 4, Eq. 1-2 and the
// data-parallel objective).
//
// Given samples in a fixed order, choose cut points so that consecutive runs
// form micro-batches M_1..M_m minimising
//
//     (c - 1) * max_i t(M_i) / v  +  sum_i t(M_i) / |D|
//
// where c is the number of pipeline stages, v the virtual chunks per device
// (1 without interleaving) and |D| the data-parallel degree, subject to every
// micro-batch's stored activation <= stored_limit and peak <= peak_limit.
//
// Method: for each candidate tmax, f(n; tmax) = min over i of
// f(i; tmax) + t(M[i, n)) with t(M[i, n)) <= tmax (Eq. 2); the answer is the
// best candidate. Candidates are the distinct micro-batch times, optionally
// bucketed: with interval w, each candidate stands for the times in
// (candidate - w, candidate], so the objective is within (c - 1) * w / v of
// the optimum; w = 0 is exact.
//
// A run's cost t(M) prices the loss head at the run's labelled tokens, the
// sum of its samples' (DpProblem::labelled), so it depends on which samples
// the run holds, not only on its size and padded lengths.
//
// Speed (docs/benchmarks.md): per-range maxima of the lengths are kept while
// a run grows; costs are evaluated on a per-length row of the cost grid,
// prepared once per padded length (decoder-only: the components of b
// samples at padded length L are looked up once per (L, b) and each run
// reprices only its head); runs stop growing at the first memory
// violation (costs grow with the run) and at a cap no run of the optimum
// exceeds ((upper bound of the objective - lower bound of sum t / |D|) *
// v / (c - 1)); the candidates are searched by branch and bound: f(N; tmax)
// never grows with tmax, so an interval [a, b] of candidates is skipped when
// (c - 1) * tmax_a / v + f(N; tmax_b+1) / |D| cannot beat the best. Inner
// loops are flat arrays: no allocation, hashing or virtual calls.
#ifndef VARIPIPE_PLANNER_MICROBATCH_DP_PARTITION_H_
#define VARIPIPE_PLANNER_MICROBATCH_DP_PARTITION_H_

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/micro_batch_cost.h"
#include "planner/microbatch/micro_batch.h"

namespace varipipe::planner {

// Storage the run tables keep between solves of one mini-batch (its
// recompute modes and budgets): a table of millions of runs is then neither
// unmapped nor faulted in again for the next one. Not shared between
// concurrent solves.
struct DpWorkspace {
  std::vector<std::vector<double>> time_chunks;
  std::vector<std::vector<double>> memory_chunks;
  std::vector<std::vector<double>> probe_time_chunks;
  std::vector<std::vector<double>> probe_memory_chunks;
};

struct DpProblem {
  std::span<const SampleLengths> samples;     // the mini-batch
  std::span<const uint32_t> order;            // positions in `samples`, partition order
  std::span<const uint64_t> sample_ids = {};  // parallel to `samples`, for errors; may be empty
  // Parallel to `samples`: each one's labelled tokens, the positions the
  // loss head runs on (a packed row: its samples' sum). Empty: LossTokens
  // of each sample. A run's head is priced at its samples' sum
  // (MicroBatchCostModel::Evaluate).
  std::span<const uint64_t> labelled = {};
  // Padded lengths never exceed policy.max_input / max_target; a sample of
  // the order over them is InvalidArgument.
  LengthPolicy policy;
  const MicroBatchCostModel* cost = nullptr;
  uint32_t pipeline_stages = 1;  // c
  uint32_t virtual_chunks = 1;   // v
  uint32_t data_parallel = 1;    // |D|
  double stored_limit_bytes = 0;
  double peak_limit_bytes = 0;
  double tmax_interval_ms = 0;
  // Stop the candidate search at the lower bound (see above). Off only to
  // measure what the bound saves (tests/bench/microbatch_bench.cc).
  bool bound_search = true;
  // An objective already achieved elsewhere (another recompute mode or
  // budget). The solver looks only for strictly better partitions: runs
  // slower than cutoff * v / (c - 1) are never built, and when nothing beats
  // the cutoff the solution comes back `pruned`.
  double objective_cutoff_ms = std::numeric_limits<double>::infinity();
  // Threads for the run table and, from 2, for solving tmax candidates
  // ahead of the search (the result does not depend on it).
  int threads = 1;
  // Reused table storage; null: each solve allocates its own.
  DpWorkspace* workspace = nullptr;
};

struct DpSolution {
  std::vector<MicroBatchGroup> groups;  // in partition order
  std::vector<MicroBatchCost> costs;    // parallel to groups
  double objective_ms = 0;              // the minimised objective
  double max_time_ms = 0;               // max t(M) of the solution
  double sum_time_ms = 0;               // sum t(M)
  int tmax_candidates = 0;              // after bucketing
  int tmax_evaluated = 0;               // DP runs before the bound stopped the search
  // True when no partition beats objective_cutoff_ms; groups are then empty
  // and lower_bound_ms bounds every partition's objective from below.
  bool pruned = false;
  double lower_bound_ms = 0;
  // The stored-activation limit the solution was found under (lower than
  // the budget's when transients forced a tighter one, see DpBudget).
  double stored_limit_bytes = 0;
};

// One memory budget of a recompute mode.
struct DpBudget {
  double stored_limit_bytes = 0;
  // 1: each micro-batch's stored activation is limited (the adaptive
  // schedule's whole-device budget). The pipeline depth c (1F1B, kFkB,
  // GPipe): what a device holds at once is limited to depth * limit, where
  // device d holds up to c - d micro-batches
  // (MicroBatchCost::depth_stored_bytes). The solution also leaves each
  // device class room for its largest transient on top: a device's
  // simulated peak is everything in flight plus the running op's transient
  // (planner/sim/simulator.h), which a per-micro-batch peak check misses.
  // When a class lacks it, the limit drops to (peak - transient) / depth and
  // the DP re-runs on the same table.
  uint32_t depth = 1;
  // The objective to beat, shared by the budgets that compare (see
  // objective_cutoff_ms); lowered by every solution found. Null: none.
  double* cutoff = nullptr;
};

// The objective for given times (shared with baselines and tests).
double PipelineObjective(double max_time_ms, double sum_time_ms, uint32_t pipeline_stages,
                         uint32_t virtual_chunks, uint32_t data_parallel);

// ResourceExhausted when a sample fits no micro-batch on its own (the error
// names its position, lengths and the limit); InvalidArgument for bad input.
absl::StatusOr<DpSolution> SolveMicroBatchDp(const DpProblem& problem);

// The same problem under several stored-activation limits (the memory
// budgets of one recompute mode), sharing the cost evaluation of every run.
// problem.stored_limit_bytes is ignored. *cutoff starts as the objective to
// beat and is lowered by every solution found, so later limits only search
// for better partitions. One result per limit, in order.
std::vector<absl::StatusOr<DpSolution>> SolveMicroBatchDpBudgets(
    const DpProblem& problem, std::span<const double> stored_limits, double* cutoff);
// The same with one cutoff per budget (DpBudget::cutoff).
std::vector<absl::StatusOr<DpSolution>> SolveMicroBatchDpBudgets(const DpProblem& problem,
                                                                 std::span<const DpBudget> budgets);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_DP_PARTITION_H_
