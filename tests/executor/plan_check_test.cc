// The executor's plan check: every plan the planner emits passes it (GPT and
// T5, every schedule, recompute mode and partition method, including packed
// micro-batches, zero-bubble plans with split backwards), and each kind of
// corruption, wrong orders of weight_grads included, is refused with an error
// that names the iteration, rank, instruction and field.
#include "executor/runtime/plan_check.h"

#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/minibatch_sampler.h"
#include "common/dataset/sample_dataset.h"
#include "common/plan_contract/buffer_lifetimes.h"
#include "common/plan_contract/weight_grad_order.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan/validator.h"
#include "planner/planner.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

struct JobShape {
  bool t5 = false;
  uint32_t pp = 2;
  uint32_t dp = 1;
  uint32_t chunks = 1;
  v1::ScheduleKind schedule = v1::ONE_F_ONE_B;
  v1::RecomputeMode recompute = v1::RECOMPUTE_NONE;
  v1::PartitionMethod method = v1::DYNAMIC_PROGRAMMING;
  // Small enough that a mini-batch needs several micro-batches.
  uint32_t memory_mib = 4;
};

v1::JobConfig Config(const JobShape& s) {
  const std::string json = absl::StrCat(
      R"({"job_id": "check", "model": {"kind": ")", s.t5 ? "T5" : "GPT", R"(", "num_layers": 6, )",
      s.t5 ? R"("num_decoder_layers": 6, )" : "",
      R"("hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 64, "vocab_size": 61,
         "dtype": "FLOAT32"},
      "parallelism": {"pipeline": )",
      s.pp, R"(, "data": )", s.dp, R"(, "virtual_chunks": )", s.chunks, R"(},
      "cluster": {"device_memory_limit_mib": )",
      s.memory_mib, R"(, "devices_per_node": 8},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 1600,
               "max_sequence_length": 96, )",
      s.t5 ? R"("max_target_length": 48, )" : "",
      R"("seed": 5, "synthetic_num_samples": 5000},
      "planner": {"tmax_interval_ms": 0.01},
      "training": {"iterations": 10}})");
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(json, "test");
  EXPECT_THAT(config, IsOk());
  v1::PlannerConfig& planner = *config->mutable_planner();
  planner.clear_schedules();
  planner.add_schedules(s.schedule);
  planner.clear_recompute_modes();
  planner.add_recompute_modes(s.recompute);
  planner.clear_partition_methods();
  planner.add_partition_methods(s.method);
  ApplyJobConfigDefaults(*config);
  EXPECT_THAT(ValidateJobConfig(*config, "test"), IsOk());
  return *config;
}

// The planner's answer for `iteration` of `config`'s data.
absl::StatusOr<planner::PlanningResult> PlanIteration(const v1::JobConfig& config,
                                                      uint64_t iteration) {
  absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(config);
  if (!dataset.ok()) return dataset.status();
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> sampler =
      MiniBatchSampler::Create((*dataset)->AllLengths(), SamplerOptionsFromConfig(config));
  if (!sampler.ok()) return sampler.status();
  const SampledMiniBatch sampled = (*sampler)->Get(iteration);
  absl::StatusOr<planner::Planner> planner = planner::Planner::Create(config);
  if (!planner.ok()) return planner.status();
  return planner->Plan(
      {.iteration = iteration, .sample_ids = sampled.sample_ids, .lengths = sampled.lengths});
}

std::vector<v1::ExecutionPlan> Plans(const v1::JobConfig& config, uint64_t iteration) {
  absl::StatusOr<planner::PlanningResult> result = PlanIteration(config, iteration);
  EXPECT_THAT(result, IsOk());
  return result.ok() ? result->plans : std::vector<v1::ExecutionPlan>{};
}

// The plans of `iteration`, or none when the planner finds no feasible plan.
std::vector<v1::ExecutionPlan> PlansIfFeasible(const v1::JobConfig& config, uint64_t iteration) {
  absl::StatusOr<planner::PlanningResult> result = PlanIteration(config, iteration);
  return result.ok() ? result->plans : std::vector<v1::ExecutionPlan>{};
}

PlanRecipient RecipientOf(const v1::ExecutionPlan& plan) {
  return {.iteration = plan.iteration(),
          .rank = plan.rank(),
          .dp_rank = plan.dp_rank(),
          .pp_rank = plan.pp_rank(),
          .layers = std::nullopt};
}

std::string Name(const JobShape& s) {
  return absl::StrCat(s.t5 ? "T5" : "GPT", " pp ", s.pp, " dp ", s.dp, " v ", s.chunks, " ",
                      v1::ScheduleKind_Name(s.schedule), " ", v1::RecomputeMode_Name(s.recompute),
                      " ", v1::PartitionMethod_Name(s.method));
}

