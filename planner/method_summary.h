// Per partition method, the best candidate of one planned mini-batch and why
// the chosen plan beat it: what varipipe-plan prints under each iteration
// and in its JSON report, so a user sees what each method would have given.
//
//   absl::StatusOr<PlanningResult> r = planner.Plan(mini_batch);
//   for (const MethodSummary& m : SummarizeMethods(r->report)) ...
#ifndef VARIPIPE_PLANNER_METHOD_SUMMARY_H_
#define VARIPIPE_PLANNER_METHOD_SUMMARY_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/planner.h"

namespace varipipe::planner {

struct MethodSummary {
  std::string partition_method;
  enum class Outcome {
    kChosen,   // its best candidate is the plan
    kSlower,   // it fits, with a longer makespan
    kBounded,  // it could not beat the plan: no schedule of its micro-batches is shorter
    kNoFit,    // no candidate fits (memory, micro-batching, too few micro-batches)
  } outcome = Outcome::kNoFit;
  // kChosen, kSlower: the fastest candidate that fits. kBounded: the one
  // with the smallest makespan bound. kNoFit: the last one rejected with
  // the method's first (smallest) setting.
  CandidateReport best;
  // kSlower: its makespan over the plan's, minus one (0.05: 5% longer);
  // kBounded: its bound over the plan's makespan, minus one.
  double slower_by = 0;
  // Why it lost, or (kChosen) what it beat; one line.
  std::string why;
};

// One summary per method that had a candidate, in the order of the
// report's candidates (the config's method order). A failed search (no
// plan) gives kNoFit for every method (nothing is pruned by the bound
// before something fits).
std::vector<MethodSummary> SummarizeMethods(const PlanReport& report);

// "packing rows=8": the method and, for a tuned baseline, its setting.
std::string MethodAndSetting(absl::string_view method, absl::string_view setting);
std::string MethodAndSetting(const CandidateReport& candidate);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_METHOD_SUMMARY_H_
