#include "planner/microbatch/dp_balance.h"

#include <algorithm>
#include <numeric>
#include <queue>

namespace varipipe::planner {
namespace {

// A partial partition: k subsets sorted by sum, largest first.
struct Partial {
  std::vector<double> sums;
  std::vector<std::vector<uint32_t>> items;
  uint32_t id = 0;  // creation order, for deterministic tie-breaking
  double spread() const { return sums.front() - sums.back(); }
};

struct BySpread {
  bool operator()(const Partial* a, const Partial* b) const {
    if (a->spread() != b->spread()) return a->spread() < b->spread();
    return a->id > b->id;
  }
};

void SortBySum(Partial& p) {
  std::vector<size_t> idx(p.sums.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return p.sums[a] > p.sums[b]; });
  Partial sorted;
  for (size_t i : idx) {
    sorted.sums.push_back(p.sums[i]);
    sorted.items.push_back(std::move(p.items[i]));
  }
  p.sums = std::move(sorted.sums);
  p.items = std::move(sorted.items);
}

ReplicaAssignment Finish(std::span<const double> times, std::vector<std::vector<uint32_t>> sets,
                         uint32_t replicas, const char* method) {
  sets.resize(replicas);
  for (auto& s : sets) std::sort(s.begin(), s.end());
  // Canonical order: by smallest item index, empty replicas last.
  std::sort(sets.begin(), sets.end(), [](const auto& a, const auto& b) {
    if (a.empty() != b.empty()) return !a.empty();
    return !a.empty() && a.front() < b.front();
  });
  ReplicaAssignment result;
  result.makespan = Makespan(times, sets);
  result.replicas = std::move(sets);
  result.method = method;
  return result;
}

}  // namespace

double Makespan(std::span<const double> times, const std::vector<std::vector<uint32_t>>& replicas) {
  double makespan = 0;
  for (const auto& r : replicas) {
    double sum = 0;
    for (uint32_t i : r) sum += times[i];
    makespan = std::max(makespan, sum);
  }
  return makespan;
}

ReplicaAssignment KarmarkarKarp(std::span<const double> times, uint32_t replicas) {
  const uint32_t k = std::max<uint32_t>(1, replicas);
  std::vector<Partial> storage;
  storage.reserve(2 * times.size() + 1);
  std::priority_queue<Partial*, std::vector<Partial*>, BySpread> heap;
  uint32_t next_id = 0;
  for (uint32_t i = 0; i < times.size(); ++i) {
    Partial p;
    p.sums.assign(k, 0.0);
    p.items.assign(k, {});
    p.sums[0] = times[i];
    p.items[0] = {i};
    p.id = next_id++;
    storage.push_back(std::move(p));
  }
  for (Partial& p : storage) heap.push(&p);
  while (heap.size() > 1) {
    Partial* a = heap.top();
    heap.pop();
    Partial* b = heap.top();
    heap.pop();
    // Largest subset of a with smallest of b, and so on.
    Partial merged;
    merged.sums.resize(k);
    merged.items.resize(k);
    for (uint32_t j = 0; j < k; ++j) {
      merged.sums[j] = a->sums[j] + b->sums[k - 1 - j];
      merged.items[j] = std::move(a->items[j]);
      merged.items[j].insert(merged.items[j].end(), b->items[k - 1 - j].begin(),
                             b->items[k - 1 - j].end());
    }
    SortBySum(merged);
    merged.id = next_id++;
    storage.push_back(std::move(merged));
    heap.push(&storage.back());
  }
  std::vector<std::vector<uint32_t>> sets;
  if (!heap.empty()) sets = std::move(heap.top()->items);
  return Finish(times, std::move(sets), k, "karmarkar-karp");
}

ReplicaAssignment GreedyLargestFirst(std::span<const double> times, uint32_t replicas) {
  const uint32_t k = std::max<uint32_t>(1, replicas);
  std::vector<uint32_t> order(times.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return times[a] > times[b]; });
  std::vector<std::vector<uint32_t>> sets(k);
  std::vector<double> sums(k, 0.0);
  for (uint32_t i : order) {
    const size_t lightest = std::min_element(sums.begin(), sums.end()) - sums.begin();
    sets[lightest].push_back(i);
    sums[lightest] += times[i];
  }
  return Finish(times, std::move(sets), k, "greedy");
}

ReplicaAssignment BalanceReplicas(std::span<const double> times, uint32_t replicas) {
  if (replicas == 1) {
    // One replica holds everything: what both heuristics give, without
    // their work (the planner balances every candidate pair).
    ReplicaAssignment one;
    one.replicas.emplace_back(times.size());
    std::iota(one.replicas[0].begin(), one.replicas[0].end(), 0u);
    for (double t : times) one.makespan += t;
    one.method = "karmarkar-karp";
    return one;
  }
  ReplicaAssignment kk = KarmarkarKarp(times, replicas);
  ReplicaAssignment greedy = GreedyLargestFirst(times, replicas);
  return greedy.makespan < kk.makespan ? greedy : kk;
}

}  // namespace varipipe::planner
