// Metrics in Prometheus' data model (counters, gauges, histograms with
// labels) and their text exposition format (version 0.0.4), for the
// --metrics_listen endpoints of the planner daemon and the executor
// (common/metrics/metrics_http_server.h, docs/operations.md).
//
//   Registry& r = Registry::Default();
//   r.GetCounter("varipipe_planner_planned_iterations_total", "Iterations planned.",
//                {{"job", job}}).Increment();
//   std::string text = r.Render();
//
// Invariants: a metric's name and label names match Prometheus' grammar
// (checked when registered: a bad one is replaced by a metric that records
// nothing and is never rendered); one name has one type, help text and
// bucket layout; the objects Get* return live as long as the registry.
// Counters only go up. Thread safety: everything may be called from any
// thread.
#ifndef VARIPIPE_COMMON_METRICS_METRIC_REGISTRY_H_
#define VARIPIPE_COMMON_METRICS_METRIC_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace varipipe::metrics {

// (name, value) pairs; rendered in the order given.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  // REQUIRES: amount >= 0 (negative amounts are ignored).
  void Increment(double amount = 1) {
    if (amount > 0) value_.fetch_add(amount, std::memory_order_relaxed);
  }
  // Raises the counter to `total` when that is more (for totals kept
  // elsewhere, e.g. in the instruction store); never lowers it.
  void RaiseTo(double total) {
    double now = value_.load(std::memory_order_relaxed);
    while (total > now && !value_.compare_exchange_weak(now, total)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending (+Inf is implicit).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bucket bounds start, start * factor, ... (`count` of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class Registry {
 public:
  // The process's registry, which the endpoints serve.
  static Registry& Default();

  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels);
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels);
  // The first registration of `name` fixes its buckets.
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels);

  // Runs before every Render (to refresh gauges from a status snapshot);
  // the id removes it. Collectors must not call AddCollector/RemoveCollector.
  int AddCollector(std::function<void()> collect);
  void RemoveCollector(int id);

  // Every metric in the text exposition format, families sorted by name.
  std::string Render();

  // True when `name` is a valid metric (or, with label = true, label) name.
  static bool ValidName(const std::string& name, bool label = false);

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type = Type::kCounter;
    std::string help;
    std::vector<double> bounds;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family* FamilyFor(const std::string& name, const std::string& help, Type type,
                    const Labels& labels, const std::vector<double>& bounds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex collectors_mu_;
  std::map<int, std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  int next_collector_ ABSL_GUARDED_BY(collectors_mu_) = 0;

  absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  // Where metrics with invalid names or a clashing type go.
  Counter dummy_counter_;
  Gauge dummy_gauge_;
  Histogram dummy_histogram_{{}};
};

}  // namespace varipipe::metrics

#endif  // VARIPIPE_COMMON_METRICS_METRIC_REGISTRY_H_
