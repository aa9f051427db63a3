#include "common/dataset/synthetic_mixture.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numbers>

#include "common/mix64.h"

namespace varipipe {
namespace {

// Uniform in (0, 1) from the top 53 bits; never 0, so log() is finite.
double UnitOpen(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// A standard normal deviate from two uniforms (Box-Muller). Written out
// instead of std::normal_distribution, whose output differs between
// standard libraries.
double StandardNormal(uint64_t a, uint64_t b) {
  return std::sqrt(-2.0 * std::log(UnitOpen(a))) * std::cos(2.0 * std::numbers::pi * UnitOpen(b));
}

uint32_t LogNormalLength(double median, double sigma, double z) {
  const double value = std::round(median * std::exp(sigma * z));
  return static_cast<uint32_t>(std::clamp(value, 1.0, 4.0e9));
}

}  // namespace

SyntheticMixture SyntheticMixture::Flan(uint64_t seed) {
  return SyntheticMixture(
      {
          {"classification", 0.35, 80, 0.6, 2, 0.3},
          {"qa", 0.25, 150, 0.7, 8, 0.6},
          {"translation", 0.15, 40, 0.5, 45, 0.5},
          {"summarization", 0.15, 600, 0.8, 60, 0.5},
          {"long_context", 0.10, 1500, 0.9, 120, 0.6},
      },
      seed);
}

SyntheticMixture SyntheticMixture::Documents(uint64_t seed) {
  return SyntheticMixture(
      {
          {"short", 0.61, 38, 0.7, 3, 0.5},
          {"medium", 0.30, 160, 0.8, 10, 0.6},
          {"long", 0.09, 720, 1.15, 30, 0.7},
      },
      seed);
}

SyntheticMixture SyntheticMixture::LongTail(uint64_t seed) {
  return SyntheticMixture(
      {
          {"short", 0.62, 700, 0.9, 120, 0.7},
          {"medium", 0.28, 3000, 0.7, 250, 0.6},
          {"long", 0.08, 12000, 0.5, 400, 0.5},
          {"very_long", 0.02, 36000, 0.35, 600, 0.5},
      },
      seed);
}

SyntheticMixture SyntheticMixture::Named(const std::string& name, uint64_t seed) {
  if (name == "documents") return Documents(seed);
  if (name == "long_tail") return LongTail(seed);
  return Flan(seed);
}

SyntheticMixture::SyntheticMixture(std::vector<SyntheticTask> tasks, uint64_t seed)
    : tasks_(std::move(tasks)), seed_(seed) {
  assert(!tasks_.empty());
  double total = 0;
  for (const SyntheticTask& task : tasks_) total += task.weight;
  assert(total > 0);
  double running = 0;
  for (const SyntheticTask& task : tasks_) {
    running += task.weight;
    cumulative_weight_.push_back(running / total);
  }
  cumulative_weight_.back() = 1.0;
}

int SyntheticMixture::TaskOf(uint64_t index) const {
  const double u = UnitOpen(Mix64(Mix64(seed_) ^ (4 * index)));
  const auto it = std::lower_bound(cumulative_weight_.begin(), cumulative_weight_.end(), u);
  return static_cast<int>(std::min<size_t>(it - cumulative_weight_.begin(), tasks_.size() - 1));
}

SampleLengths SyntheticMixture::Sample(uint64_t index) const {
  const uint64_t key = Mix64(seed_);
  const SyntheticTask& task = tasks_[TaskOf(index)];
  const double z_input = StandardNormal(Mix64(key ^ (4 * index + 1)), Mix64(key ^ (4 * index + 2)));
  const double z_target =
      StandardNormal(Mix64(key ^ (4 * index + 3)), Mix64(~key ^ (4 * index + 3)));
  return {LogNormalLength(task.input_median, task.input_sigma, z_input),
          LogNormalLength(task.target_median, task.target_sigma, z_target)};
}

}  // namespace varipipe
