// Calls by name through the dispatcher (dispatcher_call.h): the arguments
// flash attention's variable-length kernel is given bind to the schema of
// every LibTorch version the executor supports, written here as those
// versions declare it; what does not fit is named; and a real operator of
// the linked LibTorch is called by name.
#include "executor/model/dispatcher_call.h"

#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include <cmath>
#include <string>
#include <vector>

#include "executor/model/variable_length_attention.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varipipe::executor {
namespace {

using ::testing::HasSubstr;

struct Version {
  const char* name;
  const char* forward;
  const char* backward;
  bool integer_state;  // the random state is two ints (2.0) rather than tensors
};

// The schemas of aten::_flash_attention_forward and _backward as they
// changed: scale added after 2.0, optional offsets and window sizes (2.4),
// seqused_k and alibi_slopes (2.5), returns renamed rng_state and unused
// (2.7, PyTorch PR 146372), block_table and num_splits appended later.
const std::vector<Version>& Versions() {
  static const std::vector<Version>* const kVersions = new std::vector<Version>{
      {"2.0",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor cum_seq_q, "
       "Tensor cum_seq_k, int max_q, int max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask) -> (Tensor output, Tensor softmax_logsumexp, int philox_seed, int "
       "philox_offset, Tensor debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, int max_q, int max_k, "
       "float dropout_p, bool is_causal, int philox_seed, int philox_offset) -> (Tensor, Tensor, "
       "Tensor)",
       true},
      {"2.1",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor cum_seq_q, "
       "Tensor cum_seq_k, int max_q, int max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask, *, float? scale=None) -> (Tensor output, Tensor softmax_logsumexp, "
       "Tensor philox_seed, Tensor philox_offset, Tensor debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, int max_q, int max_k, "
       "float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, float? "
       "scale=None) -> (Tensor, Tensor, Tensor)",
       false},
      {"2.4",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
       "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask, *, float? scale=None, SymInt? window_size_left=None, SymInt? "
       "window_size_right=None) -> (Tensor output, Tensor softmax_logsumexp, Tensor philox_seed, "
       "Tensor philox_offset, Tensor debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
       "max_k, float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, "
       "float? scale=None, SymInt? window_size_left=None, SymInt? window_size_right=None) -> "
       "(Tensor, Tensor, Tensor)",
       false},
      {"2.5",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
       "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask, *, float? scale=None, SymInt? window_size_left=None, SymInt? "
       "window_size_right=None, Tensor? seqused_k=None, Tensor? alibi_slopes=None) -> (Tensor "
       "output, Tensor softmax_logsumexp, Tensor philox_seed, Tensor philox_offset, Tensor "
       "debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
       "max_k, float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, "
       "float? scale=None, SymInt? window_size_left=None, SymInt? window_size_right=None) -> "
       "(Tensor, Tensor, Tensor)",
       false},
      {"2.7",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
       "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask, *, float? scale=None, SymInt? window_size_left=None, SymInt? "
       "window_size_right=None, Tensor? seqused_k=None, Tensor? alibi_slopes=None) -> (Tensor "
       "output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor "
       "debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
       "max_k, float dropout_p, bool is_causal, Tensor rng_state, Tensor unused, *, float? "
       "scale=None, SymInt? window_size_left=None, SymInt? window_size_right=None) -> (Tensor, "
       "Tensor, Tensor)",
       false},
      {"2.12",
       "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
       "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool "
       "return_debug_mask, *, float? scale=None, SymInt? window_size_left=None, SymInt? "
       "window_size_right=None, Tensor? seqused_k=None, Tensor? alibi_slopes=None, Tensor? "
       "block_table=None, int? num_splits=None) -> (Tensor output, Tensor softmax_logsumexp, "
       "Tensor rng_state, Tensor unused, Tensor debug_attn_mask)",
       "aten::_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
       "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt "
       "max_k, float dropout_p, bool is_causal, Tensor rng_state, Tensor unused, *, float? "
       "scale=None, SymInt? window_size_left=None, SymInt? window_size_right=None) -> (Tensor, "
       "Tensor, Tensor)",
       false},
  };
  return *kVersions;
}

constexpr int64_t kHeadDim = 8;

struct Inputs {
  torch::Tensor q = torch::randn({10, 2, kHeadDim});
  torch::Tensor k = torch::randn({10, 2, kHeadDim});
  torch::Tensor v = torch::randn({10, 2, kHeadDim});
  torch::Tensor offsets = torch::tensor({0, 4, 10}, torch::kInt32);
  double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
};

// Where `name` sits among the schema's arguments.
size_t ArgumentIndex(const c10::FunctionSchema& schema, const std::string& name) {
  const c10::optional<int> index = schema.argumentIndexWithName(name);
  EXPECT_TRUE(index.has_value()) << name;
  return static_cast<size_t>(index.value_or(0));
}

TEST(DispatcherCall, FlashForwardArgumentsBindToEverySupportedSchema) {
  const Inputs in;
  for (const Version& version : Versions()) {
    SCOPED_TRACE(version.name);
    const c10::FunctionSchema schema = torch::jit::parseSchema(version.forward);
    absl::StatusOr<std::vector<c10::IValue>> stack = BindArguments(
        schema, FlashForwardArguments(in.q, in.k, in.v, in.offsets, in.offsets, 6, 6,
                                      /*causal=*/true, in.scale));
    ASSERT_TRUE(stack.ok()) << stack.status();
    ASSERT_EQ(stack->size(), schema.arguments().size());
    EXPECT_TRUE((*stack)[0].toTensor().is_same(in.q));
    EXPECT_TRUE((*stack)[ArgumentIndex(schema, "cum_seq_k")].toTensor().is_same(in.offsets));
    EXPECT_EQ((*stack)[ArgumentIndex(schema, "max_q")].toInt(), 6);
    EXPECT_TRUE((*stack)[ArgumentIndex(schema, "is_causal")].toBool());
    EXPECT_FALSE((*stack)[ArgumentIndex(schema, "return_debug_mask")].toBool());
    if (schema.argumentIndexWithName("scale")) {
      EXPECT_DOUBLE_EQ((*stack)[ArgumentIndex(schema, "scale")].toDouble(), in.scale);
    }
    // What the caller does not give takes the schema's default.
    for (const char* absent : {"window_size_left", "seqused_k", "alibi_slopes", "num_splits"}) {
      if (schema.argumentIndexWithName(absent)) {
        EXPECT_TRUE((*stack)[ArgumentIndex(schema, absent)].isNone()) << absent;
      }
    }
  }
}

TEST(DispatcherCall, FlashBackwardArgumentsBindUnderBothNamesOfTheRandomState) {
  const Inputs in;
  for (const Version& version : Versions()) {
    SCOPED_TRACE(version.name);
    const std::vector<c10::IValue> state =
        version.integer_state
            ? std::vector<c10::IValue>{int64_t{123}, int64_t{7}}
            : std::vector<c10::IValue>{torch::tensor({123}), torch::tensor({7})};
    const c10::FunctionSchema schema = torch::jit::parseSchema(version.backward);
    absl::StatusOr<std::vector<c10::IValue>> stack = BindArguments(
        schema, FlashBackwardArguments(in.q, in.q, in.k, in.v, in.q, torch::zeros({2, 10}),
                                       in.offsets, in.offsets, 6, 6, /*causal=*/false, state,
                                       in.scale));
    ASSERT_TRUE(stack.ok()) << stack.status();
    ASSERT_EQ(stack->size(), schema.arguments().size());
    // The random state fills positions 12 and 13, whatever they are called.
    if (version.integer_state) {
      EXPECT_EQ((*stack)[12].toInt(), 123);
      EXPECT_EQ((*stack)[13].toInt(), 7);
    } else {
      EXPECT_TRUE((*stack)[12].toTensor().is_same(state[0].toTensor()));
      EXPECT_TRUE((*stack)[13].toTensor().is_same(state[1].toTensor()));
    }
  }
}

TEST(DispatcherCall, AScaleTheSchemaCannotTakeIsRefusedByName) {
  const Inputs in;
  const c10::FunctionSchema oldest = torch::jit::parseSchema(Versions().front().forward);
  // The default scale is dropped (the kernel applies it anyway) ...
  EXPECT_TRUE(BindArguments(oldest, FlashForwardArguments(in.q, in.k, in.v, in.offsets, in.offsets,
                                                          6, 6, true, in.scale))
                  .ok());
  // ... another is not silently lost.
  const absl::StatusOr<std::vector<c10::IValue>> unscaled = BindArguments(
      oldest, FlashForwardArguments(in.q, in.k, in.v, in.offsets, in.offsets, 6, 6, true, 1.0));
  ASSERT_FALSE(unscaled.ok());
  EXPECT_EQ(unscaled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unscaled.status().message()), HasSubstr("has no argument scale"));
}

