#include "planner/microbatch/sample_order.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <utility>

#include "planner/microbatch/baselines.h"

namespace varipipe::planner {
namespace {

int64_t L1(const SampleLengths& a, const SampleLengths& b) {
  return std::llabs(static_cast<int64_t>(a.input) - b.input) +
         std::llabs(static_cast<int64_t>(a.target) - b.target);
}

struct Cell {
  SampleLengths centre;           // mean lengths of its samples
  std::vector<uint32_t> members;  // longest first
};

// Reverses tour[i..j] whenever that shortens the open path; repeats until no
// move helps or the round budget is spent. O(C^2) per round.
void TwoOpt(const std::vector<Cell>& cells, std::vector<int>& tour) {
  const int n = static_cast<int>(tour.size());
  const auto d = [&](int a, int b) { return L1(cells[tour[a]].centre, cells[tour[b]].centre); };
  for (int round = 0; round < 50; ++round) {
    bool improved = false;
    for (int i = 1; i < n - 1; ++i) {
      for (int j = i + 1; j < n; ++j) {
        // Replace edges (i-1, i) and (j, j+1) by (i-1, j) and (i, j+1).
        const int64_t before = d(i - 1, i) + (j + 1 < n ? d(j, j + 1) : 0);
        const int64_t after = d(i - 1, j) + (j + 1 < n ? d(i, j + 1) : 0);
        if (after < before) {
          std::reverse(tour.begin() + i, tour.begin() + j + 1);
          improved = true;
        }
      }
    }
    if (!improved) return;
  }
}

std::vector<uint32_t> TwoDTour(std::span<const SampleLengths> samples, uint32_t cell_size,
                               const LengthPolicy& policy) {
  // Cells keyed by (input / cell, target / cell); std::map keeps iteration
  // deterministic.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>> by_cell;
  for (uint32_t i : SortedByLength(samples, policy)) {
    by_cell[{samples[i].input / cell_size, samples[i].target / cell_size}].push_back(i);
  }
  std::vector<Cell> cells;
  for (auto& [key, members] : by_cell) {
    uint64_t input = 0;
    uint64_t target = 0;
    for (uint32_t i : members) {
      input += samples[i].input;
      target += samples[i].target;
    }
    cells.push_back({{static_cast<uint32_t>(input / members.size()),
                      static_cast<uint32_t>(target / members.size())},
                     std::move(members)});
  }
  // Nearest neighbour from the cell with the longest input (then target).
  int start = 0;
  for (int c = 1; c < static_cast<int>(cells.size()); ++c) {
    const SampleLengths& a = cells[c].centre;
    const SampleLengths& b = cells[start].centre;
    if (a.input > b.input || (a.input == b.input && a.target > b.target)) start = c;
  }
  std::vector<int> tour = {start};
  std::vector<bool> used(cells.size(), false);
  used[start] = true;
  for (size_t step = 1; step < cells.size(); ++step) {
    int best = -1;
    int64_t best_distance = 0;
    for (int c = 0; c < static_cast<int>(cells.size()); ++c) {
      if (used[c]) continue;
      const int64_t distance = L1(cells[tour.back()].centre, cells[c].centre);
      if (best < 0 || distance < best_distance) {
        best = c;
        best_distance = distance;
      }
    }
    used[best] = true;
    tour.push_back(best);
  }
  TwoOpt(cells, tour);
  std::vector<uint32_t> order;
  order.reserve(samples.size());
  for (int c : tour) order.insert(order.end(), cells[c].members.begin(), cells[c].members.end());
  return order;
}

}  // namespace

std::vector<uint32_t> OrderSamples(std::span<const SampleLengths> samples,
                                   const LengthPolicy& policy, SampleOrder order, uint32_t cell) {
  if (order == SampleOrder::kTwoDTour && policy.encoder_decoder && !samples.empty()) {
    return TwoDTour(samples, std::max<uint32_t>(1, cell), policy);
  }
  return SortedByLength(samples, policy);
}

uint64_t OrderPathLength(std::span<const SampleLengths> samples, std::span<const uint32_t> order) {
  uint64_t length = 0;
  for (size_t k = 1; k < order.size(); ++k) {
    length += static_cast<uint64_t>(L1(samples[order[k - 1]], samples[order[k]]));
  }
  return length;
}

}  // namespace varipipe::planner
