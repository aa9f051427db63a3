#include "planner/method_summary.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace varipipe::planner {
namespace {

using Outcome = MethodSummary::Outcome;

// Why a slower candidate lost to the plan: the makespan is at least the
// busiest device's compute, and what is left is pipeline bubbles.
std::string WhySlower(const CandidateReport& c, const PlanReport& plan) {
  const std::string what = absl::StrFormat("%+.1f%% makespan (%.2f ms, %s, recompute %s)",
                                           100 * (c.makespan_ms / plan.predicted_makespan_ms - 1),
                                           c.makespan_ms, c.schedule, c.recompute);
  if (c.busiest_device_ms > plan.busiest_device_ms * 1.005) {
    return absl::StrFormat("%s: more compute, its busiest device works %.2f ms (the plan's %.2f)",
                           what, c.busiest_device_ms, plan.busiest_device_ms);
  }
  return absl::StrFormat("%s: more pipeline bubbles, %.1f%% (the plan's %.1f%%)", what,
                         100 * c.bubble_fraction, 100 * plan.bubble_fraction);
}

}  // namespace

std::string MethodAndSetting(absl::string_view method, absl::string_view setting) {
  if (setting.empty()) return std::string(method);
  return absl::StrCat(method, " ", setting);
}

std::string MethodAndSetting(const CandidateReport& candidate) {
  return MethodAndSetting(candidate.partition_method, candidate.setting);
}

namespace {

// Each method's best candidate: its fastest that fits, else its lowest
// bound, else (nothing fits) its smallest setting's (the first) most lenient
// recompute mode (the last tried).
std::vector<MethodSummary> BestPerMethod(const PlanReport& report) {
  std::vector<MethodSummary> out;
  std::map<std::string, size_t> index;
  std::map<std::string, std::string> first_setting;
  for (const CandidateReport& c : report.candidates) {
    auto [it, added] = index.emplace(c.partition_method, out.size());
    if (added) {
      MethodSummary first;
      first.partition_method = c.partition_method;
      first.best = c;
      out.push_back(std::move(first));
      first_setting[c.partition_method] = c.setting;
    }
    MethodSummary& m = out[it->second];
    if (c.feasible) {
      if (m.outcome != Outcome::kSlower || c.makespan_ms < m.best.makespan_ms) {
        m.outcome = Outcome::kSlower;
        m.best = c;
      }
    } else if (m.outcome == Outcome::kSlower) {
      continue;
    } else if (c.rejected_at == "bound") {
      if (m.outcome != Outcome::kBounded || c.makespan_bound_ms < m.best.makespan_bound_ms) {
        m.outcome = Outcome::kBounded;
        m.best = c;
      }
    } else if (m.outcome == Outcome::kNoFit && c.setting == first_setting[c.partition_method]) {
      m.best = c;
    }
  }
  return out;
}

// Why the chosen method won, against the closest other.
std::string WhyChosen(const MethodSummary* runner_up) {
  if (runner_up == nullptr) return "the only method whose candidates fit";
  if (runner_up->outcome == Outcome::kSlower && runner_up->slower_by <= 0) {
    return absl::StrFormat("fastest, tied with %s (the earlier candidate wins ties)",
                           MethodAndSetting(runner_up->best));
  }
  if (runner_up->outcome == Outcome::kSlower) {
    return absl::StrFormat("fastest: the next method, %s, is %.1f%% slower",
                           MethodAndSetting(runner_up->best), 100 * runner_up->slower_by);
  }
  return absl::StrFormat(
      "fastest: every other method is at least %.1f%% slower (%s cannot go below that)",
      100 * runner_up->slower_by, MethodAndSetting(runner_up->best));
}

}  // namespace

std::vector<MethodSummary> SummarizeMethods(const PlanReport& report) {
  std::vector<MethodSummary> out = BestPerMethod(report);
  const bool planned = !report.partition_method.empty();
  MethodSummary* chosen = nullptr;
  for (MethodSummary& m : out) {
    if (planned && m.outcome == Outcome::kSlower && m.partition_method == report.partition_method &&
        m.best.makespan_ms <= report.predicted_makespan_ms) {
      m.outcome = Outcome::kChosen;
      chosen = &m;
    }
  }
  const MethodSummary* runner_up = nullptr;
  for (MethodSummary& m : out) {
    switch (m.outcome) {
      case Outcome::kChosen:
        break;
      case Outcome::kSlower:
        if (!planned) break;
        m.slower_by = m.best.makespan_ms / report.predicted_makespan_ms - 1;
        m.why = WhySlower(m.best, report);
        if (runner_up == nullptr || m.slower_by < runner_up->slower_by) runner_up = &m;
        break;
      case Outcome::kBounded:
        if (planned) m.slower_by = m.best.makespan_bound_ms / report.predicted_makespan_ms - 1;
        m.why = absl::StrFormat(
            "cannot win: no schedule of its micro-batches takes under %.2f ms (%+.1f%%), so it "
            "was not simulated",
            m.best.makespan_bound_ms, 100 * m.slower_by);
        if (planned && (runner_up == nullptr || m.slower_by < runner_up->slower_by)) {
          runner_up = &m;
        }
        break;
      case Outcome::kNoFit:
        m.why = absl::StrCat("nothing fits: ", m.best.recompute, ": ", m.best.rejected_at, ": ",
                             m.best.reason);
        break;
    }
  }
  if (chosen != nullptr) chosen->why = WhyChosen(runner_up);
  return out;
}

}  // namespace varipipe::planner
