#include "planner/tools/parallelism_search.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/job_config.h"

namespace varipipe::planner {
namespace {

// A status message in one line: its first line, and when the planner listed
// its rejected candidates after it (one line per method and recompute mode,
// the modes in the config's order, least recomputation first), the dynamic
// program's last: why even its most recomputation does not fit.
std::string OneLineReason(const absl::Status& status) {
  std::vector<std::string> lines = absl::StrSplit(status.message(), '\n', absl::SkipEmpty());
  if (lines.empty()) return std::string();
  std::string line = lines.front();
  if (lines.size() > 1 && !line.empty() && line.back() == ':') {
    line.pop_back();
    absl::string_view detail = absl::StripAsciiWhitespace(lines.back());
    for (size_t i = 1; i < lines.size(); ++i) {
      absl::string_view l = absl::StripAsciiWhitespace(lines[i]);
      if (absl::StartsWith(l, "dynamic_programming/")) detail = l;
    }
    absl::StrAppend(&line, " (", detail, ")");
  }
  return line;
}

// The base config with `layout`; the stage layout goes back to the even
// split (a listed one belongs to another pipeline degree).
v1::JobConfig WithLayout(const v1::JobConfig& base, const ParallelismLayout& layout,
                         bool sequence_parallel, v1::ContextSplitPolicy policy) {
  v1::JobConfig config = base;
  v1::ParallelismConfig& p = *config.mutable_parallelism();
  p.set_tensor(layout.tensor);
  p.set_pipeline(layout.pipeline);
  p.set_data(layout.data);
  p.set_context(layout.context);
  p.set_context_split(layout.context > 1 ? policy : v1::PER_MICRO_BATCH);
  // Context parallelism does not run with sequence parallelism (config
  // validation refuses the pair).
  p.set_sequence_parallel(sequence_parallel && layout.tensor > 1 && layout.context == 1);
  p.set_virtual_chunks(1);
  p.clear_stage_layout();
  return config;
}

// The most frequent string of `counts`.
std::string MostCommon(const std::map<std::string, int>& counts) {
  std::string best;
  int most = 0;
  for (const auto& [value, n] : counts) {
    if (n > most) {
      best = value;
      most = n;
    }
  }
  return best;
}

// Micro-batches of one plan's groups, and those split (counted once per
// context group: on its lane 0 of pipeline rank 0).
void CountSplit(const PlanningResult& result, int* split, int* all) {
  for (const v1::ExecutionPlan& plan : result.plans) {
    if (plan.pp_rank() != 0 || plan.context_rank() != 0) continue;
    for (const v1::MicroBatch& mb : plan.micro_batches()) {
      ++*all;
      if (mb.context().split()) ++*split;
    }
  }
}

// The layout planned on the sample with the base config's search.
ParallelismCandidate Plan(const v1::JobConfig& base, const std::vector<MiniBatch>& sample,
                          const ParallelismLayout& layout, bool sequence_parallel,
                          v1::ContextSplitPolicy policy) {
  ParallelismCandidate c;
  c.layout = layout;
  v1::JobConfig config = WithLayout(base, layout, sequence_parallel, policy);
  if (absl::Status valid = ValidateJobConfig(config, "layout"); !valid.ok()) {
    c.reason = OneLineReason(valid);
    return c;
  }
  absl::StatusOr<Planner> planner = Planner::Create(config);
  if (!planner.ok()) {
    c.reason = OneLineReason(planner.status());
    return c;
  }
  std::map<std::string, int> schedules;
  std::map<std::string, int> recomputes;
  for (const MiniBatch& mb : sample) {
    absl::StatusOr<PlanningResult> result = planner->Plan(mb);
    if (!result.ok()) {
      c.reason = absl::StrCat("mini-batch ", mb.iteration, ": ", OneLineReason(result.status()));
      return c;
    }
    const PlanReport& r = result->report;
    c.iteration_ms += r.predicted_iteration_ms;
    c.tokens_per_second += static_cast<double>(r.real_tokens) / (r.predicted_iteration_ms / 1e3);
    c.bubble_fraction += r.bubble_fraction;
    for (double peak : r.peak_bytes)
      c.peak_activation_bytes = std::max(c.peak_activation_bytes, peak);
    ++schedules[r.schedule];
    ++recomputes[r.recompute];
    if (layout.context > 1) CountSplit(*result, &c.split_micro_batches, &c.micro_batches);
  }
  const double n = static_cast<double>(std::max<size_t>(1, sample.size()));
  c.iteration_ms /= n;
  c.tokens_per_second /= n;
  c.bubble_fraction /= n;
  c.schedule = MostCommon(schedules);
  c.recompute = MostCommon(recomputes);
  c.feasible = true;
  return c;
}

ParallelismCandidate Evaluate(const v1::JobConfig& base, const std::vector<MiniBatch>& sample,
                              const ParallelismLayout& layout, uint32_t gpus_per_node,
                              bool sequence_parallel) {
  if (layout.tensor > gpus_per_node) {
    ParallelismCandidate c;
    c.layout = layout;
    c.reason =
        absl::StrCat("its tensor groups of ", layout.tensor, " span nodes of ", gpus_per_node,
                     " GPUs: every layer's all-reduces would cross the inter-node link");
    return c;
  }
  if (layout.context * layout.tensor > gpus_per_node) {
    ParallelismCandidate c;
    c.layout = layout;
    c.reason = absl::StrCat("its context groups of ", layout.context, " x ", layout.tensor,
                            " GPUs span nodes of ", gpus_per_node,
                            " GPUs: every layer's key/value all-gather would cross the "
                            "inter-node link");
    return c;
  }
  ParallelismCandidate c = Plan(base, sample, layout, sequence_parallel, v1::PER_MICRO_BATCH);
  if (layout.context > 1) {
    // Static context parallelism on the same layout, as the peers run it.
    const ParallelismCandidate always = Plan(base, sample, layout, sequence_parallel, v1::ALWAYS);
    c.static_feasible = always.feasible;
    c.static_reason = always.reason;
    c.static_tokens_per_second = always.tokens_per_second;
  }
  return c;
}

}  // namespace

std::string ParallelismLayout::ToString() const {
  if (context > 1) return absl::StrCat("t", tensor, " c", context, " p", pipeline, " d", data);
  return absl::StrCat("t", tensor, " p", pipeline, " d", data);
}

absl::StatusOr<std::vector<ParallelismCandidate>> SearchParallelism(
    const v1::JobConfig& base, const std::vector<MiniBatch>& sample,
    const ParallelismSearchOptions& options) {
  if (options.gpus == 0) return absl::InvalidArgumentError("--gpus must be at least 1");
  const uint32_t per_node = options.gpus_per_node > 0
                                ? options.gpus_per_node
                                : std::max(1u, base.cluster().devices_per_node());
  // T5 has no context parallelism (config validation refuses it): c = 1.
  std::vector<uint32_t> degrees;
  for (uint32_t c : options.context_degrees) {
    if (c >= 1 && (c == 1 || base.model().kind() != v1::T5) &&
        std::find(degrees.begin(), degrees.end(), c) == degrees.end()) {
      degrees.push_back(c);
    }
  }
  if (degrees.empty()) degrees.push_back(1);
  std::sort(degrees.begin(), degrees.end());
  std::vector<ParallelismCandidate> out;
  for (uint32_t t = 1; t <= options.gpus; ++t) {
    if (options.gpus % t != 0) continue;
    for (uint32_t c : degrees) {
      if ((options.gpus / t) % c != 0) continue;
      const uint32_t rest = options.gpus / t / c;
      for (uint32_t p = 1; p <= rest; ++p) {
        if (rest % p != 0) continue;
        const ParallelismLayout layout{.tensor = t, .pipeline = p, .data = rest / p, .context = c};
        out.push_back(Evaluate(base, sample, layout, per_node, options.sequence_parallel));
        if (options.progress) options.progress(out.back());
      }
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ParallelismCandidate& a, const ParallelismCandidate& b) {
                     if (a.feasible != b.feasible) return a.feasible;
                     return a.feasible && a.tokens_per_second > b.tokens_per_second;
                   });
  return out;
}

}  // namespace varipipe::planner
