// Attention over packed rows in one kernel call per layer: the real tokens
// of all rows back to back ([total, heads, d]) and the samples' cumulative
// lengths (variable_length_layout.h), as FlashAttention's variable-length
// kernel takes them (Megatron-LM's THD format). Each sample's queries see
// only its own keys, causally or not; row padding is not computed and its
// outputs are zero.
//
// The kernel sits behind one seam, VariableLengthKernel:
//   - FlashVariableLengthKernel: LibTorch's aten::_flash_attention_forward
//     and _flash_attention_backward (CUDA, fp16/bf16, head size a multiple
//     of 8 up to 256), reached through the dispatcher by name
//     (dispatcher_call.h) so one build adapts to the linked LibTorch's
//     signature;
//   - ReferenceVariableLengthKernel: the same forward and backward in
//     explicit fp32 arithmetic, sample by sample, on any device. It proves
//     everything around the kernel (layouts, gathers, the autograd function,
//     recomputation) on CPUs, where LibTorch has no such operator.
// The autograd function keeps q, k, v, the output and the fp32
// log-sum-exp [heads, total_q]: no score tensor.
#ifndef VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_ATTENTION_H_
#define VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_ATTENTION_H_

#include <torch/torch.h>

#include <array>
#include <string_view>
#include <vector>

#include "executor/model/dispatcher_call.h"
#include "executor/model/variable_length_layout.h"

namespace varipipe::executor {

class VariableLengthKernel {
 public:
  struct Result {
    torch::Tensor out;        // [total_q, heads, d], q's dtype
    torch::Tensor logsumexp;  // fp32 [heads, total_q]
    // What the kernel's backward needs besides (flash: its random state).
    std::vector<c10::IValue> state;
  };
  virtual ~VariableLengthKernel() = default;
  virtual std::string_view name() const = 0;
  // q [total_q, heads, d], k, v [total_k, heads, d] (contiguous); scores are
  // multiplied by `scale`.
  virtual Result Forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const VariableLengthLayout& layout, double scale) const = 0;
  // Gradients of q, k, v from the output's gradient and Forward's result.
  virtual std::array<torch::Tensor, 3> Backward(const torch::Tensor& grad_out,
                                                const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v, const Result& forward,
                                                const VariableLengthLayout& layout,
                                                double scale) const = 0;
};

const VariableLengthKernel& FlashVariableLengthKernel();
const VariableLengthKernel& ReferenceVariableLengthKernel();

// The kernel packed rows' attention uses for queries like `q` with heads of
// `head_dim`, or null when none applies (the caller then runs
// PerSampleAttention): flash on CUDA for fp16/bf16 when `fused` (the model's
// FUSED attention kernel) and the linked LibTorch has the operators. Score
// biases (T5 v1.1) have no variable-length kernel: null.
const VariableLengthKernel* VariableLengthKernelFor(const torch::Tensor& q, int64_t head_dim,
                                                    bool has_bias, bool fused);

// While alive, VariableLengthKernelFor returns `kernel` for every input
// without a bias, on any device (tests run the variable-length path on CPUs
// with the reference kernel). Not nestable.
class ScopedVariableLengthKernel {
 public:
  explicit ScopedVariableLengthKernel(const VariableLengthKernel& kernel);
  ~ScopedVariableLengthKernel();
  ScopedVariableLengthKernel(const ScopedVariableLengthKernel&) = delete;
  ScopedVariableLengthKernel& operator=(const ScopedVariableLengthKernel&) = delete;
};

// q [b, sq, heads*d], k, v [b, sk, heads*d] (layout.rows() rows, padded to
// layout.query_length() and key_length()) -> [b, sq, heads*d]: each sample's
// attention by `kernel`, zero at padding queries. Differentiable in q, k, v.
torch::Tensor VariableLengthAttention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v,
                                      const c10::intrusive_ptr<VariableLengthLayout>& layout,
                                      int64_t heads, double scale,
                                      const VariableLengthKernel& kernel);

// The named arguments FlashVariableLengthKernel passes (dispatcher_call.h),
// for tests against the schemas of LibTorch versions. `offsets_q`,
// `offsets_k` int32 [samples + 1]; `state` the forward's random state.
std::vector<NamedArgument> FlashForwardArguments(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v,
                                                 const torch::Tensor& offsets_q,
                                                 const torch::Tensor& offsets_k, int64_t max_q,
                                                 int64_t max_k, bool causal, double scale);
std::vector<NamedArgument> FlashBackwardArguments(
    const torch::Tensor& grad_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& logsumexp,
    const torch::Tensor& offsets_q, const torch::Tensor& offsets_k, int64_t max_q, int64_t max_k,
    bool causal, const std::vector<c10::IValue>& state, double scale);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_MODEL_VARIABLE_LENGTH_ATTENTION_H_
