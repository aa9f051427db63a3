#include "planner/schedule/backward_split.h"

#include <algorithm>

namespace varipipe::planner {

double WeightGemmShare(uint32_t hidden, uint32_t attention_len) {
  const double h6 = 6.0 * hidden;
  return h6 > 0 ? h6 / (h6 + attention_len) : 0.0;
}

void SplitBackward(uint32_t hidden, uint32_t attention_len, StageOpCost* cost) {
  cost->weight_ms =
      std::min(cost->forward_ms * WeightGemmShare(hidden, attention_len), cost->backward_ms / 2);
  cost->weight_stored_bytes = cost->stored_bytes * kWeightKeptFraction;
}

double LinearKeptBytes(double tokens, uint32_t hidden, uint32_t layers, uint32_t dtype_bytes) {
  return 16.0 * tokens * hidden * layers * dtype_bytes;
}

}  // namespace varipipe::planner