TEST(PlanCheck, EveryPlanThePlannerEmitsPasses) {
  std::vector<JobShape> shapes;
  for (bool t5 : {false, true}) {
    for (v1::ScheduleKind schedule : {v1::GPIPE, v1::ONE_F_ONE_B, v1::KFKB, v1::ADAPTIVE}) {
      for (v1::RecomputeMode recompute :
           {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL}) {
        shapes.push_back(
            {.t5 = t5, .pp = 2, .dp = 2, .schedule = schedule, .recompute = recompute});
      }
    }
    for (v1::PartitionMethod method : {v1::TOKEN_BASED, v1::FIXED_SIZE, v1::PACKING, v1::PADDING}) {
      shapes.push_back({.t5 = t5, .pp = 3, .dp = 1, .method = method});
    }
  }
  for (bool t5 : {false, true}) {
    for (v1::ScheduleKind schedule : {v1::ZERO_BUBBLE_H1, v1::ADAPTIVE_ZERO_BUBBLE}) {
      shapes.push_back({.t5 = t5, .pp = 2, .dp = 2, .schedule = schedule});
    }
  }
  shapes.push_back({.pp = 2, .chunks = 3, .schedule = v1::INTERLEAVED_1F1B});
  shapes.push_back({.pp = 3, .chunks = 2, .schedule = v1::INTERLEAVED_1F1B});
  int checked = 0;
  bool packed = false;
  for (JobShape shape : shapes) {
    for (uint64_t iteration : {0, 1}) {
      // The smallest memory limit that plans: several micro-batches, and
      // GPipe (which keeps all of them) still fits.
      std::vector<v1::ExecutionPlan> plans;
      v1::JobConfig config;
      for (shape.memory_mib = 4; shape.memory_mib <= 64 && plans.empty(); shape.memory_mib *= 2) {
        config = Config(shape);
        plans = PlansIfFeasible(config, iteration);
      }
      ASSERT_EQ(plans.size(), shape.pp * shape.dp) << Name(shape) << " iteration " << iteration;
      for (const v1::ExecutionPlan& plan : plans) {
        EXPECT_THAT(CheckPlan(plan, config, RecipientOf(plan)), IsOk()) << Name(shape);
        for (const v1::MicroBatch& mb : plan.micro_batches()) packed |= !mb.row_starts().empty();
        ++checked;
      }
    }
  }
  std::printf("%d plans of %zu job shapes passed the check\n", checked, shapes.size());
  EXPECT_TRUE(packed) << "no packed micro-batch was checked";
}

// One contract on both sides: an instruction of a planner-made plan moved
// elsewhere is refused by the planner's validator and by the executor's
// check at the same instruction whenever it breaks a rule of the plan
// contract (buffer lifetimes, the weight-gradient order), and the plan
// check then says what the contract says.
TEST(PlanCheck, AgreesWithTheValidatorOnEveryContractViolation) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int refused = 0;
  for (const v1::ScheduleKind schedule : {v1::ONE_F_ONE_B, v1::ADAPTIVE_ZERO_BUBBLE}) {
    const v1::JobConfig config = Config({.pp = 2, .dp = 1, .schedule = schedule, .memory_mib = 16});
    const std::vector<v1::ExecutionPlan> plans = Plans(config, 0);
    ASSERT_EQ(plans.size(), 2u);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<v1::ExecutionPlan> moved = plans;
      v1::ExecutionPlan& plan = moved[trial % 2];
      const int n = plan.instructions_size();
      const int from = std::uniform_int_distribution<int>(0, n - 1)(rng);
      const int to = std::uniform_int_distribution<int>(0, n - 1)(rng);
      auto& instructions = *plan.mutable_instructions();
      for (int i = from; i < to; ++i) instructions.SwapElements(i, i + 1);
      for (int i = from; i > to; --i) instructions.SwapElements(i, i - 1);
      std::optional<plan_contract::ContractViolation> violation =
          plan_contract::CheckWeightGradOrder(plan);
      if (!violation.has_value()) violation = plan_contract::CheckBufferLifetimes(plan);
      if (!violation.has_value()) continue;
      ++refused;
      const std::string where = absl::StrCat("move ", from, " -> ", to, ": ");
      EXPECT_THAT(
          CheckPlan(plan, config, RecipientOf(plan)),
          StatusIs(absl::StatusCode::kInvalidArgument,
                   AllOf(HasSubstr(absl::StrCat("instruction #", violation->instruction, " (")),
                         HasSubstr(violation->Describe()))))
          << where;
      EXPECT_THAT(planner::ValidatePlans(moved),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           AllOf(HasSubstr(absl::StrCat("rank ", plan.rank(), ", instruction ",
                                                        violation->instruction, ": ")),
                                 HasSubstr(violation->Describe()))))
          << where;
    }
  }
  EXPECT_GT(refused, 20);
}

