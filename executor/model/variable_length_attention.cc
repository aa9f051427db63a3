#include "executor/model/variable_length_attention.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <string>

namespace varipipe::executor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

std::atomic<const VariableLengthKernel*> g_kernel_override{nullptr};

// Whether `scale` is the kernels' default 1 / sqrt(d) (then a schema
// without a scale argument computes the same).
bool IsDefaultScale(double scale, int64_t head_dim) {
  return std::abs(scale * std::sqrt(static_cast<double>(head_dim)) - 1.0) < 1e-12;
}

// [H, L, D] views of sample i's rows [begin, begin + length) of x
// [total, H, D], in fp32.
torch::Tensor SampleHeads(const torch::Tensor& x, int64_t begin, int64_t length) {
  return x.narrow(0, begin, length).to(torch::kFloat32).transpose(0, 1);
}

// The causal mask of a sample of lq queries and lk keys, bottom-right
// aligned (query t sees keys 0 .. lk - lq + t): true where hidden.
torch::Tensor Hidden(int64_t lq, int64_t lk, torch::Device device) {
  return torch::ones({lq, lk}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .triu(lk - lq + 1);
}

class ReferenceKernel : public VariableLengthKernel {
 public:
  std::string_view name() const override { return "reference"; }

  // Per sample: S = scale Q K^T (causal: -inf above the diagonal),
  // lse = logsumexp_k S, O = exp(S - lse) V.
  Result Forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                 const VariableLengthLayout& layout, double scale) const override {
    Result r;
    r.out = torch::zeros_like(q);
    r.logsumexp = torch::empty({q.size(1), q.size(0)}, q.options().dtype(torch::kFloat32));
    const std::vector<int64_t>& oq = layout.query_offsets();
    const std::vector<int64_t>& ok = layout.key_offsets();
    for (size_t i = 0; i + 1 < oq.size(); ++i) {
      const int64_t lq = oq[i + 1] - oq[i];
      const int64_t lk = ok[i + 1] - ok[i];
      torch::Tensor scores =
          torch::matmul(SampleHeads(q, oq[i], lq), SampleHeads(k, ok[i], lk).transpose(1, 2)) *
          scale;
      if (layout.causal()) {
        scores = scores.masked_fill(Hidden(lq, lk, q.device()),
                                    -std::numeric_limits<float>::infinity());
      }
      const torch::Tensor lse = scores.logsumexp(-1);  // [H, lq]
      const torch::Tensor out =
          torch::matmul((scores - lse.unsqueeze(-1)).exp(), SampleHeads(v, ok[i], lk));
      r.out.narrow(0, oq[i], lq).copy_(out.transpose(0, 1));
      r.logsumexp.narrow(1, oq[i], lq).copy_(lse);
    }
    return r;
  }

  // Per sample, with P = exp(S - lse): dV = P^T dO, dP = dO V^T,
  // dS = P (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
  std::array<torch::Tensor, 3> Backward(const torch::Tensor& grad_out, const torch::Tensor& q,
                                        const torch::Tensor& k, const torch::Tensor& v,
                                        const Result& forward, const VariableLengthLayout& layout,
                                        double scale) const override {
    torch::Tensor dq = torch::zeros_like(q);
    torch::Tensor dk = torch::zeros_like(k);
    torch::Tensor dv = torch::zeros_like(v);
    const std::vector<int64_t>& oq = layout.query_offsets();
    const std::vector<int64_t>& ok = layout.key_offsets();
    for (size_t i = 0; i + 1 < oq.size(); ++i) {
      const int64_t lq = oq[i + 1] - oq[i];
      const int64_t lk = ok[i + 1] - ok[i];
      const torch::Tensor qs = SampleHeads(q, oq[i], lq);
      const torch::Tensor ks = SampleHeads(k, ok[i], lk);
      const torch::Tensor vs = SampleHeads(v, ok[i], lk);
      const torch::Tensor dos = SampleHeads(grad_out, oq[i], lq);
      const torch::Tensor os = SampleHeads(forward.out, oq[i], lq);
      torch::Tensor scores = torch::matmul(qs, ks.transpose(1, 2)) * scale;
      if (layout.causal()) {
        scores = scores.masked_fill(Hidden(lq, lk, q.device()),
                                    -std::numeric_limits<float>::infinity());
      }
      const torch::Tensor p =
          (scores - forward.logsumexp.narrow(1, oq[i], lq).unsqueeze(-1)).exp();
      const torch::Tensor dp = torch::matmul(dos, vs.transpose(1, 2));
      const torch::Tensor ds = p * (dp - (dos * os).sum(-1, /*keepdim=*/true));
      dv.narrow(0, ok[i], lk).add_(torch::matmul(p.transpose(1, 2), dos).transpose(0, 1));
      dq.narrow(0, oq[i], lq).add_((torch::matmul(ds, ks) * scale).transpose(0, 1));
      dk.narrow(0, ok[i], lk).add_((torch::matmul(ds.transpose(1, 2), qs) * scale).transpose(0, 1));
    }
    return {dq, dk, dv};
  }
};

