#include "executor/model/initializer.h"

#include <ATen/CPUGeneratorImpl.h>

namespace varipipe::executor {
namespace {

// SplitMix64 finaliser: spreads (seed, component, index) over 64 bits.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Initializer::Initializer(uint64_t seed, ModelComponent component, int64_t index)
    : generator_(at::make_generator<at::CPUGeneratorImpl>(
          Mix(Mix(seed) ^ (static_cast<uint64_t>(component) << 48) ^
              static_cast<uint64_t>(index)))) {}

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
