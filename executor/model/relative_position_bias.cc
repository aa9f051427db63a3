#include "executor/model/relative_position_bias.h"

#include <cmath>

namespace varipipe::executor {

namespace {

// Bucket offsets of the distances 0..max_distance within one direction's
// `buckets` buckets, computed on the CPU (true fp32 division, as Hugging
// Face's formula evaluates on a CPU; a GPU divides by a scalar through its
// reciprocal, which can move a distance to the neighbouring bucket), so the
// buckets do not depend on the device. Distances from max_distance on share
// the last bucket.
torch::Tensor DistanceBuckets(int64_t buckets, int64_t max_distance) {
  const int64_t max_exact = buckets / 2;
  const torch::Tensor distance = torch::arange(max_distance + 1, torch::kInt64);
  // log(u / E) / log(M / E) * (N' - E) in fp32, truncated (u >= E > 0 where
  // used; u = 0 gives -inf, which the exact branch replaces).
  const float log_ratio = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const torch::Tensor large =
      (torch::log(distance.to(torch::kFloat32) / static_cast<float>(max_exact)) / log_ratio *
       static_cast<float>(buckets - max_exact))
          .to(torch::kInt64)
          .add(max_exact)
          .clamp_max(buckets - 1);
  return torch::where(distance < max_exact, distance, large);
}

}  // namespace

torch::Tensor RelativePositionBuckets(const torch::Tensor& query_positions,
                                      const torch::Tensor& key_positions, bool bidirectional,
                                      int64_t num_buckets, int64_t max_distance) {
  // r = key - query, [B, sq, sk].
  const torch::Tensor relative = key_positions.unsqueeze(1) - query_positions.unsqueeze(2);
  torch::Tensor base = torch::zeros_like(relative);
  torch::Tensor distance;
  int64_t buckets = num_buckets;
  if (bidirectional) {
    // Half the buckets for keys after the query.
    buckets /= 2;
    base = (relative > 0).to(torch::kInt64) * buckets;
    distance = relative.abs();
  } else {
    distance = (-relative).clamp_min(0);
  }
  const torch::Tensor table = DistanceBuckets(buckets, max_distance).to(relative.device());
  return base + table.index({distance.clamp_max(max_distance)});
}

torch::Tensor RelativePositionBias(const torch::Tensor& table, const torch::Tensor& buckets) {
  // [B, sq, sk, heads] -> [B, heads, sq, sk].
  return torch::embedding(table, buckets).permute({0, 3, 1, 2});
}

}  // namespace varipipe::executor
