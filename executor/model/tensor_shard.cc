#include "executor/model/tensor_shard.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace varipipe::executor {

TensorShard ShardOfParameter(std::string_view name) {
  const size_t dot = name.rfind('.');
  const std::string_view leaf = dot == std::string_view::npos ? name : name.substr(dot + 1);
  // Column-parallel: output rows (dim 0); row-parallel: input columns (dim 1).
  static const auto* const kShards = new absl::flat_hash_map<std::string_view, TensorShard>{
      // MEGATRON layers.
      {"qkv_weight", {0, 3}},
      {"qkv_bias", {0, 3}},
      {"proj_weight", {1, 1}},
      {"xq_weight", {0, 1}},
      {"xq_bias", {0, 1}},
      {"xkv_weight", {0, 2}},
      {"xkv_bias", {0, 2}},
      {"xproj_weight", {1, 1}},
      {"fc1_weight", {0, 1}},
      {"fc1_bias", {0, 1}},
      {"fc2_weight", {1, 1}},
      // LLAMA and T5V11 layers (T5V11 decoders also xq_weight above).
      {"q_weight", {0, 1}},
      {"k_weight", {0, 1}},
      {"v_weight", {0, 1}},
      {"o_weight", {1, 1}},
      {"xk_weight", {0, 1}},
      {"xv_weight", {0, 1}},
      {"xo_weight", {1, 1}},
      {"gate_weight", {0, 1}},
      {"up_weight", {0, 1}},
      {"down_weight", {1, 1}},
      // Vocabulary-parallel embeddings and head; per-head bias tables.
      {"word_embedding", {0, 1}},
      {"decoder_word_embedding", {0, 1}},
      {"head_weight", {0, 1}},
      {"encoder_relative_bias", {1, 1}},
      {"decoder_relative_bias", {1, 1}},
  };
  const auto it = kShards->find(leaf);
  return it == kShards->end() ? TensorShard{} : it->second;
}

ShardRange RangeOfPart(int64_t size, int64_t parts, int64_t index) {
  const int64_t chunk = (size + parts - 1) / parts;
  const int64_t begin = std::min(size, index * chunk);
  return {.begin = begin, .end = std::min(size, begin + chunk)};
}

torch::Tensor ShardOf(const torch::Tensor& full, TensorShard shard, int64_t parts, int64_t index) {
  if (shard.replicated() || parts == 1) return full;
  std::vector<torch::Tensor> pieces;
  for (const torch::Tensor& block : full.chunk(shard.blocks, shard.dim)) {
    const ShardRange range = RangeOfPart(block.size(shard.dim), parts, index);
    pieces.push_back(block.narrow(shard.dim, range.begin, range.size()));
  }
  return torch::cat(pieces, shard.dim).clone();
}

torch::Tensor UnshardOf(const std::vector<torch::Tensor>& pieces, TensorShard shard) {
  if (shard.replicated() || pieces.size() == 1) return pieces.front();
  std::vector<torch::Tensor> blocks;
  for (int64_t b = 0; b < shard.blocks; ++b) {
    for (const torch::Tensor& piece : pieces)
      blocks.push_back(piece.chunk(shard.blocks, shard.dim)[b]);
  }
  return torch::cat(blocks, shard.dim);
}

}  // namespace varipipe::executor
