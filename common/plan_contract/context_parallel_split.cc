#include "common/plan_contract/context_parallel_split.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace varipipe {

int64_t ContextParallelSplit::ChunkBegin(int64_t length, int group_size, int chunk) {
  return length * chunk / (2 * static_cast<int64_t>(group_size));
}

absl::StatusOr<ContextParallelSplit> ContextParallelSplit::Of(const std::vector<int64_t>& lengths,
                                                               int group_size, int index) {
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("context-parallel group of ", group_size, " ranks (at least 1)"));
  }
  if (index < 0 || index >= group_size) {
    return absl::InvalidArgumentError(absl::StrCat("context-parallel rank index ", index,
                                                   " outside a group of ", group_size));
  }
  ContextParallelSplit split;
  split.group_size_ = group_size;
  split.index_ = index;
  for (size_t s = 0; s < lengths.size(); ++s) {
    if (lengths[s] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", s, " of a context-parallel micro-batch has length ", lengths[s],
                       " (at least 1)"));
    }
    split.sample_offsets_.push_back(split.sample_offsets_.back() + lengths[s]);
  }
  const int chunks_per_sample = 2 * group_size;
  // Every rank's local list, for the all-gather's placement of each packed
  // token: rank r's u-th local token goes to r * count + u.
  std::vector<int64_t> owner(split.total_tokens());
  std::vector<int64_t> offset_in_owner(split.total_tokens());
  std::vector<int64_t> local_counts(group_size, 0);
  for (int r = 0; r < group_size; ++r) {
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (const int j : {r, chunks_per_sample - 1 - r}) {
        const int64_t begin = ChunkBegin(lengths[s], group_size, j);
        const int64_t end = ChunkBegin(lengths[s], group_size, j + 1);
        for (int64_t p = begin; p < end; ++p) {
          const int64_t packed = split.sample_offsets_[s] + p;
          owner[packed] = r;
          offset_in_owner[packed] = local_counts[r]++;
        }
        if (r == index && end > begin) {
          split.chunks_.push_back({.sample = static_cast<int64_t>(s), .begin = begin, .end = end});
        }
      }
    }
  }
  split.all_gather_count_ = *std::max_element(local_counts.begin(), local_counts.end());
  split.gathered_index_.resize(split.total_tokens());
  for (int64_t t = 0; t < split.total_tokens(); ++t) {
    split.gathered_index_[t] = owner[t] * split.all_gather_count_ + offset_in_owner[t];
  }
  for (const Chunk& chunk : split.chunks_) {
    const int64_t start = split.sample_offsets_[chunk.sample];
    for (int64_t p = chunk.begin; p < chunk.end; ++p) {
      split.local_tokens_.push_back(start + p);
      split.local_positions_.push_back(p);
      split.causal_pairs_ += p + 1;
    }
    for (int64_t k = 0; k < chunk.end; ++k) {
      split.key_index_.push_back(split.gathered_index_[start + k]);
    }
    split.query_offsets_.push_back(split.query_offsets_.back() + chunk.end - chunk.begin);
    split.key_offsets_.push_back(split.key_offsets_.back() + chunk.end);
    split.max_query_chunk_ = std::max(split.max_query_chunk_, chunk.end - chunk.begin);
    split.max_key_prefix_ = std::max(split.max_key_prefix_, chunk.end);
  }
  return split;
}

}  // namespace varipipe
