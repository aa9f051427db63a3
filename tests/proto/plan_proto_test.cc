// The plan schema is a contract with external tools: field names, numbers and
// the JSON rendering (proto field names) must not drift.
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "varipipe/v1/plan.pb.h"
#include "varipipe/v1/service.pb.h"

namespace varipipe {
namespace {

using ::testing::HasSubstr;

v1::ExecutionPlan SamplePlan() {
  v1::ExecutionPlan plan;
  plan.set_format_version(v1::PLAN_FORMAT_V1);
  plan.set_job_id("job");
  plan.set_iteration(7);
  plan.set_rank(1);
  plan.set_dp_rank(0);
  plan.set_pp_rank(1);
  plan.add_stages(1);
  plan.set_recompute("none");
  plan.set_num_buffers(2);
  v1::MicroBatch* mb = plan.add_micro_batches();
  mb->set_id(0);
  mb->add_sample_ids(42);
  mb->add_sample_ids(7);
  mb->set_input_len(128);
  v1::Instruction* recv = plan.add_instructions();
  recv->set_micro_batch(0);
  recv->set_stage(1);
  v1::Transfer* transfer = recv->mutable_recv_start();
  transfer->set_kind(v1::ACTIVATION);
  transfer->set_peer(0);
  transfer->add_buffer_ids(0);
  v1::TensorSpec* spec = transfer->add_tensors();
  spec->add_dims(2);
  spec->add_dims(128);
  spec->add_dims(256);
  spec->set_dtype(v1::BFLOAT16);
  *plan.add_instructions()->mutable_recv_wait() = *transfer;
  plan.add_instructions()->mutable_forward()->add_input_buffer_ids(0);
  plan.add_instructions()->mutable_free_buffer()->add_buffer_ids(0);
  plan.add_instructions()->mutable_optimizer_step()->add_stages(1);
  return plan;
}

// Field numbers fixed by the foundation issue; changing one breaks every
// stored plan and external reader.
TEST(PlanSchema, FieldNumbersAreStable) {
  const auto* instruction = v1::Instruction::descriptor();
  EXPECT_EQ(instruction->FindFieldByName("micro_batch")->number(), 1);
  EXPECT_EQ(instruction->FindFieldByName("stage")->number(), 2);
  const std::pair<const char*, int> ops[] = {
      {"load_input", 10}, {"forward", 11},       {"backward", 12},  {"send_start", 13},
      {"send_wait", 14},  {"recv_start", 15},    {"recv_wait", 16}, {"free_buffer", 17},
      {"all_reduce", 18}, {"optimizer_step", 19}};
  for (const auto& [name, number] : ops) {
    ASSERT_NE(instruction->FindFieldByName(name), nullptr) << name;
    EXPECT_EQ(instruction->FindFieldByName(name)->number(), number) << name;
    EXPECT_EQ(instruction->FindFieldByName(name)->containing_oneof()->name(), "op");
  }
  const auto* plan = v1::ExecutionPlan::descriptor();
  const std::pair<const char*, int> plan_fields[] = {
      {"format_version", 1}, {"job_id", 2},       {"iteration", 3},    {"rank", 4},
      {"dp_rank", 5},        {"pp_rank", 6},      {"stages", 7},       {"micro_batches", 8},
      {"recompute", 9},      {"num_buffers", 10}, {"instructions", 11}};
  for (const auto& [name, number] : plan_fields) {
    ASSERT_NE(plan->FindFieldByName(name), nullptr) << name;
    EXPECT_EQ(plan->FindFieldByName(name)->number(), number) << name;
  }
  EXPECT_EQ(v1::DType_descriptor()->FindValueByName("INT64")->number(), 4);
  EXPECT_EQ(v1::CommKind_descriptor()->FindValueByName("GRADIENT")->number(), 2);
  EXPECT_EQ(v1::MicroBatch::descriptor()->FindFieldByName("target_len")->number(), 4);
  EXPECT_EQ(v1::Transfer::descriptor()->FindFieldByName("tensors")->number(), 4);
}

TEST(PlanSchema, JsonUsesProtoFieldNamesAndRoundTrips) {
  const v1::ExecutionPlan plan = SamplePlan();
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(plan, &json, options).ok());
  EXPECT_THAT(json, HasSubstr("\"micro_batches\""));
  EXPECT_THAT(json, HasSubstr("\"recv_start\""));
  EXPECT_THAT(json, HasSubstr("\"dtype\":\"BFLOAT16\""));
  v1::ExecutionPlan parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(plan, parsed));
}

std::string DeterministicBytes(const google::protobuf::Message& message) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

TEST(PlanSchema, BinaryRoundTripIsByteIdentical) {
  const v1::ExecutionPlan plan = SamplePlan();
  const std::string bytes = DeterministicBytes(plan);
  v1::ExecutionPlan parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(DeterministicBytes(parsed), bytes);
  EXPECT_EQ(DeterministicBytes(SamplePlan()), bytes);
}

TEST(ServiceSchema, EnvelopeCarriesAPlan) {
  v1::PlanEnvelope envelope;
  *envelope.mutable_plan() = SamplePlan();
  envelope.set_planner_id("planner-a");
  v1::PlanEnvelope parsed;
  ASSERT_TRUE(parsed.ParseFromString(envelope.SerializeAsString()));
  EXPECT_EQ(parsed.plan().instructions_size(), 5);
  EXPECT_EQ(parsed.plan().instructions(1).op_case(), v1::Instruction::kRecvWait);
}

}  // namespace
}  // namespace varipipe