TEST(DispatcherCall, ARequiredArgumentNobodyGivesIsNamed) {
  const c10::FunctionSchema future = torch::jit::parseSchema(
      "aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
      "Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, bool "
      "return_debug_mask, int page_size, *, float? scale=None) -> (Tensor output, Tensor "
      "softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)");
  const Inputs in;
  const absl::StatusOr<std::vector<c10::IValue>> stack = BindArguments(
      future, FlashForwardArguments(in.q, in.k, in.v, in.offsets, in.offsets, 6, 6, true, 1.0));
  ASSERT_FALSE(stack.ok());
  EXPECT_THAT(std::string(stack.status().message()), HasSubstr("needs argument 'page_size'"));
}

TEST(DispatcherCall, AValueOfTheWrongTypeIsNamed) {
  const c10::FunctionSchema schema = torch::jit::parseSchema(Versions().back().forward);
  const Inputs in;
  std::vector<NamedArgument> args =
      FlashForwardArguments(in.q, in.k, in.v, in.offsets, in.offsets, 6, 6, true, in.scale);
  for (NamedArgument& arg : args) {
    if (arg.names.front() == "max_k") arg.value = 6.0;
  }
  const absl::StatusOr<std::vector<c10::IValue>> stack = BindArguments(schema, args);
  ASSERT_FALSE(stack.ok());
  EXPECT_THAT(std::string(stack.status().message()), HasSubstr("argument 'max_k'"));
}

