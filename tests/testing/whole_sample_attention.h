// Each sample's causal attention computed whole, the result context
// parallelism must reproduce (tests of executor/model/context_parallel_*).
#ifndef VARIPIPE_TESTS_TESTING_WHOLE_SAMPLE_ATTENTION_H_
#define VARIPIPE_TESTS_TESTING_WHOLE_SAMPLE_ATTENTION_H_

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace varipipe::testing {

// q, k, v [packed, heads, d]; sample s is packed tokens
// [offsets[s], offsets[s + 1]).
inline torch::Tensor WholeSampleAttention(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v,
                                          const std::vector<int64_t>& offsets, double scale) {
  std::vector<torch::Tensor> out;
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    const int64_t l = offsets[s + 1] - offsets[s];
    const torch::Tensor qs = q.slice(0, offsets[s], offsets[s + 1]).transpose(0, 1);
    const torch::Tensor ks = k.slice(0, offsets[s], offsets[s + 1]).transpose(0, 1);
    const torch::Tensor vs = v.slice(0, offsets[s], offsets[s + 1]).transpose(0, 1);
    const torch::Tensor hidden = torch::ones({l, l}, torch::kBool).triu(1);
    const torch::Tensor scores =
        (torch::matmul(qs, ks.transpose(1, 2)) * scale).masked_fill(hidden, -INFINITY);
    out.push_back(torch::matmul(torch::softmax(scores, -1), vs).transpose(0, 1));
  }
  return torch::cat(out, 0);
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_WHOLE_SAMPLE_ATTENTION_H_
