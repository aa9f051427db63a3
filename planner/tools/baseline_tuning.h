// Baselines tuned as a user would tune them, for the evaluation
// (varipipe-evaluate, docs/evaluation.md) and varipipe-plan --compare.
//
// A user of a baseline picks one setting for the whole run: packing,
// fixed-size and padding their rows (packed sequences or samples) per
// micro-batch and a recompute mode; token-based its token budget and a
// recompute mode. Each setting is planned on the same mini-batches with the
// planner's schedules; it fits when every mini-batch has a plan within
// memory, and the tuned setting is the one with the best predicted real
// tokens per second (total real tokens / total predicted time) among those
// that fit. The DP needs no tuning: it chooses per mini-batch. "varipipe"
// is the planner's default search (every method, each baseline's setting
// tuned per mini-batch, every schedule): what a job that lists no method
// gets. Packing is tuned twice: with attention over the whole packed row
// under a block-diagonal mask ("packing", as DynaPipe's evaluation and
// Megatron-LM in 2023 ran it) and per sample with a variable-length kernel
// ("packing-varlen", as Megatron-Core's THD format, TRL's padding-free
// training and torchtitan run it today).
#ifndef VARIPIPE_PLANNER_TOOLS_BASELINE_TUNING_H_
#define VARIPIPE_PLANNER_TOOLS_BASELINE_TUNING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/planner.h"
#include "varipipe/v1/config.pb.h"

namespace varipipe::tools {

// A job planned on a synthetic mixture: the config (data replaced by the
// mixture, one planning thread) and its cost model.
struct EvaluationJob {
  v1::JobConfig config;
  planner::CostModel cost_model;
  std::string model_name;       // e.g. "GPT 32 layers h4096 pp4 dp2"
  std::string mixture_name;     // "flan", "documents" or "long_tail"
  std::string cost_model_name;  // the cost model's description
  std::string cost_model_path;  // empty: analytic
};

// Loads `config_path`, replaces its data by the synthetic `mixture` ("flan",
// "documents" or "long_tail"; 200,000 samples) and builds its cost model (`cost_model`
// when not empty). InvalidArgument names the file or flag.
absl::StatusOr<EvaluationJob> LoadEvaluationJob(const std::string& config_path,
                                                const std::string& mixture,
                                                const std::string& cost_model);

// The job at another maximum length (T5 targets: a quarter of it) and device
// memory limit, its cost model rebuilt for them; an AUTO stage layout chosen
// for them (ChooseStageLayout) and fixed as LISTED.
absl::StatusOr<EvaluationJob> WithLimits(const EvaluationJob& job, uint32_t max_length,
                                         uint64_t memory_mib);

// Iterations 0..n-1 as the training sampler draws them.
std::vector<planner::MiniBatch> MiniBatches(const EvaluationJob& job, int n);

// One setting of one partition method. rows: packing, fixed-size and
// padding; token_budget: token-based; recompute UNSPECIFIED: the planner
// chooses per mini-batch among all three (the DP). Method UNSPECIFIED: the
// default search ("varipipe").
struct Setting {
  v1::PartitionMethod method = v1::DYNAMIC_PROGRAMMING;
  uint32_t rows = 0;
  uint64_t token_budget = 0;
  v1::RecomputeMode recompute = v1::RECOMPUTE_MODE_UNSPECIFIED;
  // Packed rows' attention; UNSPECIFIED: the job's (model.packed_attention).
  v1::PackedAttention packed_attention = v1::PACKED_ATTENTION_UNSPECIFIED;

  std::string Describe() const;       // "rows=8", "tokens=8192" or "-"
  std::string RecomputeName() const;  // "none", "selective", "full" or "per-iteration"
};

struct TrialOutcome {
  Setting setting;
  bool feasible = false;
  std::string reason;  // why not, when infeasible (the first mini-batch that failed)
  double tokens_per_s = 0;
  double padding_efficiency = 0;  // mean over mini-batches
  double micro_batches = 0;       // mean per mini-batch (all replicas)
  double predicted_ms = 0;        // mean predicted iteration
};

// Plans every mini-batch with `setting` (the job's schedules; stops at the
// first that does not fit).
TrialOutcome Evaluate(const EvaluationJob& job, const Setting& setting,
                      const std::vector<planner::MiniBatch>& batches);

struct MethodResult {
  // "varipipe", "dp", "packing", "packing-varlen", "token-based",
  // "fixed-size", "padding"
  std::string method;
  std::vector<TrialOutcome> trials;
  int chosen = 0;  // the best feasible trial; else the most lenient one (the last)
};

// The settings a user would try for `method` (rows 1..64 or budgets of 1..32
// maximum lengths, times the three recompute modes; the DP: one), each
// evaluated, and the tuned one.
// `packed_attention` (PACKING): how packed rows compute attention;
// UNSPECIFIED: the job's.
MethodResult TuneMethod(const EvaluationJob& job, v1::PartitionMethod method,
                        const std::vector<planner::MiniBatch>& batches,
                        v1::PackedAttention packed_attention = v1::PACKED_ATTENTION_UNSPECIFIED);
// The default search ("varipipe"), DP, packing (full-row), packing-varlen,
// token-based, fixed-size and padding.
std::vector<MethodResult> TuneAllMethods(const EvaluationJob& job,
                                         const std::vector<planner::MiniBatch>& batches);

// The DP's plan of each mini-batch (one thread): planning time and outcome.
struct IterationOutcome {
  uint64_t iteration = 0;
  int samples = 0;
  double planning_ms = 0;
  double predicted_ms = 0;
  int micro_batches = 0;
  std::string schedule;
  std::string recompute;
};
std::vector<IterationOutcome> PlanEach(const EvaluationJob& job,
                                       const std::vector<planner::MiniBatch>& batches);

// Short name of a partition method: "dp", "packing", ...; "varipipe" for
// UNSPECIFIED (the default search); PACKING with PER_SAMPLE attention is
// "packing-varlen", with BLOCK_DIAGONAL_MASK "packing", with
// FASTEST_PER_MICRO_BATCH "packing-fastest".
std::string MethodName(v1::PartitionMethod method,
                       v1::PackedAttention packed_attention = v1::BLOCK_DIAGONAL_MASK);

}  // namespace varipipe::tools

#endif  // VARIPIPE_PLANNER_TOOLS_BASELINE_TUNING_H_
