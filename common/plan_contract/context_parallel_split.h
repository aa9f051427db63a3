// How a micro-batch split across a context-parallel group of c ranks cuts
// its samples (the rule both halves rely on: the planner prices and records
// it, the executor runs it). Each sample of length L is cut into 2c chunks,
// chunk j = positions [floor(j L / 2c), floor((j + 1) L / 2c)), and the
// group's rank i holds chunks i and 2c - 1 - i, so that every rank gets one
// early and one late chunk of every sample and causal attention work is
// balanced (as Megatron-LM's context parallelism and Llama 3 do it).
//
// Tokens are numbered as the samples' tokens back to back ("packed", the
// variable-length kernels' order): sample s's position p is packed token
// sample_offsets[s] + p. A rank's local tokens are, sample after sample,
// its first chunk then its second chunk. Causal attention of the local
// queries needs, for a query chunk [a, b) of a sample, the sample's keys
// [0, b), bottom-right aligned (query a + t sees keys 0 .. a + t), which
// the key prefixes below list once per query chunk, as a variable-length
// kernel takes them (cu_seqlens_q over the query chunks, cu_seqlens_k over
// their key prefixes).
//
// After an all-gather of every rank's local keys, each padded to the
// group's most local tokens (all_gather_count), the gathered buffer holds
// rank r's local token u at r * all_gather_count + u; gathered_index maps
// each packed token there.
#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_CONTEXT_PARALLEL_SPLIT_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_CONTEXT_PARALLEL_SPLIT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace varipipe {

class ContextParallelSplit {
 public:
  // One of the rank's query chunks: a run of one sample's positions.
  struct Chunk {
    int64_t sample = 0;
    int64_t begin = 0;  // position in the sample
    int64_t end = 0;    // exclusive; its key prefix is [0, end)
  };

  // The split of samples of `lengths` (each >= 1) over `group_size` ranks,
  // as rank `index` of the group sees it. InvalidArgument naming the value
  // for a length < 1, a group size < 1 or an index outside the group.
  static absl::StatusOr<ContextParallelSplit> Of(const std::vector<int64_t>& lengths,
                                                 int group_size, int index);

  // Chunk j of a sample of `length` cut for a group of `group_size`:
  // [ChunkBegin(length, j), ChunkBegin(length, j + 1)).
  static int64_t ChunkBegin(int64_t length, int group_size, int chunk);

  int group_size() const { return group_size_; }
  int index() const { return index_; }
  const std::vector<int64_t>& sample_offsets() const { return sample_offsets_; }
  int64_t total_tokens() const { return sample_offsets_.back(); }

  // The rank's non-empty query chunks in local order.
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // Per local token: its packed token and its position in its own sample
  // (rotary and absolute positions, relative biases read it).
  const std::vector<int64_t>& local_tokens() const { return local_tokens_; }
  const std::vector<int64_t>& local_positions() const { return local_positions_; }
  int64_t local_count() const { return static_cast<int64_t>(local_tokens_.size()); }
  // The most local tokens any rank of the group holds: each rank's part of
  // the all-gather, padded to it.
  int64_t all_gather_count() const { return all_gather_count_; }
  // Per packed token: where the all-gather puts it.
  const std::vector<int64_t>& gathered_index() const { return gathered_index_; }

  // Causal attention of the local queries: query_offsets [chunks + 1] over
  // the local tokens; key_offsets [chunks + 1] over the key prefixes laid
  // back to back, whose tokens key_index gives as indices into the
  // gathered buffer.
  const std::vector<int64_t>& query_offsets() const { return query_offsets_; }
  const std::vector<int64_t>& key_offsets() const { return key_offsets_; }
  const std::vector<int64_t>& key_index() const { return key_index_; }
  int64_t max_query_chunk() const { return max_query_chunk_; }
  int64_t max_key_prefix() const { return max_key_prefix_; }

  // Score pairs this rank's causal attention computes: the sum over its
  // query chunks [a, b) of sum_{p = a}^{b - 1} (p + 1).
  int64_t causal_pairs() const { return causal_pairs_; }

 private:
  ContextParallelSplit() = default;

  int group_size_ = 1;
  int index_ = 0;
  std::vector<int64_t> sample_offsets_{0};
  std::vector<Chunk> chunks_;
  std::vector<int64_t> local_tokens_;
  std::vector<int64_t> local_positions_;
  int64_t all_gather_count_ = 0;
  std::vector<int64_t> gathered_index_;
  std::vector<int64_t> query_offsets_{0};
  std::vector<int64_t> key_offsets_{0};
  std::vector<int64_t> key_index_;
  int64_t max_query_chunk_ = 0;
  int64_t max_key_prefix_ = 0;
  int64_t causal_pairs_ = 0;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_CONTEXT_PARALLEL_SPLIT_H_
