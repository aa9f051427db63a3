// The token chunk of the LM head's chunked linear + cross-entropy
// (executor/model/chunked_loss_head.h), shared by the executor, which runs
// it, and the planner's memory model, which prices its transient: the
// head computes the logits of at most this many labelled tokens at a time,
// so that one chunk's fp32 logits over a tensor rank's vocabulary rows stay
// near kLossChunkLogitBytes whatever the micro-batch:
//
//   chunk(rows) = max(kMinLossChunkTokens, kLossChunkLogitBytes / (4 * rows))
//
// (GPT-2's 50,257 rows: 1,335 tokens, 256 MiB; split over 2 tensor ranks:
// 2,670; Llama 3's 128,256: 1,024 tokens, 501 MiB.) A job sets its own chunk
// with training.loss_chunk_tokens (0: this default), which both sides read
// (LossChunkTokens); the executor's --loss_chunk_tokens overrides it there
// alone.
#ifndef VARIPIPE_COMMON_LOSS_HEAD_CHUNK_H_
#define VARIPIPE_COMMON_LOSS_HEAD_CHUNK_H_

#include <algorithm>
#include <cstdint>

namespace varipipe {

// fp32 bytes one chunk's logits aim at.
inline constexpr int64_t kLossChunkLogitBytes = int64_t{256} << 20;
// The smallest default chunk: matrix products of fewer rows waste the device.
inline constexpr int64_t kMinLossChunkTokens = 1024;

// The default chunk for a head of `vocab_rows` rows (this tensor rank's
// part of the vocabulary; >= 1).
inline int64_t DefaultLossChunkTokens(int64_t vocab_rows) {
  return std::max(kMinLossChunkTokens,
                  kLossChunkLogitBytes / (4 * std::max<int64_t>(vocab_rows, 1)));
}

// The chunk a head of `vocab_rows` rows runs with: `configured` (a job's
// training.loss_chunk_tokens) when positive, else the default.
inline int64_t LossChunkTokens(int64_t configured, int64_t vocab_rows) {
  return configured > 0 ? configured : DefaultLossChunkTokens(vocab_rows);
}

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_LOSS_HEAD_CHUNK_H_