// Plans record the job's stage layout; an executor whose model was built
// with another refuses them, naming both.
TEST(PlanCheck, RefusesAPlanForAnotherStageLayout) {
  v1::JobConfig config = Config({.pp = 2, .memory_mib = 16});
  config.mutable_parallelism()->mutable_stage_layout()->add_layers(5);
  config.mutable_parallelism()->mutable_stage_layout()->add_layers(1);
  ASSERT_THAT(ValidateJobConfig(config, "test"), IsOk());
  const std::vector<v1::ExecutionPlan> plans = Plans(config, 0);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_THAT(plans[0].stage_layers(), ::testing::ElementsAre(5, 1));
  PlanRecipient recipient = RecipientOf(plans[1]);
  recipient.layers = LayerLayout{.encoder = {5, 1}, .decoder = {0, 0}};
  EXPECT_THAT(CheckPlan(plans[1], config, recipient), IsOk());
  recipient.layers = LayerLayout{.encoder = {3, 3}, .decoder = {0, 0}};
  EXPECT_THAT(CheckPlan(plans[1], config, recipient),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage_layers is 5+1 but this executor's model was built with "
                                 "3+3")));
}

// A micro-batch may carry its own recompute mode (MicroBatch.recompute):
// empty (the plan's) or none, selective or full pass on every micro-batch,
// whatever the plan's mode; anything else is refused naming the micro-batch.
TEST(PlanCheck, MicroBatchRecomputeModes) {
  const v1::JobConfig config = Config({.pp = 2, .dp = 1});
  const std::vector<v1::ExecutionPlan> plans = Plans(config, 3);
  ASSERT_EQ(plans.size(), 2u);
  const std::vector<std::string> good = {"", "none", "selective", "full"};
  for (const char* plan_mode : {"none", "selective", "full"}) {
    for (size_t shift = 0; shift < good.size(); ++shift) {
      v1::ExecutionPlan plan = plans[1];
      plan.set_recompute(plan_mode);
      ASSERT_GE(plan.micro_batches_size(), 2);
      for (int i = 0; i < plan.micro_batches_size(); ++i) {
        plan.mutable_micro_batches(i)->set_recompute(good[(i + shift) % good.size()]);
      }
      EXPECT_THAT(CheckPlan(plan, config, RecipientOf(plan)), IsOk())
          << "plan " << plan_mode << ", shift " << shift;
    }
  }
  // Case and spaces matter; an empty plan-wide mode is no mode.
  for (const char* bad : {"FULL", "Selective", " none", "none ", "recompute", "0"}) {
    for (int i : {0, plans[1].micro_batches_size() - 1}) {
      v1::ExecutionPlan plan = plans[1];
      plan.mutable_micro_batches(i)->set_recompute(bad);
      EXPECT_THAT(CheckPlan(plan, config, RecipientOf(plan)),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr(absl::StrCat("micro_batches[", i, "].recompute is '", bad,
                                                  "' (expected none, selective or full)"))));
    }
  }
  v1::ExecutionPlan plan = plans[1];
  plan.set_recompute("");
  plan.mutable_micro_batches(0)->set_recompute("full");
  EXPECT_THAT(CheckPlan(plan, config, RecipientOf(plan)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("recompute is ''")));
}

// A corruption of rank 1's plan (GPT, pp 2) and what the error must name.
struct Corruption {
  std::string name;
  std::function<void(v1::ExecutionPlan&)> apply;
  std::vector<std::string> expected;
};

// Index of the first instruction of `kind`.
int First(const v1::ExecutionPlan& plan, v1::Instruction::OpCase kind) {
  for (int i = 0; i < plan.instructions_size(); ++i) {
    if (plan.instructions(i).op_case() == kind) return i;
  }
  return -1;
}

v1::Instruction& FirstOf(v1::ExecutionPlan& plan, v1::Instruction::OpCase kind) {
  const int i = First(plan, kind);
  EXPECT_GE(i, 0);
  return *plan.mutable_instructions(i);
}

