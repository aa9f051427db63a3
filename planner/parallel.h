// ParallelFor: the planner's per-replica fan-out (planner.threads).
//
// Runs fn(i) for every i in [0, n) exactly once on up to `threads` threads,
// the caller's included, and returns when all have finished. Callers write
// each index's result into its own slot and combine slots in index order, so
// results do not depend on the thread count. Inline when threads <= 1 or
// n <= 1.
#ifndef VARIPIPE_PLANNER_PARALLEL_H_
#define VARIPIPE_PLANNER_PARALLEL_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace varipipe::planner {

inline void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  if (threads <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  const size_t helpers = std::min<size_t>(static_cast<size_t>(threads), n) - 1;
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace varipipe::planner

#endif  // VARIPIPE_PLANNER_PARALLEL_H_
