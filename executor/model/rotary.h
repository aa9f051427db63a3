// Rotary position embeddings of LLAMA layers (Su et al. 2021, in Hugging
// Face's rotate_half layout; docs/models.md): a head vector u = [u1, u2]
// (halves) at position p becomes u * cos + [-u2, u1] * sin, with the angles
// p * inv_freq_j (j < d/2) repeated over both halves.
#ifndef VARIPIPE_EXECUTOR_MODEL_ROTARY_H_
#define VARIPIPE_EXECUTOR_MODEL_ROTARY_H_

#include <torch/torch.h>

#include <vector>

#include "executor/model/model_spec.h"

namespace varipipe::executor {

// inv_freq_j = theta^(-2j/d) for j < d/2 (d = spec.kv_channels), with Llama
// 3.1's scaling when spec.rope_factor > 0.
std::vector<double> RotaryInverseFrequencies(const ModelSpec& spec);

// cos and sin of every position's angles, stacked: [2, B, s, d] (fp32, on
// positions' device) for positions [B, s] (int64; B may be 1 to broadcast).
torch::Tensor RotaryTable(const ModelSpec& spec, const torch::Tensor& positions);

// Positions 0..length-1 of one unpacked row, [1, length], on `device`.
torch::Tensor SequentialPositions(int64_t length, torch::Device device);

// Rotates x [b, s, heads * d] by `table` ([2, B, s, d], RotaryTable).
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& table, int64_t heads);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_ROTARY_H_