std::vector<Corruption> Corruptions() {
  return {
      {"HugeBufferCount",
       [](v1::ExecutionPlan& p) { p.set_num_buffers(4294967295u); },
       {"num_buffers", "4294967295"}},
      {"UnknownBufferId",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kForward)
             .mutable_forward()
             ->set_input_buffer_ids(0, p.num_buffers() + 7);
       },
       {"forward.input_buffer_ids[0]", "num_buffers"}},
      {"LengthBeyondTheConfig",
       [](v1::ExecutionPlan& p) { p.mutable_micro_batches(0)->set_input_len(1 << 20); },
       {"micro_batches[0].input_len", "data.max_sequence_length"}},
      {"ActivationWiderThanTheModel",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kRecvStart)
             .mutable_recv_start()
             ->mutable_tensors(0)
             ->set_dims(2, 1 << 30);
       },
       {"instruction #", "recv_start", "tensors[0].dims[2]", "model.hidden_size"}},
      {"MoreRowsThanTheMicroBatch",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kLoadInput)
             .mutable_load_input()
             ->mutable_tensors(0)
             ->set_dims(0, 100000);
       },
       {"load_input.tensors[0].dims[0]", "rows"}},
      {"BufferIdsWithoutTensors",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kRecvStart).mutable_recv_start()->clear_tensors();
       },
       {"tensors", "has 0 entries"}},
      {"EmptyContents",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kLoadInput).mutable_load_input()->clear_contents();
       },
       {"load_input.contents"}},
      {"ForwardOutputsWithoutShapes",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kBackward).mutable_backward()->add_input_grad_buffer_ids(0);
       },
       {"backward.input_grad_tensors"}},
      {"PeerOutsideTheWorld",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kRecvWait).mutable_recv_wait()->set_peer(9);
       },
       {"peer", "is 9"}},
      {"EmptyInstruction",
       [](v1::ExecutionPlan& p) { p.mutable_instructions(2)->Clear(); },
       {"instruction #2", "op"}},
      {"UnknownMicroBatch",
       [](v1::ExecutionPlan& p) {
         FirstOf(p, v1::Instruction::kForward).set_micro_batch(p.micro_batches_size());
       },
       {"micro_batch", "micro-batches"}},
      {"StageOfAnotherRank",
       [](v1::ExecutionPlan& p) { FirstOf(p, v1::Instruction::kBackward).set_stage(0); },
       {"stage", "not one of the plan's stages"}},
      {"WrongRank", [](v1::ExecutionPlan& p) { p.set_rank(0); }, {"rank", "does not match"}},
      {"SampleLengthsMissing",
       [](v1::ExecutionPlan& p) { p.mutable_micro_batches(0)->clear_sample_input_lens(); },
       {"micro_batches[0].sample_input_lens", "one per sample"}},
      {"SampleWithoutTokens",
       [](v1::ExecutionPlan& p) {
         v1::MicroBatch& mb = *p.mutable_micro_batches(0);
         mb.set_sample_input_lens(0, 0);
         mb.set_sample_target_lens(0, 0);
       },
       {"micro_batches[0].sample_input_lens[0]", "no tokens"}},
      {"SampleBeyondThePaddedLength",
       [](v1::ExecutionPlan& p) {
         v1::MicroBatch& mb = *p.mutable_micro_batches(0);
         mb.set_sample_input_offsets(0, mb.input_len());
       },
       {"micro_batches[0].sample_input_offsets[0]", "padded length"}},
      {"PackedAttentionOutOfPlace",
       [](v1::ExecutionPlan& p) {
         // Unpacked: no kernel to choose; packed: an unknown one.
         v1::MicroBatch& mb = *p.mutable_micro_batches(0);
         mb.set_packed_attention(mb.row_starts().empty() ? v1::BLOCK_DIAGONAL_MASK
                                                         : static_cast<v1::PackedAttention>(7));
       },
       {"micro_batches[0].packed_attention"}},
      {"UnknownMicroBatchRecompute",
       [](v1::ExecutionPlan& p) {
         p.mutable_micro_batches(p.micro_batches_size() - 1)->set_recompute("partial");
       },
       {"micro_batches[", "].recompute is 'partial' (expected none, selective or full)"}},
  };
}

class PlanCheckCorruption : public ::testing::TestWithParam<Corruption> {};

TEST_P(PlanCheckCorruption, IsRefusedNamingTheField) {
  const v1::JobConfig config = Config({.pp = 2, .dp = 1});
  std::vector<v1::ExecutionPlan> plans = Plans(config, 3);
  ASSERT_EQ(plans.size(), 2u);
  v1::ExecutionPlan plan = plans[1];
  const PlanRecipient recipient = RecipientOf(plan);
  ASSERT_THAT(CheckPlan(plan, config, recipient), IsOk());
  GetParam().apply(plan);
  const absl::Status status = CheckPlan(plan, config, recipient);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("plan of iteration 3 for rank"))));
  for (const std::string& part : GetParam().expected) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(part));
  }
  std::printf("%s: %s\n", GetParam().name.c_str(), std::string(status.message()).c_str());
}

