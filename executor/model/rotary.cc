#include "executor/model/rotary.h"

#include <cmath>
#include <numbers>

namespace varipipe::executor {

std::vector<double> RotaryInverseFrequencies(const ModelSpec& spec) {
  const int64_t d = spec.kv_channels;
  std::vector<double> inv(static_cast<size_t>(d / 2));
  for (int64_t j = 0; j < d / 2; ++j) {
    double f = std::pow(spec.rope_theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
    if (spec.rope_factor > 0) {
      // Llama 3.1: long wavelengths slowed by the factor, short ones kept,
      // a linear blend in between.
      const double wavelength = 2 * std::numbers::pi / f;
      const double low_wavelength = spec.rope_original_max_positions / spec.rope_low_freq_factor;
      const double high_wavelength = spec.rope_original_max_positions / spec.rope_high_freq_factor;
      if (wavelength > low_wavelength) {
        f /= spec.rope_factor;
      } else if (wavelength >= high_wavelength) {
        const double smooth = (spec.rope_original_max_positions / wavelength -
                               spec.rope_low_freq_factor) /
                              (spec.rope_high_freq_factor - spec.rope_low_freq_factor);
        f = (1 - smooth) * f / spec.rope_factor + smooth * f;
      }
    }
    inv[static_cast<size_t>(j)] = f;
  }
  return inv;
}

torch::Tensor RotaryTable(const ModelSpec& spec, const torch::Tensor& positions) {
  const std::vector<double> inv = RotaryInverseFrequencies(spec);
  const torch::Tensor frequencies =
      torch::tensor(inv, torch::kFloat64).to(torch::kFloat32).to(positions.device());
  const torch::Tensor angles = positions.to(torch::kFloat32).unsqueeze(-1) * frequencies;
  const torch::Tensor both = torch::cat({angles, angles}, -1);
  return torch::stack({both.cos(), both.sin()});
}

torch::Tensor SequentialPositions(int64_t length, torch::Device device) {
  return torch::arange(length, torch::TensorOptions().dtype(torch::kInt64).device(device))
      .unsqueeze(0);
}

torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& table, int64_t heads) {
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const int64_t d = x.size(2) / heads;
  const torch::Tensor u = x.reshape({b, s, heads, d});
  const torch::Tensor cos = table[0].unsqueeze(2).to(u.scalar_type());
  const torch::Tensor sin = table[1].unsqueeze(2).to(u.scalar_type());
  const torch::Tensor rotated =
      torch::cat({-u.narrow(-1, d / 2, d / 2), u.narrow(-1, 0, d / 2)}, -1);
  return (u * cos + rotated * sin).reshape({b, s, heads * d});
}

}  // namespace varipipe::executor