// Throws the status's message as a c10::Error (the executor boundary
// catches those).
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  TORCH_CHECK(value.ok(), "variable-length attention: ", value.status().message());
  return *std::move(value);
}

class FlashKernel : public VariableLengthKernel {
 public:
  std::string_view name() const override { return "flash"; }

  Result Forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                 const VariableLengthLayout& layout, double scale) const override {
    const VariableLengthLayout::DeviceTensors& offsets = layout.OnDevice(q.device());
    const OperatorResults results = ValueOrThrow(CallOperator(
        "aten::_flash_attention_forward", "",
        FlashForwardArguments(q, k, v, offsets.query_offsets, offsets.key_offsets,
                              layout.max_query_length(), layout.max_key_length(), layout.causal(),
                              scale)));
    TORCH_CHECK(results.size() >= 4, "aten::_flash_attention_forward returned ", results.size(),
                " values, expected at least 4");
    Result r;
    r.out = results.at(0).toTensor();
    r.logsumexp = results.at(1).toTensor();
    r.state = {results.at(2), results.at(3)};
    return r;
  }

  std::array<torch::Tensor, 3> Backward(const torch::Tensor& grad_out, const torch::Tensor& q,
                                        const torch::Tensor& k, const torch::Tensor& v,
                                        const Result& forward, const VariableLengthLayout& layout,
                                        double scale) const override {
    const VariableLengthLayout::DeviceTensors& offsets = layout.OnDevice(q.device());
    const OperatorResults results = ValueOrThrow(CallOperator(
        "aten::_flash_attention_backward", "",
        FlashBackwardArguments(grad_out.contiguous(), q, k, v, forward.out, forward.logsumexp,
                               offsets.query_offsets, offsets.key_offsets,
                               layout.max_query_length(), layout.max_key_length(),
                               layout.causal(), forward.state, scale)));
    TORCH_CHECK(results.size() == 3, "aten::_flash_attention_backward returned ", results.size(),
                " values, expected 3");
    return {results.at(0).toTensor(), results.at(1).toTensor(), results.at(2).toTensor()};
  }
};

// The kernel call as one autograd node over the packed q, k, v.
class VariableLengthCore : public torch::autograd::Function<VariableLengthCore> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const c10::intrusive_ptr<VariableLengthLayout>& layout,
                               const VariableLengthKernel* kernel, double scale) {
    VariableLengthKernel::Result r = kernel->Forward(q, k, v, *layout, scale);
    ctx->save_for_backward({q, k, v, r.out, r.logsumexp});
    ctx->saved_data["layout"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(layout));
    ctx->saved_data["kernel"] = reinterpret_cast<int64_t>(kernel);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["state_size"] = static_cast<int64_t>(r.state.size());
    for (size_t i = 0; i < r.state.size(); ++i) {
      ctx->saved_data["state" + std::to_string(i)] = r.state[i];
    }
    return r.out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const auto layout = c10::static_intrusive_pointer_cast<VariableLengthLayout>(
        ctx->saved_data["layout"].toCapsule());
    const auto* kernel =
        reinterpret_cast<const VariableLengthKernel*>(ctx->saved_data["kernel"].toInt());
    VariableLengthKernel::Result forward;
    forward.out = saved[3];
    forward.logsumexp = saved[4];
    const int64_t state_size = ctx->saved_data["state_size"].toInt();
    for (int64_t i = 0; i < state_size; ++i) {
      forward.state.push_back(ctx->saved_data["state" + std::to_string(i)]);
    }
    const std::array<torch::Tensor, 3> grads =
        kernel->Backward(grad_outputs[0].contiguous(), saved[0], saved[1], saved[2], forward,
                         *layout, ctx->saved_data["scale"].toDouble());
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// x [b, s, heads*d] as the packed tokens [total, heads, d] (`index` the
// gather index, undefined when every position is a token, in order).
torch::Tensor Pack(const torch::Tensor& x, int64_t heads, const torch::Tensor& index) {
  const torch::Tensor flat = x.reshape({x.size(0) * x.size(1), heads, x.size(2) / heads});
  return (index.defined() ? flat.index_select(0, index) : flat).contiguous();
}

}  // namespace

const VariableLengthKernel& FlashVariableLengthKernel() {
  static const FlashKernel* const kKernel = new FlashKernel();
  return *kKernel;
}

