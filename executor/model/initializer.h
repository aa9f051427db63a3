// Deterministic parameter initialisation: every component of the model
// (embedding, layer i, head) draws its parameters from its own generator,
// seeded from the job seed and the component's global identity, so any
// pipeline partitioning of the same model starts from identical parameters.
// Draws happen on the CPU in fp32 and are moved to the device afterwards, so
// CPU and GPU executors agree too.
#ifndef VARIPIPE_EXECUTOR_MODEL_INITIALIZER_H_
#define VARIPIPE_EXECUTOR_MODEL_INITIALIZER_H_

#include <cstdint>

#include <torch/torch.h>

namespace varipipe::executor {

enum class ModelComponent : uint32_t {
  kEmbedding = 1,
  kEncoderLayer = 2,  // GPT layers and T5 encoder layers
  kDecoderLayer = 3,  // T5 decoder layers
  kHead = 4,
  kPositionBias = 5,  // T5V11's relative bias tables: 0 encoder, 1 decoder
};

class Initializer {
 public:
  Initializer(uint64_t seed, ModelComponent component, int64_t index);

  // N(0, stddev^2), fp32, on the CPU.
  torch::Tensor Normal(at::IntArrayRef shape, double stddev);
  static torch::Tensor Zeros(at::IntArrayRef shape);
  static torch::Tensor Ones(at::IntArrayRef shape);

 private:
  at::Generator generator_;
};

// Megatron-LM's initialisation: weights N(0, 0.02^2); output projections of
// residual branches scaled by 1/sqrt(2 * total layers).
inline constexpr double kInitStddev = 0.02;

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_INITIALIZER_H_
