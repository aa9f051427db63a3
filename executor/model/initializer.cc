#include "executor/model/initializer.h"

#include <ATen/CPUGeneratorImpl.h>

#include "common/mix64.h"

namespace varipipe::executor {

// SplitMix64 spreads (seed, component, index) over 64 bits.
Initializer::Initializer(uint64_t seed, ModelComponent component, int64_t index)
    : generator_(at::make_generator<at::CPUGeneratorImpl>(Mix64(
          Mix64(seed) ^ (static_cast<uint64_t>(component) << 48) ^ static_cast<uint64_t>(index)))) {
}

torch::Tensor Initializer::Normal(at::IntArrayRef shape, double stddev) {
  return at::normal(0.0, stddev, shape, generator_, torch::TensorOptions().dtype(torch::kFloat32));
}

torch::Tensor Initializer::Zeros(at::IntArrayRef shape) {
  return torch::zeros(shape, torch::TensorOptions().dtype(torch::kFloat32));
}

torch::Tensor Initializer::Ones(at::IntArrayRef shape) {
  return torch::ones(shape, torch::TensorOptions().dtype(torch::kFloat32));
}

}  // namespace varipipe::executor