const VariableLengthKernel& ReferenceVariableLengthKernel() {
  static const ReferenceKernel* const kKernel = new ReferenceKernel();
  return *kKernel;
}

const VariableLengthKernel* VariableLengthKernelFor(const torch::Tensor& q, int64_t head_dim,
                                                    bool has_bias, bool fused) {
  if (has_bias) return nullptr;
  if (const VariableLengthKernel* kernel = g_kernel_override.load()) return kernel;
  if (!fused || !q.is_cuda()) return nullptr;
  if (q.scalar_type() != torch::kHalf && q.scalar_type() != torch::kBFloat16) return nullptr;
  if (head_dim % 8 != 0 || head_dim > 256) return nullptr;
  static const bool kHasFlash = HasOperator("aten::_flash_attention_forward") &&
                                HasOperator("aten::_flash_attention_backward");
  return kHasFlash ? &FlashVariableLengthKernel() : nullptr;
}

ScopedVariableLengthKernel::ScopedVariableLengthKernel(const VariableLengthKernel& kernel) {
  const VariableLengthKernel* expected = nullptr;
  TORCH_CHECK(g_kernel_override.compare_exchange_strong(expected, &kernel),
              "ScopedVariableLengthKernel does not nest");
}

ScopedVariableLengthKernel::~ScopedVariableLengthKernel() { g_kernel_override.store(nullptr); }

torch::Tensor VariableLengthAttention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v,
                                      const c10::intrusive_ptr<VariableLengthLayout>& layout,
                                      int64_t heads, double scale,
                                      const VariableLengthKernel& kernel) {
  const int64_t b = q.size(0);
  const int64_t sq = q.size(1);
  TORCH_CHECK(b == layout->rows() && sq == layout->query_length() &&
                  k.size(1) == layout->key_length() && v.sizes() == k.sizes(),
              "variable-length attention: q ", q.sizes(), ", k ", k.sizes(), " for a layout of ",
              layout->rows(), " rows of ", layout->query_length(), " and ", layout->key_length(),
              " positions");
  const VariableLengthLayout::DeviceTensors& index = layout->OnDevice(q.device());
  const torch::Tensor out =
      VariableLengthCore::apply(Pack(q, heads, index.query_index), Pack(k, heads, index.key_index),
                                Pack(v, heads, index.key_index), layout, &kernel, scale);
  if (!index.query_index.defined()) return out.reshape({b, sq, q.size(2)});
  return torch::zeros({b * sq, heads, q.size(2) / heads}, out.options())
      .index_copy(0, index.query_index, out)
      .view({b, sq, q.size(2)});
}

std::vector<NamedArgument> FlashForwardArguments(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v,
                                                 const torch::Tensor& offsets_q,
                                                 const torch::Tensor& offsets_k, int64_t max_q,
                                                 int64_t max_k, bool causal, double scale) {
  return {
      {{"query"}, q},
      {{"key"}, k},
      {{"value"}, v},
      {{"cum_seq_q"}, offsets_q},
      {{"cum_seq_k"}, offsets_k},
      {{"max_q"}, max_q},
      {{"max_k"}, max_k},
      {{"dropout_p"}, 0.0},
      {{"is_causal"}, causal},
      {{"return_debug_mask"}, false},
      // Versions without the argument scale by 1 / sqrt(d).
      {{"scale"}, scale, /*required=*/!IsDefaultScale(scale, q.size(-1))},
  };
}

std::vector<NamedArgument> FlashBackwardArguments(
    const torch::Tensor& grad_out, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& logsumexp,
    const torch::Tensor& offsets_q, const torch::Tensor& offsets_k, int64_t max_q, int64_t max_k,
    bool causal, const std::vector<c10::IValue>& state, double scale) {
  TORCH_CHECK(state.size() == 2, "flash attention's backward needs the forward's random state");
  return {
      {{"grad_out"}, grad_out},
      {{"query"}, q},
      {{"key"}, k},
      {{"value"}, v},
      {{"out"}, out},
      {{"logsumexp"}, logsumexp},
      {{"cum_seq_q"}, offsets_q},
      {{"cum_seq_k"}, offsets_k},
      {{"max_q"}, max_q},
      {{"max_k"}, max_k},
      {{"dropout_p"}, 0.0},
      {{"is_causal"}, causal},
      // Renamed in LibTorch 2.7 (philox_seed, philox_offset before).
      {{"rng_state", "philox_seed"}, state[0]},
      {{"unused", "philox_offset"}, state[1]},
      {{"scale"}, scale, /*required=*/!IsDefaultScale(scale, q.size(-1))},
  };
}

}  // namespace varipipe::executor
