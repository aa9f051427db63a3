// The independent reference of the equivalence tests: the whole model written
// here from its definition (docs/executor.md for MEGATRON GPT and T5,
// docs/models.md for LLAMA GPT and T5V11 T5), not from executor/model. It
// runs one sample at a time with no padding and no masks but causality, and
// spells out layer norm, RMSNorm, GELU (erf and tanh forms), SiLU, rotary
// embeddings, T5's relative position buckets and bias, attention (one head
// at a time, grouped-query for LLAMA, unscaled with a position bias for
// T5V11) and the cross-entropy, so a defect in the executor's batching,
// masking, packing, pipelining, recomputation or gradient reduction cannot
// hide in shared code. It shares with the executor only the deterministic
// initialisation rule (a SplitMix64-seeded LibTorch CPU generator per model
// component, drawn in a fixed order) and the parameter names, so both start
// from the same parameters and can be compared by name. A parameter the
// executor replicates on several stages (T5V11's word_embedding and relative
// bias tables, LLAMA's tied embedding) is one tensor here, so its gradient
// is the sum over all its uses: what every replica holds after the
// executor's gradient sum.
#ifndef VARIPIPE_TESTS_TESTING_REFERENCE_MODEL_H_
#define VARIPIPE_TESTS_TESTING_REFERENCE_MODEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/dataset/sample_dataset.h"
#include "varipipe/v1/config.pb.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::testing {

// One sample as a plan feeds it: its dataset id and the lengths the plan
// gives it (the first `input` input and `target` target tokens).
struct ReferenceSample {
  uint64_t id = 0;
  uint32_t input = 0;
  uint32_t target = 0;
};

// Every sample of one iteration's plans (one plan per rank): the micro-
// batches of every data-parallel replica, each sample once (a context
// group's lanes each list all of the group's micro-batches: lane 0's).
std::vector<ReferenceSample> IterationSamples(const std::vector<v1::ExecutionPlan>& plans);

using NamedTensors = std::map<std::string, torch::Tensor>;

// The loss and gradients of one iteration.
struct ReferencePass {
  double loss = 0;           // sum of token losses / loss_tokens
  uint64_t loss_tokens = 0;  // tokens the loss covers over all samples
  double grad_norm = 0;      // L2 norm over every gradient entry
  NamedTensors gradients;    // by parameter name
};

class ReferenceModel {
 public:
  // `config` with defaults applied (ApplyJobConfigDefaults).
  explicit ReferenceModel(const v1::JobConfig& config);

  // The mean token loss over `samples` (the global mini-batch: every sample's
  // summed token loss divided by the loss tokens of all of them) and its
  // gradient.
  ReferencePass Gradients(const std::vector<ReferenceSample>& samples,
                          const SampleDataset& dataset);

  // Plain SGD: p -= lr * gradient.
  void SgdStep(const NamedTensors& gradients, double learning_rate);

  const NamedTensors& parameters() const { return parameters_; }

 private:
  // The parameters with their initial values, per architecture.
  void InitMegatron(const v1::JobConfig& config);
  void InitLlama(const v1::JobConfig& config);
  void InitT5V11(const v1::JobConfig& config);
  torch::Tensor& P(const std::string& name);
  torch::Tensor Embed(const std::string& prefix, const std::vector<int64_t>& tokens);
  torch::Tensor Layer(const std::string& prefix, const torch::Tensor& x, bool causal,
                      const torch::Tensor& memory);
  torch::Tensor LlamaLayer(const std::string& prefix, const torch::Tensor& x);
  // T5V11's position bias of one stack for a sample of n tokens (queries and
  // keys alike): [heads, n, n] gathered from the table `name` ([buckets,
  // heads]); bidirectional in the encoder, causal buckets in the decoder.
  torch::Tensor PositionBias(const std::string& name, int64_t n, bool bidirectional);
  // A T5V11 layer: encoder layers (`memory` undefined) attend both ways,
  // decoder layers causally and then across to `memory`; `bias` is the
  // stack's PositionBias.
  torch::Tensor T5V11Layer(const std::string& prefix, const torch::Tensor& x,
                           const torch::Tensor& bias, const torch::Tensor& memory);
  // The final normalisation and the LM head: logits [n, vocab].
  torch::Tensor Head(const torch::Tensor& x);
  // Summed token loss of one sample.
  torch::Tensor SampleLoss(const std::vector<int64_t>& input, const std::vector<int64_t>& target,
                           uint64_t* loss_tokens);

  bool t5_ = false;
  int64_t encoder_layers_ = 0;  // GPT: all layers
  int64_t decoder_layers_ = 0;
  int64_t hidden_ = 0;
  int64_t heads_ = 0;
  bool llama_ = false;  // architecture LLAMA
  bool t5v11_ = false;  // architecture T5V11 (neither: MEGATRON)
  // LLAMA and T5V11: the RMSNorm epsilon.
  double norm_epsilon_ = 0;
  // LLAMA only.
  int64_t kv_heads_ = 0;
  bool tied_ = false;             // the head multiplies by word_embedding
  std::vector<double> inv_freq_;  // rotary frequencies, kv_channels / 2
  // T5V11 only: relative_attention_num_buckets and _max_distance.
  int64_t buckets_ = 0;
  int64_t max_distance_ = 0;
  NamedTensors parameters_;
};

// max over `a`'s tensors of max|a - b| / max|b| (per tensor, over its
// entries), and how many tensors were compared; every tensor of `a` must be
// in `b`.
struct TensorDifference {
  double worst = 0;
  std::string worst_name;
  int compared = 0;
};
TensorDifference MaxRelativeDifference(const NamedTensors& a, const NamedTensors& b);

// Tensor index `index`'s part of each of `whole`'s parameters, as a rank of
// a tensor group of `tensor` holds it (executor/model/tensor_shard.h).
NamedTensors TensorPartOf(const NamedTensors& whole, int tensor, int index);

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_REFERENCE_MODEL_H_
