#include "planner/microbatch/context_placement.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace varipipe::planner {

uint32_t LanePlacement::split_count() const {
  return static_cast<uint32_t>(std::count(split.begin(), split.end(), true));
}

double LanePlacement::busiest_lane_ms() const {
  return lane_ms.empty() ? 0 : *std::max_element(lane_ms.begin(), lane_ms.end());
}

LanePlacement PlaceOnLanes(std::span<const bool> split, std::span<const double> whole_ms,
                           std::span<const double> split_ms, uint32_t lanes) {
  const size_t n = split.size();
  LanePlacement out;
  out.lanes = lanes;
  out.split.assign(split.begin(), split.end());
  out.lane.assign(n, 0);
  double split_total = 0;
  std::vector<uint32_t> splits;
  std::vector<uint32_t> wholes;
  for (uint32_t i = 0; i < n; ++i) {
    if (split[i]) {
      split_total += split_ms[i];
      splits.push_back(i);
    } else {
      wholes.push_back(i);
    }
  }
  out.lane_ms.assign(lanes, split_total);
  // Longest processing time first; ties: lower index.
  std::vector<uint32_t> by_time = wholes;
  std::stable_sort(by_time.begin(), by_time.end(),
                   [&](uint32_t a, uint32_t b) { return whole_ms[a] > whole_ms[b]; });
  for (uint32_t i : by_time) {
    const uint32_t k = static_cast<uint32_t>(
        std::min_element(out.lane_ms.begin(), out.lane_ms.end()) - out.lane_ms.begin());
    out.lane[i] = k;
    out.lane_ms[k] += whole_ms[i];
  }
  // Each lane's whole micro-batches in index order; slot j holds every
  // lane's j-th.
  std::vector<std::vector<int>> per_lane(lanes);
  for (uint32_t i : wholes) per_lane[out.lane[i]].push_back(static_cast<int>(i));
  size_t whole_slots = 0;
  for (const auto& mine : per_lane) whole_slots = std::max(whole_slots, mine.size());
  // Split slot i at (i + 1/2) / S, whole slot j at (j + 1/2) / W: compare
  // (2i + 1) W with (2j + 1) S in integers.
  const size_t s_count = splits.size();
  size_t i = 0;
  size_t j = 0;
  while (i < s_count || j < whole_slots) {
    const bool take_split =
        j >= whole_slots || (i < s_count && (2 * i + 1) * whole_slots <= (2 * j + 1) * s_count);
    ContextSlot slot;
    if (take_split) {
      slot.split = static_cast<int>(splits[i++]);
    } else {
      slot.by_lane.assign(lanes, -1);
      for (uint32_t k = 0; k < lanes; ++k) {
        if (j < per_lane[k].size()) slot.by_lane[k] = per_lane[k][j];
      }
      ++j;
    }
    out.slots.push_back(std::move(slot));
  }
  return out;
}

double PredictedGroupMs(const LanePlacement& placement, std::span<const double> whole_ms,
                        std::span<const double> split_ms, uint32_t pipeline) {
  const double p = std::max(1u, pipeline);
  double longest = 0;
  for (size_t i = 0; i < placement.split.size(); ++i) {
    longest = std::max(longest, placement.split[i] ? split_ms[i] : whole_ms[i]);
  }
  return placement.busiest_lane_ms() / p + (p - 1) / p * longest;
}

bool ChooseSplits(v1::ContextSplitPolicy policy, std::span<const SplitOption> options,
                  uint32_t lanes, uint32_t pipeline, std::vector<bool>* split, std::string* why) {
  const size_t n = options.size();
  split->assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const SplitOption& o = options[i];
    const bool can_whole = o.fits_whole && policy != v1::ALWAYS;
    const bool can_split = o.fits_split && policy != v1::NEVER;
    if (!can_whole && !can_split) {
      *why = absl::StrCat("micro-batch ", i, " fits one lane's memory neither ",
                          policy == v1::ALWAYS  ? "split (parallelism.context_split is ALWAYS)"
                          : policy == v1::NEVER ? "whole (parallelism.context_split is NEVER)"
                                                : "whole nor split");
      return false;
    }
    (*split)[i] = !can_whole;
  }
  if (policy != v1::PER_MICRO_BATCH || lanes <= 1) return true;
  std::vector<double> whole_ms(n);
  std::vector<double> split_ms(n);
  for (size_t i = 0; i < n; ++i) {
    whole_ms[i] = options[i].whole_ms;
    split_ms[i] = options[i].split_ms;
  }
  // std::vector<bool> has no contiguous storage: spans over a copy.
  const std::unique_ptr<bool[]> flags(new bool[n]);
  const auto predicted = [&](const std::vector<bool>& s) {
    for (size_t i = 0; i < n; ++i) flags[i] = s[i];
    const LanePlacement placement =
        PlaceOnLanes(std::span<const bool>(flags.get(), n), whole_ms, split_ms, lanes);
    return PredictedGroupMs(placement, whole_ms, split_ms, pipeline);
  };
  // The k longest (by whole time; ties: lower index) that fit split, for
  // every k: the best k (the smallest on a tie).
  std::vector<size_t> by_time(n);
  std::iota(by_time.begin(), by_time.end(), 0);
  std::stable_sort(by_time.begin(), by_time.end(),
                   [&](size_t a, size_t b) { return whole_ms[a] > whole_ms[b]; });
  std::vector<bool> current = *split;
  std::vector<bool> best_split = current;
  double best = predicted(current);
  for (size_t i : by_time) {
    if (current[i] || !options[i].fits_split) continue;
    current[i] = true;
    const double t = predicted(current);
    if (t < best * (1 - 1e-9)) {
      best = t;
      best_split = current;
    }
  }
  *split = std::move(best_split);
  return true;
}

}  // namespace varipipe::planner