INSTANTIATE_TEST_SUITE_P(Plans, PlanCheckCorruption, ::testing::ValuesIn(Corruptions()),
                         [](const auto& info) { return info.param.name; });

// Wrong orders of split backwards (zero-bubble plans), each refused naming
// the instruction: CheckPlan includes CheckWeightGradOrder.
struct OrderFault {
  std::string name;
  std::function<void(v1::ExecutionPlan&)> apply;
  std::vector<std::string> expected;
};

// Index of the last weight_grad.
int LastWeightGrad(const v1::ExecutionPlan& plan) {
  int last = -1;
  for (int i = 0; i < plan.instructions_size(); ++i) {
    if (plan.instructions(i).has_weight_grad()) last = i;
  }
  EXPECT_GE(last, 0);
  return last;
}

// Moves instruction `from` to position `to`, shifting those between.
void Move(v1::ExecutionPlan& plan, int from, int to) {
  for (int i = from; i < to; ++i) plan.mutable_instructions()->SwapElements(i, i + 1);
  for (int i = from; i > to; --i) plan.mutable_instructions()->SwapElements(i, i - 1);
}

std::vector<OrderFault> OrderFaults() {
  return {
      {"WeightGradBeforeItsBackward",
       [](v1::ExecutionPlan& p) { Move(p, LastWeightGrad(p), 0); },
       {"instruction #0 (weight_grad", "without a backward with weight_grad_deferred"}},
      {"WeightGradTwice",
       [](v1::ExecutionPlan& p) {
         const int w = LastWeightGrad(p);
         *p.add_instructions() = p.instructions(w);
         Move(p, p.instructions_size() - 1, w + 1);
       },
       {"(weight_grad", "weight_grad runs twice (first at instruction #"}},
      {"WeightGradAfterTheAllReduce",
       [](v1::ExecutionPlan& p) { Move(p, LastWeightGrad(p), p.instructions_size() - 1); },
       {"(all_reduce", "reads the gradients before the weight_grad of micro-batch"}},
      {"WeightGradNeverComes",
       [](v1::ExecutionPlan& p) {
         p.mutable_instructions()->DeleteSubrange(LastWeightGrad(p), 1);
         while (!p.instructions(p.instructions_size() - 1).has_backward() &&
                !p.instructions(p.instructions_size() - 1).has_weight_grad()) {
           p.mutable_instructions()->RemoveLast();
         }
       },
       {"(backward",
        "defers its weight gradient (weight_grad_deferred) but no weight_grad follows"}},
      {"SecondDeferredBackward",
       [](v1::ExecutionPlan& p) {
         const int w = LastWeightGrad(p);
         v1::Instruction backward;
         for (int i = 0; i < w; ++i) {
           if (p.instructions(i).has_backward() &&
               p.instructions(i).micro_batch() == p.instructions(w).micro_batch()) {
             backward = p.instructions(i);
           }
         }
         *p.add_instructions() = backward;
         Move(p, p.instructions_size() - 1, w + 1);
       },
       {"(backward", "a second backward with weight_grad_deferred"}},
  };
}

class PlanCheckWeightGradOrder : public ::testing::TestWithParam<OrderFault> {};

TEST_P(PlanCheckWeightGradOrder, IsRefusedNamingTheInstruction) {
  const v1::JobConfig config = Config({.pp = 2, .dp = 1, .schedule = v1::ZERO_BUBBLE_H1});
  std::vector<v1::ExecutionPlan> plans = Plans(config, 3);
  ASSERT_EQ(plans.size(), 2u);
  v1::ExecutionPlan plan = plans[1];
  const PlanRecipient recipient = RecipientOf(plan);
  ASSERT_THAT(CheckPlan(plan, config, recipient), IsOk());
  GetParam().apply(plan);
  const absl::Status status = CheckPlan(plan, config, recipient);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               HasSubstr("plan of iteration 3 for rank 1: instruction #")));
  for (const std::string& part : GetParam().expected) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(part));
  }
  EXPECT_EQ(CheckWeightGradOrder(plan), status);
  std::printf("%s: %s\n", GetParam().name.c_str(), std::string(status.message()).c_str());
}

INSTANTIATE_TEST_SUITE_P(ZeroBubblePlans, PlanCheckWeightGradOrder,
                         ::testing::ValuesIn(OrderFaults()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace varipipe::executor