TEST(DispatcherCall, ResultsAreFoundUnderEitherName) {
  for (const Version& version : Versions()) {
    SCOPED_TRACE(version.name);
    const OperatorResults results(
        torch::jit::parseSchema(version.forward),
        {torch::zeros({1}), torch::ones({1}), int64_t{5}, int64_t{6}, torch::zeros({0})});
    const absl::StatusOr<c10::IValue> state = results.Named({"rng_state", "philox_seed"});
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->toInt(), 5);
    const absl::StatusOr<c10::IValue> missing = results.Named({"no_such_return"});
    ASSERT_FALSE(missing.ok());
    EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no_such_return"));
  }
}

// A real call through the linked LibTorch's dispatcher: aten::add.Tensor
// with `alpha` left to its default, then given.
TEST(DispatcherCall, CallsARealOperatorByName) {
  const torch::Tensor a = torch::randn({3, 4});
  const torch::Tensor b = torch::randn({3, 4});
  absl::StatusOr<OperatorResults> sum =
      CallOperator("aten::add", "Tensor", {{{"self"}, a}, {{"other"}, b}});
  ASSERT_TRUE(sum.ok()) << sum.status();
  ASSERT_EQ(sum->size(), 1u);
  EXPECT_TRUE(torch::equal(sum->at(0).toTensor(), a + b));
  absl::StatusOr<OperatorResults> scaled =
      CallOperator("aten::add", "Tensor", {{{"self"}, a}, {{"other"}, b}, {{"alpha"}, 2.0}});
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_TRUE(torch::allclose(scaled->at(0).toTensor(), a + 2 * b));
  // The operator's own error comes back as a status, its message kept.
  absl::StatusOr<OperatorResults> mismatched = CallOperator(
      "aten::add", "Tensor", {{{"self"}, a}, {{"other"}, torch::randn({5, 7})}});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInternal);
}

TEST(DispatcherCall, AMissingOperatorIsNamed) {
  EXPECT_FALSE(HasOperator("aten::no_such_operator_anywhere"));
  const absl::StatusOr<OperatorResults> result =
      CallOperator("aten::no_such_operator_anywhere", "", {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("has no operator aten::no_such_operator_anywhere"));
}

// The linked LibTorch: where it has the flash operators (LibTorch 2.x, the
// GPU machine), the arguments bind to its own schemas; where it has none
// (1.13 here), no CPU tensor is offered the flash kernel.
TEST(DispatcherCall, TheLinkedLibTorchsFlashSchemasTakeTheArguments) {
  const Inputs in;
  if (!HasOperator("aten::_flash_attention_forward")) {
    EXPECT_EQ(VariableLengthKernelFor(in.q.to(torch::kBFloat16), kHeadDim, false, true), nullptr);
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no flash attention operator";
  }
  const absl::StatusOr<c10::FunctionSchema> forward =
      OperatorSchema("aten::_flash_attention_forward");
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_TRUE(BindArguments(*forward, FlashForwardArguments(in.q, in.k, in.v, in.offsets,
                                                            in.offsets, 6, 6, true, in.scale))
                  .ok());
  const absl::StatusOr<c10::FunctionSchema> backward =
      OperatorSchema("aten::_flash_attention_backward");
  ASSERT_TRUE(backward.ok()) << backward.status();
  EXPECT_TRUE(BindArguments(*backward,
                            FlashBackwardArguments(in.q, in.q, in.k, in.v, in.q,
                                                   torch::zeros({2, 10}), in.offsets, in.offsets,
                                                   6, 6, true,
                                                   {torch::tensor({1}), torch::tensor({2})},
                                                   in.scale))
                  .ok());
}

}  // namespace
}  // namespace varipipe::executor
