#include "tests/testing/context_lanes.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/config/rank_layout.h"
#include "common/plan_contract/context_parallel_split.h"

namespace varipipe::testing {
namespace {

using google::protobuf::RepeatedField;
using google::protobuf::RepeatedPtrField;

// Whether an instruction belongs to a micro-batch (and is dropped with it).
bool OfMicroBatch(const v1::Instruction& in) {
  return !in.has_all_reduce() && !in.has_optimizer_step() && !in.has_free_buffer();
}

// The buffer ids an instruction names (mutable, for renumbering).
std::vector<RepeatedField<uint32_t>*> BufferIds(v1::Instruction& in) {
  switch (in.op_case()) {
    case v1::Instruction::kLoadInput:
      return {in.mutable_load_input()->mutable_buffer_ids()};
    case v1::Instruction::kForward:
      return {in.mutable_forward()->mutable_input_buffer_ids(),
              in.mutable_forward()->mutable_output_buffer_ids()};
    case v1::Instruction::kBackward:
      return {in.mutable_backward()->mutable_output_grad_buffer_ids(),
              in.mutable_backward()->mutable_input_grad_buffer_ids()};
    case v1::Instruction::kSendStart:
      return {in.mutable_send_start()->mutable_buffer_ids()};
    case v1::Instruction::kSendWait:
      return {in.mutable_send_wait()->mutable_buffer_ids()};
    case v1::Instruction::kRecvStart:
      return {in.mutable_recv_start()->mutable_buffer_ids()};
    case v1::Instruction::kRecvWait:
      return {in.mutable_recv_wait()->mutable_buffer_ids()};
    case v1::Instruction::kFreeBuffer:
      return {in.mutable_free_buffer()->mutable_buffer_ids()};
    default:
      return {};
  }
}

// The tensor shapes an instruction names.
std::vector<RepeatedPtrField<v1::TensorSpec>*> Specs(v1::Instruction& in) {
  switch (in.op_case()) {
    case v1::Instruction::kLoadInput:
      return {in.mutable_load_input()->mutable_tensors()};
    case v1::Instruction::kForward:
      return {in.mutable_forward()->mutable_output_tensors()};
    case v1::Instruction::kBackward:
      return {in.mutable_backward()->mutable_input_grad_tensors()};
    case v1::Instruction::kSendStart:
      return {in.mutable_send_start()->mutable_tensors()};
    case v1::Instruction::kSendWait:
      return {in.mutable_send_wait()->mutable_tensors()};
    case v1::Instruction::kRecvStart:
      return {in.mutable_recv_start()->mutable_tensors()};
    case v1::Instruction::kRecvWait:
      return {in.mutable_recv_wait()->mutable_tensors()};
    default:
      return {};
  }
}

v1::Transfer* TransferOf(v1::Instruction& in) {
  switch (in.op_case()) {
    case v1::Instruction::kSendStart:
      return in.mutable_send_start();
    case v1::Instruction::kSendWait:
      return in.mutable_send_wait();
    case v1::Instruction::kRecvStart:
      return in.mutable_recv_start();
    case v1::Instruction::kRecvWait:
      return in.mutable_recv_wait();
    default:
      return nullptr;
  }
}

}  // namespace

v1::ContextPlacement SplitAll(const v1::MicroBatch&) {
  v1::ContextPlacement placement;
  placement.set_split(true);
  return placement;
}

ContextPlacementFn SplitEvenIds(uint32_t lanes) {
  return [lanes](const v1::MicroBatch& mb) {
    v1::ContextPlacement placement;
    placement.set_split(mb.id() % 2 == 0);
    if (!placement.split()) placement.set_lane(mb.id() / 2 % lanes);
    return placement;
  };
}

absl::StatusOr<std::vector<v1::ExecutionPlan>> LowerToContextLanes(
    const std::vector<v1::ExecutionPlan>& plans, const v1::JobConfig& config, uint32_t context,
    const ContextPlacementFn& placement) {
  v1::ParallelismConfig whole_parallelism = config.parallelism();
  whole_parallelism.set_context(1);
  const RankLayout whole = RankLayout::Of(whole_parallelism);
  v1::ParallelismConfig lane_parallelism = config.parallelism();
  lane_parallelism.set_context(context);
  const RankLayout lanes = RankLayout::Of(lane_parallelism);
  if (static_cast<int>(plans.size()) != whole.plan_ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat(plans.size(), " plans for ", whole.plan_ranks(), " ranks"));
  }
  std::vector<v1::ExecutionPlan> out(static_cast<size_t>(lanes.plan_ranks()));
  for (const v1::ExecutionPlan& plan : plans) {
    const uint32_t dp = static_cast<uint32_t>(plan.dp_rank());
    const uint32_t pp = static_cast<uint32_t>(plan.pp_rank());
    for (uint32_t k = 0; k < context; ++k) {
      v1::ExecutionPlan lane = plan;
      lane.set_rank(lanes.Rank(dp, pp, k));
      lane.set_context_parallel(context);
      lane.set_context_rank(k);
      // Which micro-batches this lane runs, and each split one's length.
      std::map<uint32_t, int64_t> split_length;
      std::set<uint32_t> runs;
      for (v1::MicroBatch& mb : *lane.mutable_micro_batches()) {
        *mb.mutable_context() = placement(mb);
        if (!mb.context().split()) {
          if (mb.context().lane() == k) runs.insert(mb.id());
          continue;
        }
        std::vector<int64_t> lengths;
        for (int i = 0; i < mb.sample_ids_size(); ++i) {
          lengths.push_back(int64_t{mb.sample_input_lens(i)} + mb.sample_target_lens(i));
        }
        absl::StatusOr<ContextParallelSplit> split =
            ContextParallelSplit::Of(lengths, static_cast<int>(context), static_cast<int>(k));
        if (!split.ok()) return split.status();
        mb.set_input_len(static_cast<uint32_t>(split->all_gather_count()));
        mb.set_target_len(0);
        mb.clear_row_starts();
        mb.clear_packed_attention();
        for (uint32_t& offset : *mb.mutable_sample_input_offsets()) offset = 0;
        split_length[mb.id()] = split->all_gather_count();
        runs.insert(mb.id());
      }
      // The lane's instructions; buffers of dropped ones are dropped too.
      std::set<uint32_t> dropped_buffers;
      RepeatedPtrField<v1::Instruction> kept;
      for (const v1::Instruction& original : plan.instructions()) {
        v1::Instruction in = original;
        if (OfMicroBatch(in) && runs.count(in.micro_batch()) == 0) {
          for (RepeatedField<uint32_t>* ids : BufferIds(in)) {
            dropped_buffers.insert(ids->begin(), ids->end());
          }
          continue;
        }
        if (in.has_free_buffer()) {
          RepeatedField<uint32_t> left;
          for (uint32_t id : in.free_buffer().buffer_ids()) {
            if (dropped_buffers.count(id) == 0) left.Add(id);
          }
          if (left.empty()) continue;
          *in.mutable_free_buffer()->mutable_buffer_ids() = left;
        }
        if (OfMicroBatch(in) && split_length.count(in.micro_batch()) > 0) {
          const int64_t a = split_length.at(in.micro_batch());
          for (RepeatedPtrField<v1::TensorSpec>* specs : Specs(in)) {
            for (v1::TensorSpec& spec : *specs) {
              spec.set_dims(0, 1);
              spec.set_dims(1, a);
            }
          }
        }
        if (v1::Transfer* t = TransferOf(in); t != nullptr) {
          t->set_peer(lanes.Rank(whole.DpRank(t->peer()), whole.PpRank(t->peer()), k));
        }
        if (in.has_all_reduce()) {
          std::vector<int> group;
          for (int r : in.all_reduce().group_ranks()) {
            for (uint32_t j = 0; j < context; ++j) {
              group.push_back(lanes.Rank(whole.DpRank(r), whole.PpRank(r), j));
            }
          }
          if (group.empty()) group = lanes.DataParallelGroup(pp);
          std::sort(group.begin(), group.end());
          in.mutable_all_reduce()->clear_group_ranks();
          for (int r : group) in.mutable_all_reduce()->add_group_ranks(r);
        }
        *kept.Add() = std::move(in);
      }
      // Dense buffer ids, in order of first use.
      std::map<uint32_t, uint32_t> renumbered;
      for (v1::Instruction& in : kept) {
        for (RepeatedField<uint32_t>* ids : BufferIds(in)) {
          for (uint32_t& id : *ids) {
            id = renumbered.try_emplace(id, static_cast<uint32_t>(renumbered.size())).first->second;
          }
        }
      }
      lane.set_num_buffers(static_cast<uint32_t>(renumbered.size()));
      *lane.mutable_instructions() = std::move(kept);
      out[static_cast<size_t>(lane.rank())] = std::move(lane);
    }
  }
  return out;
}

}  // namespace varipipe::testing
