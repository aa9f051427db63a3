// Assigning micro-batches to data-parallel replicas (DynaPipe section 4,
// "Balance data parallel model replicas"): minimise the largest total
// predicted time of any replica (multiway number partitioning, NP-hard).
//
// Two heuristics run and the better assignment is kept:
//   - Karmarkar-Karp's differencing method generalised to k subsets
//     (Karmarkar & Karp 1982; the "complete" k-way form of Korf 2009 without
//     the search): repeatedly merge the two partial partitions whose spread
//     (largest minus smallest subset sum) is largest, pairing the largest
//     subset of one with the smallest of the other.
//   - Greedy largest-first (LPT): each item, longest first, to the currently
//     lightest replica.
// The result is never worse than greedy largest-first.
#ifndef VARIPIPE_PLANNER_MICROBATCH_DP_BALANCE_H_
#define VARIPIPE_PLANNER_MICROBATCH_DP_BALANCE_H_

#include <cstdint>
#include <span>
#include <vector>

namespace varipipe::planner {

struct ReplicaAssignment {
  // replicas[d] = indices of the items assigned to replica d, ascending.
  std::vector<std::vector<uint32_t>> replicas;
  // Largest replica sum.
  double makespan = 0;
  // "karmarkar-karp" or "greedy" (which heuristic won; ties go to KK).
  const char* method = "";
};

// REQUIRES: replicas >= 1, times non-negative and finite. Deterministic.
ReplicaAssignment BalanceReplicas(std::span<const double> times, uint32_t replicas);
ReplicaAssignment KarmarkarKarp(std::span<const double> times, uint32_t replicas);
ReplicaAssignment GreedyLargestFirst(std::span<const double> times, uint32_t replicas);

// Largest replica sum of an assignment.
double Makespan(std::span<const double> times, const std::vector<std::vector<uint32_t>>& replicas);

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_MICROBATCH_DP_BALANCE_H_
