#include "common/metrics/metric_registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace varipipe::metrics {
namespace {

// Sample values: Prometheus' spellings of the special values, else the
// shortest exact decimal.
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} plus an optional extra label (le=...); "" without labels.
std::string LabelText(const Labels& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t k = 0; k < labels.size(); ++k) {
    absl::StrAppend(&out, k > 0 ? "," : "", labels[k].first, "=\"",
                    EscapeLabelValue(labels[k].second), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, labels.empty() ? "" : ",", extra);
  return out + "}";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  for (int k = 0; k < count; ++k) bounds.push_back(start * std::pow(factor, k));
  return bounds;
}

Registry& Registry::Default() {
  static Registry* registry = new Registry();
  return *registry;
}

bool Registry::ValidName(const std::string& name, bool label) {
  if (name.empty()) return false;
  for (size_t k = 0; k < name.size(); ++k) {
    const char c = name[k];
    const bool ok = absl::ascii_isalpha(c) || c == '_' || (!label && c == ':') ||
                    (k > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return !(label && name.rfind("__", 0) == 0);
}

Registry::Family* Registry::FamilyFor(const std::string& name, const std::string& help, Type type,
                                      const Labels& labels, const std::vector<double>& bounds) {
  bool valid = ValidName(name);
  for (const auto& [label, value] : labels) {
    valid = valid && ValidName(label, /*label=*/true) && label != "le";
  }
  if (!valid) {
    spdlog::error("metrics: invalid metric or label name in '{}'; not exported", name);
    return nullptr;
  }
  auto [it, inserted] = families_.try_emplace(name);
  Family& family = it->second;
  if (inserted) {
    family.type = type;
    family.help = help;
    family.bounds = bounds;
    std::sort(family.bounds.begin(), family.bounds.end());
    family.bounds.erase(std::unique(family.bounds.begin(), family.bounds.end()),
                        family.bounds.end());
  } else if (family.type != type) {
    spdlog::error("metrics: '{}' registered again with another type; not exported", name);
    return nullptr;
  }
  return &family;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyFor(name, help, Type::kCounter, labels, {});
  if (family == nullptr) return dummy_counter_;
  std::unique_ptr<Counter>& slot = family->counters[labels];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyFor(name, help, Type::kGauge, labels, {});
  if (family == nullptr) return dummy_gauge_;
  std::unique_ptr<Gauge>& slot = family->gauges[labels];
  if (slot == nullptr) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Family* family = FamilyFor(name, help, Type::kHistogram, labels, bounds);
  if (family == nullptr) return dummy_histogram_;
  std::unique_ptr<Histogram>& slot = family->histograms[labels];
  if (slot == nullptr) slot = std::make_unique<Histogram>(family->bounds);
  return *slot;
}

int Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_[next_collector_] = std::move(collect);
  return next_collector_++;
}

void Registry::RemoveCollector(int id) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_.erase(id);
}

std::string Registry::Render() {
  {
    absl::MutexLock lock(&collectors_mu_);
    for (auto& [id, collect] : collectors_) collect();
  }
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kCounter ? "counter"
                       : family.type == Type::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [labels, counter] : family.counters) {
      absl::StrAppend(&out, name, LabelText(labels), " ", Number(counter->value()), "\n");
    }
    for (const auto& [labels, gauge] : family.gauges) {
      absl::StrAppend(&out, name, LabelText(labels), " ", Number(gauge->value()), "\n");
    }
    for (const auto& [labels, histogram] : family.histograms) {
      const Histogram::Snapshot s = histogram->Read();
      for (size_t k = 0; k < s.cumulative.size(); ++k) {
        const std::string le = k < s.bounds.size() ? Number(s.bounds[k]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", LabelText(labels, absl::StrCat("le=\"", le, "\"")),
                        " ", s.cumulative[k], "\n");
      }
      absl::StrAppend(&out, name, "_sum", LabelText(labels), " ", Number(s.sum), "\n");
      absl::StrAppend(&out, name, "_count", LabelText(labels), " ", s.count, "\n");
    }
  }
  return out;
}

}  // namespace varipipe::metrics
