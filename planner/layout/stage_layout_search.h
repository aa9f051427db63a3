// ChooseStageLayout: the stage layout of a parallelism.stage_layout AUTO job
// (docs/configuration.md, "Stage layout"; docs/architecture.md).
//
// Layers move only with their weights, so the layout is chosen once per job,
// from the cost model and a sample of the job's mini-batches:
//   1. the even split is planned for every sampled mini-batch; the chosen
//      micro-batches give each component's work (forward + backward, the
//      cost model's grids) summed over the sample: one encoder layer, one
//      decoder layer, each embedding, the LM head;
//   2. candidates: for every split of the devices between encoder and
//      decoder (T5), the layout whose busiest stage does the least of that
//      work (PipeDream's partitioner, Narayanan's dissertation chapter 3:
//      minimise the slowest stage), the layouts one layer away from it at
//      the pipeline's ends, and the even split;
//   3. each candidate is planned for every sampled mini-batch (the full
//      search: micro-batching, schedules, each device's memory with its own
//      model state); a candidate for which some mini-batch has no plan is
//      out, with the reason;
//   4. local search from the best: every move of one layer between
//      neighbouring stages of a stack is planned the same way, and the best
//      move taken while it shortens the mean (AdaPtis-like: the partition
//      judged by the planner's own predicted iterations, not a proxy).
// The lowest mean predicted iteration wins. Ties go to the earlier
// candidate, the even split first: the choice is deterministic for a given
// config, cost model and sample, whatever the thread count.
#ifndef VARIPIPE_PLANNER_LAYOUT_STAGE_LAYOUT_SEARCH_H_
#define VARIPIPE_PLANNER_LAYOUT_STAGE_LAYOUT_SEARCH_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/layer_layout.h"
#include "planner/planner.h"

namespace varipipe::planner {

struct LayoutCandidate {
  LayerLayout layers;
  std::string origin;  // "even split", "balanced", "balanced, one layer moved"
  // The busiest stage's share of the sampled work (step 2), ms.
  double busiest_stage_work_ms = 0;
  bool feasible = false;
  double mean_iteration_ms = 0;  // over the sample, when feasible
  std::string reason;            // why not feasible
};

struct LayoutChoice {
  LayerLayout chosen;
  LayerLayout even;
  double chosen_mean_ms = 0;
  double even_mean_ms = 0;  // 0 when the even split has no plan
  int sampled_mini_batches = 0;
  std::vector<LayoutCandidate> candidates;  // in evaluation order, the even split first
  // One line: the choice against the even split.
  std::string Summary() const;
  // Summary() and one line per candidate with its mean or its reason.
  std::string Describe() const;
};

// Mini-batches the planner daemons and varipipe-plan sample for an AUTO
// layout: the job's first ones (iterations 0, 1, ...), the same for every
// daemon.
inline constexpr uint64_t kLayoutSampleMiniBatches = 8;

struct LayoutSearchOptions {
  // Balanced candidates besides the even split (the most balanced first).
  int max_candidates = 8;
  // Local search (step 4): rounds, and layouts planned in all.
  int max_local_rounds = 6;
  int max_evaluations = 48;
};

// InvalidArgument for an empty sample; FailedPrecondition naming the even
// split's and the candidates' reasons when no candidate plans every
// sampled mini-batch. `planner`'s own config may have any layout mode; its
// pipeline and virtual_chunks set the stages.
absl::StatusOr<LayoutChoice> ChooseStageLayout(const Planner& planner,
                                               std::span<const MiniBatch> sample,
                                               const LayoutSearchOptions& options = {});

// The layout of a `stages`-stage stack of `layers` layers whose busiest
// stage does the least work when each layer costs `layer_ms` and stage s
// also does `extra_ms[s]` (an embedding, the LM head): at least one layer
// per stage. Ties keep the remainder on the earlier stages. REQUIRES:
// layers >= stages == extra_ms.size() >= 1, layer_ms > 0.
std::vector<uint32_t> BalancedSplit(uint32_t layers, double layer_ms,
                                    std::span<const double> extra_ms);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_LAYOUT_STAGE_LAYOUT_SEARCH_H_
