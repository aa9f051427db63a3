#include "executor/runtime/plan_check.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/plan_contract/buffer_lifetimes.h"
#include "common/plan_contract/context_parallel_split.h"
#include "common/plan_contract/format_version.h"
#include "common/plan_contract/instruction_text.h"
#include "common/plan_contract/micro_batch_rows.h"
#include "common/plan_contract/sample_placement.h"
#include "common/plan_contract/weight_grad_order.h"
#include "google/protobuf/repeated_field.h"

namespace varipipe::executor {
namespace {

template <typename T>
using Repeated = google::protobuf::RepeatedField<T>;
using Specs = google::protobuf::RepeatedPtrField<v1::TensorSpec>;

bool IsFloat(v1::DType dtype) {
  return dtype == v1::FLOAT32 || dtype == v1::BFLOAT16 || dtype == v1::FLOAT16;
}

using plan_contract::MicroBatchRows;
using plan_contract::OpName;
using plan_contract::WhereInPlan;

class PlanChecker {
 public:
  PlanChecker(const v1::ExecutionPlan& plan, const v1::JobConfig& config,
              const PlanRecipient& recipient)
      : plan_(plan), config_(config), recipient_(recipient) {
    const v1::ParallelismConfig& p = config.parallelism();
    context_ = std::max(1u, p.context());
    // Plan ranks (transfers and groups name them).
    world_ = static_cast<int64_t>(std::max(1u, p.pipeline())) * std::max(1u, p.data()) * context_;
    stages_ = static_cast<uint64_t>(std::max(1u, p.pipeline())) * std::max(1u, p.virtual_chunks());
    t5_ = config.model().kind() == v1::T5;
    max_input_ = config.data().max_sequence_length();
    max_target_ = t5_ ? config.data().max_target_length() : config.data().max_sequence_length();
    if (max_target_ == 0) max_target_ = max_input_;
  }

  absl::Status Check() {
    if (absl::Status s = CheckHeader(); !s.ok()) return s;
    for (int i = 0; i < plan_.micro_batches_size(); ++i) {
      if (absl::Status s = CheckMicroBatch(i); !s.ok()) return s;
    }
    uint64_t named_buffers = 0;
    for (int i = 0; i < plan_.instructions_size(); ++i) {
      index_ = i;
      if (absl::Status s = CheckInstruction(plan_.instructions(i), &named_buffers); !s.ok()) {
        return s;
      }
    }
    index_ = -1;
    // Every buffer is written by some instruction, so a plan never needs more
    // buffers than the ids its instructions name; this bounds what the
    // interpreter allocates by the plan's own size.
    if (plan_.num_buffers() > named_buffers) {
      return Error("num_buffers",
                   absl::StrCat("is ", plan_.num_buffers(), " but the instructions name only ",
                                named_buffers, " buffer ids"));
    }
    // The plan contract's rules over the whole instruction stream.
    for (const auto& violation :
         {plan_contract::CheckWeightGradOrder(plan_), plan_contract::CheckBufferLifetimes(plan_)}) {
      if (violation.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat(WhereInPlan(plan_, violation->instruction), violation->Describe()));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view field, absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(WhereInPlan(plan_, index_), field, " ", problem));
  }

  absl::Status CheckHeader() {
    if (const auto violation = plan_contract::CheckFormatVersion(plan_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(WhereInPlan(plan_, -1), violation->Describe()));
    }
    if (!config_.job_id().empty() && plan_.job_id() != config_.job_id()) {
      return Error("job_id", absl::StrCat("is '", plan_.job_id(), "' but this job is '",
                                          config_.job_id(), "'"));
    }
    if (recipient_.iteration && plan_.iteration() != *recipient_.iteration) {
      return Error("iteration", absl::StrCat("is ", plan_.iteration(), " but iteration ",
                                             *recipient_.iteration, " is due"));
    }
    if (plan_.rank() != recipient_.rank || plan_.dp_rank() != recipient_.dp_rank ||
        plan_.pp_rank() != recipient_.pp_rank) {
      return Error("rank",
                   absl::StrCat("(dp ", plan_.dp_rank(), ", pp ", plan_.pp_rank(),
                                ") does not match this executor: rank ", recipient_.rank, " (dp ",
                                recipient_.dp_rank, ", pp ", recipient_.pp_rank, ")"));
    }
    // Plans name pipeline ranks; each of the job's tensor ranks runs its own.
    const uint32_t tensor = std::max(1u, config_.parallelism().tensor());
    if (std::max(1u, plan_.tensor_parallel()) != tensor ||
        plan_.sequence_parallel() != config_.parallelism().sequence_parallel()) {
      return Error(
          "tensor_parallel",
          absl::StrCat("is ", std::max(1u, plan_.tensor_parallel()),
                       plan_.sequence_parallel() ? " with" : " without",
                       " sequence parallelism but this job has parallelism.tensor ", tensor,
                       config_.parallelism().sequence_parallel() ? " with" : " without", " it"));
    }
    if (std::max(1u, plan_.context_parallel()) != context_) {
      return Error("context_parallel",
                   absl::StrCat("is ", std::max(1u, plan_.context_parallel()),
                                " but this job has parallelism.context ", context_));
    }
    if (plan_.context_rank() != static_cast<uint32_t>(recipient_.context_rank)) {
      return Error("context_rank",
                   absl::StrCat("is ", plan_.context_rank(), " but this executor is lane ",
                                recipient_.context_rank, " of its context group of ", context_));
    }
    if (recipient_.layers && plan_.stage_layers_size() > 0) {
      const v1::StageLayoutConfig mine = LayerLayoutToConfig(*recipient_.layers);
      if (!std::equal(plan_.stage_layers().begin(), plan_.stage_layers().end(),
                      mine.layers().begin(), mine.layers().end()) ||
          plan_.encoder_stages() != mine.encoder_stages()) {
        v1::StageLayoutConfig planned;
        planned.mutable_layers()->CopyFrom(plan_.stage_layers());
        planned.set_encoder_stages(plan_.encoder_stages());
        absl::StatusOr<LayerLayout> theirs = ListedLayerLayout(
            planned, LayerCountsOf(config_.model()), static_cast<uint32_t>(stages_), "plan");
        return Error(
            "stage_layers",
            absl::StrCat(
                "is ", theirs.ok() ? theirs->ToString() : absl::StrJoin(plan_.stage_layers(), "+"),
                " but this executor's model was built with ", recipient_.layers->ToString(),
                " (parallelism.stage_layout); restart the executors with the "
                "planner's layout"));
      }
    }
    if (plan_.stages().empty()) return Error("stages", "is empty");
    for (int i = 0; i < plan_.stages_size(); ++i) {
      const uint32_t stage = plan_.stages(i);
      if (stage >= stages_) {
        return Error(absl::StrCat("stages[", i, "]"),
                     absl::StrCat("is ", stage, " but the job has ", stages_, " stages"));
      }
      for (int j = 0; j < i; ++j) {
        if (plan_.stages(j) == stage) {
          return Error(absl::StrCat("stages[", i, "]"), absl::StrCat("repeats stage ", stage));
        }
      }
    }
    if (plan_.recompute() != "none" && plan_.recompute() != "selective" &&
        plan_.recompute() != "full") {
      return Error("recompute",
                   absl::StrCat("is '", plan_.recompute(), "' (expected none, selective or full)"));
    }
    if (plan_.global_target_tokens() == 0 ||
        plan_.global_target_tokens() > config_.data().tokens_per_global_batch()) {
      return Error("global_target_tokens",
                   absl::StrCat("is ", plan_.global_target_tokens(), " (expected 1 to ",
                                config_.data().tokens_per_global_batch(),
                                ", data.tokens_per_global_batch)"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckMicroBatch(int i) {
    const v1::MicroBatch& mb = plan_.micro_batches(i);
    const std::string name = absl::StrCat("micro_batches[", i, "]");
    const uint64_t max_samples = config_.data().tokens_per_global_batch();
    if (mb.id() != static_cast<uint32_t>(i)) {
      return Error(name + ".id", absl::StrCat("is ", mb.id(), " (ids are the positions)"));
    }
    if (mb.sample_ids().empty()) return Error(name + ".sample_ids", "is empty");
    if (static_cast<uint64_t>(mb.sample_ids_size()) > max_samples) {
      return Error(name + ".sample_ids",
                   absl::StrCat("has ", mb.sample_ids_size(), " samples, more than the ",
                                max_samples, " tokens of a global batch"));
    }
    // Empty: the plan's recompute (checked with the header).
    const std::string& recompute = mb.recompute();
    if (!recompute.empty() && recompute != "none" && recompute != "selective" &&
        recompute != "full") {
      return Error(name + ".recompute",
                   absl::StrCat("is '", recompute, "' (expected none, selective or full)"));
    }
    if (mb.context().lane() >= context_) {
      return Error(name + ".context.lane",
                   absl::StrCat("is ", mb.context().lane(), " but the context group has ", context_,
                                " lanes"));
    }
    if (mb.context().split()) return CheckSplitMicroBatch(mb, name);
    if (mb.input_len() == 0 || mb.input_len() > max_input_) {
      return Error(name + ".input_len", absl::StrCat("is ", mb.input_len(), " (expected 1 to ",
                                                     max_input_, ", data.max_sequence_length)"));
    }
    if (t5_ ? (mb.target_len() == 0 || mb.target_len() > max_target_) : mb.target_len() != 0) {
      return Error(name + ".target_len",
                   t5_ ? absl::StrCat("is ", mb.target_len(), " (expected 1 to ", max_target_,
                                      ", data.max_target_length)")
                       : absl::StrCat("is ", mb.target_len(), " (GPT micro-batches have none)"));
    }
    // The samples' rows and spans: the plan contract's layout.
    if (const auto violation = plan_contract::PlaceSamples(mb, t5_)) {
      return Error(absl::StrCat(name, ".", violation->field), violation->problem);
    }
    const Repeated<uint32_t>& starts = mb.row_starts();
    if (mb.packed_attention() != v1::PACKED_ATTENTION_UNSPECIFIED &&
        (starts.empty() || (mb.packed_attention() != v1::PER_SAMPLE &&
                            mb.packed_attention() != v1::BLOCK_DIAGONAL_MASK))) {
      return Error(name + ".packed_attention",
                   starts.empty() ? std::string("is set on a micro-batch without packed rows")
                                  : absl::StrCat("is ", static_cast<int>(mb.packed_attention()),
                                                 " (expected PER_SAMPLE or BLOCK_DIAGONAL_MASK)"));
    }
    const uint64_t rows = MicroBatchRows(mb);
    if (mb.real_input_tokens() > rows * mb.input_len()) {
      return Error(name + ".real_input_tokens",
                   absl::StrCat("is ", mb.real_input_tokens(), ", more than ", rows, " rows of ",
                                mb.input_len()));
    }
    if (mb.real_target_tokens() > rows * std::max(mb.target_len(), mb.input_len())) {
      return Error(name + ".real_target_tokens", absl::StrCat("is ", mb.real_target_tokens(),
                                                              ", more than the micro-batch holds"));
    }
    return absl::OkStatus();
  }

  // A micro-batch split across the context group: GPT samples of at least
  // one token each, one row whose length is this lane's all_gather_count.
  absl::Status CheckSplitMicroBatch(const v1::MicroBatch& mb, const std::string& name) const {
    if (context_ <= 1) {
      return Error(name + ".context.split", "is set but the plan's context_parallel is 1");
    }
    if (t5_) return Error(name + ".context.split", "is set on a T5 micro-batch");
    if (mb.target_len() != 0) {
      return Error(name + ".target_len",
                   absl::StrCat("is ", mb.target_len(), " (GPT micro-batches have none)"));
    }
    const int n = mb.sample_ids_size();
    if (mb.sample_input_lens_size() != n || mb.sample_target_lens_size() != n) {
      return Error(
          name + ".sample_input_lens",
          absl::StrCat("has ", mb.sample_input_lens_size(), " entries (",
                       mb.sample_target_lens_size(), " target lengths) for ", n, " samples"));
    }
    std::vector<int64_t> lengths;
    uint64_t tokens = 0;
    for (int k = 0; k < n; ++k) {
      const uint64_t length = uint64_t{mb.sample_input_lens(k)} + mb.sample_target_lens(k);
      if (length == 0 || length > max_input_) {
        return Error(
            absl::StrCat(name, ".sample_input_lens[", k, "]"),
            absl::StrCat("gives sample ", mb.sample_ids(k), " ", length, " tokens (expected 1 to ",
                         max_input_, ", data.max_sequence_length)"));
      }
      tokens += length;
      lengths.push_back(static_cast<int64_t>(length));
    }
    if (tokens > config_.data().tokens_per_global_batch()) {
      return Error(name + ".sample_input_lens",
                   absl::StrCat("give ", tokens, " tokens, more than the ",
                                config_.data().tokens_per_global_batch(),
                                " of a global batch (data.tokens_per_global_batch)"));
    }
    const absl::StatusOr<ContextParallelSplit> split = ContextParallelSplit::Of(
        lengths, static_cast<int>(context_), static_cast<int>(plan_.context_rank()));
    if (!split.ok()) return Error(name + ".context", std::string(split.status().message()));
    if (mb.input_len() != static_cast<uint64_t>(split->all_gather_count())) {
      return Error(
          name + ".input_len",
          absl::StrCat("is ", mb.input_len(), " but the split of its ", n, " samples over ",
                       context_, " lanes holds ", split->all_gather_count(),
                       " positions per lane (all_gather_count)"));
    }
    return absl::OkStatus();
  }

  // Rows of a micro-batch's tensors: one for a split micro-batch.
  static uint64_t RowsOf(const v1::MicroBatch& mb) {
    return mb.context().split() ? 1 : MicroBatchRows(mb);
  }

  absl::Status CheckMicroBatchAndStage(const v1::Instruction& in) {
    if (in.micro_batch() >= static_cast<uint32_t>(plan_.micro_batches_size())) {
      return Error("micro_batch", absl::StrCat("is ", in.micro_batch(), " but the plan has ",
                                               plan_.micro_batches_size(), " micro-batches"));
    }
    if (context_ > 1) {
      const v1::ContextPlacement& placement =
          plan_.micro_batches(static_cast<int>(in.micro_batch())).context();
      if (!placement.split() && placement.lane() != plan_.context_rank()) {
        return Error(
            "micro_batch",
            absl::StrCat("is ", in.micro_batch(), ", which runs whole on lane ", placement.lane(),
                         ", not on this plan's lane ", plan_.context_rank()));
      }
    }
    if (std::find(plan_.stages().begin(), plan_.stages().end(), in.stage()) ==
        plan_.stages().end()) {
      return Error("stage", absl::StrCat("is ", in.stage(), ", not one of the plan's stages"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckIds(absl::string_view field, const Repeated<uint32_t>& ids,
                        uint64_t* named_buffers) const {
    for (int k = 0; k < ids.size(); ++k) {
      if (ids[k] >= plan_.num_buffers()) {
        return Error(
            absl::StrCat(field, "[", k, "]"),
            absl::StrCat("is buffer ", ids[k], " but num_buffers is ", plan_.num_buffers()));
      }
    }
    *named_buffers += static_cast<uint64_t>(ids.size());
    return absl::OkStatus();
  }

  // Token tensors are [rows, length] int64; activations (and their
  // gradients) [rows, length, hidden_size] of a float type.
  absl::Status CheckSpec(absl::string_view field, const v1::TensorSpec& spec, bool tokens,
                         const v1::MicroBatch& mb) const {
    const int rank = tokens ? 2 : 3;
    if (spec.dims_size() != rank) {
      return Error(absl::StrCat(field, ".dims"),
                   absl::StrCat("has ", spec.dims_size(), " dimensions (expected ", rank, ")"));
    }
    if (tokens ? spec.dtype() != v1::INT64 : !IsFloat(spec.dtype())) {
      return Error(absl::StrCat(field, ".dtype"),
                   absl::StrCat("is ", v1::DType_Name(spec.dtype()), " (expected ",
                                tokens ? "INT64" : "FLOAT32, BFLOAT16 or FLOAT16", ")"));
    }
    const int64_t rows = static_cast<int64_t>(RowsOf(mb));
    if (spec.dims(0) != rows) {
      return Error(
          absl::StrCat(field, ".dims[0]"),
          absl::StrCat("is ", spec.dims(0), " but micro-batch ", mb.id(), " has ", rows, " rows"));
    }
    const int64_t length = spec.dims(1);
    if (length != static_cast<int64_t>(mb.input_len()) &&
        !(t5_ && length == static_cast<int64_t>(mb.target_len()))) {
      return Error(absl::StrCat(field, ".dims[1]"),
                   absl::StrCat("is ", length, " but micro-batch ", mb.id(), " has length ",
                                mb.input_len(), t5_ ? absl::StrCat(" / ", mb.target_len()) : ""));
    }
    if (!tokens && spec.dims(2) != static_cast<int64_t>(config_.model().hidden_size())) {
      return Error(absl::StrCat(field, ".dims[2]"),
                   absl::StrCat("is ", spec.dims(2), " but model.hidden_size is ",
                                config_.model().hidden_size()));
    }
    return absl::OkStatus();
  }

  absl::Status CheckSpecs(absl::string_view field, const Specs& specs, int expected_count,
                          bool tokens, const v1::MicroBatch& mb) const {
    if (specs.size() != expected_count) {
      return Error(field, absl::StrCat("has ", specs.size(), " entries but the buffer ids have ",
                                       expected_count));
    }
    for (int k = 0; k < specs.size(); ++k) {
      if (absl::Status s = CheckSpec(absl::StrCat(field, "[", k, "]"), specs[k], tokens, mb);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckTransfer(const v1::Instruction& in, const v1::Transfer& t,
                             uint64_t* named_buffers) {
    if (absl::Status s = CheckMicroBatchAndStage(in); !s.ok()) return s;
    if (t.kind() != v1::ACTIVATION && t.kind() != v1::GRADIENT) {
      return Error("kind", absl::StrCat("is ", static_cast<int>(t.kind()),
                                        " (expected ACTIVATION or GRADIENT)"));
    }
    if (t.peer() < 0 || t.peer() >= world_ || t.peer() == plan_.rank()) {
      return Error("peer",
                   absl::StrCat("is ", t.peer(), " (expected another rank below ", world_, ")"));
    }
    if (t.buffer_ids().empty()) return Error("buffer_ids", "is empty");
    if (absl::Status s = CheckIds("buffer_ids", t.buffer_ids(), named_buffers); !s.ok()) return s;
    return CheckSpecs("tensors", t.tensors(), t.buffer_ids_size(), /*tokens=*/false,
                      plan_.micro_batches(static_cast<int>(in.micro_batch())));
  }

  absl::Status CheckGroup(absl::string_view field, const Repeated<uint32_t>& stages) const {
    for (int k = 0; k < stages.size(); ++k) {
      if (std::find(plan_.stages().begin(), plan_.stages().end(), stages[k]) ==
          plan_.stages().end()) {
        return Error(absl::StrCat(field, "[", k, "]"),
                     absl::StrCat("is ", stages[k], ", not one of the plan's stages"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckInstruction(const v1::Instruction& in, uint64_t* named_buffers) {
    switch (in.op_case()) {
      case v1::Instruction::kLoadInput:
        return CheckLoad(in, named_buffers);
      case v1::Instruction::kForward:
        return CheckForward(in, named_buffers);
      case v1::Instruction::kBackward:
        return CheckBackward(in, named_buffers);
      case v1::Instruction::kSendStart:
        return CheckTransfer(in, in.send_start(), named_buffers);
      case v1::Instruction::kSendWait:
        return CheckTransfer(in, in.send_wait(), named_buffers);
      case v1::Instruction::kRecvStart:
        return CheckTransfer(in, in.recv_start(), named_buffers);
      case v1::Instruction::kRecvWait:
        return CheckTransfer(in, in.recv_wait(), named_buffers);
      case v1::Instruction::kFreeBuffer:
        if (in.free_buffer().buffer_ids().empty())
          return Error("free_buffer.buffer_ids", "is empty");
        return CheckIds("free_buffer.buffer_ids", in.free_buffer().buffer_ids(), named_buffers);
      case v1::Instruction::kAllReduce:
        return CheckAllReduce(in.all_reduce());
      case v1::Instruction::kOptimizerStep:
        return CheckGroup("optimizer_step.stages", in.optimizer_step().stages());
      case v1::Instruction::kWeightGrad:
        return CheckMicroBatchAndStage(in);
      default:
        return Error("op", "is not set (an empty instruction)");
    }
  }

  absl::Status CheckLoad(const v1::Instruction& in, uint64_t* named_buffers) {
    if (absl::Status s = CheckMicroBatchAndStage(in); !s.ok()) return s;
    const v1::LoadInput& load = in.load_input();
    if (load.buffer_ids().empty()) return Error("load_input.buffer_ids", "is empty");
    if (load.contents_size() != load.buffer_ids_size()) {
      return Error("load_input.contents",
                   absl::StrCat("has ", load.contents_size(), " entries but buffer_ids has ",
                                load.buffer_ids_size()));
    }
    for (int k = 0; k < load.contents_size(); ++k) {
      const int content = load.contents(k);
      if (content <= v1::LoadInput::CONTENT_UNSPECIFIED || content > v1::LoadInput::LABELS) {
        return Error(absl::StrCat("load_input.contents[", k, "]"),
                     absl::StrCat("is ", content,
                                  " (expected INPUT_TOKENS, "
                                  "DECODER_INPUT_TOKENS or LABELS)"));
      }
    }
    if (absl::Status s = CheckIds("load_input.buffer_ids", load.buffer_ids(), named_buffers);
        !s.ok()) {
      return s;
    }
    return CheckSpecs("load_input.tensors", load.tensors(), load.buffer_ids_size(),
                      /*tokens=*/true, plan_.micro_batches(static_cast<int>(in.micro_batch())));
  }

  absl::Status CheckForward(const v1::Instruction& in, uint64_t* named_buffers) {
    if (absl::Status s = CheckMicroBatchAndStage(in); !s.ok()) return s;
    const v1::ForwardPass& f = in.forward();
    if (f.input_buffer_ids().empty()) return Error("forward.input_buffer_ids", "is empty");
    if (absl::Status s = CheckIds("forward.input_buffer_ids", f.input_buffer_ids(), named_buffers);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckIds("forward.output_buffer_ids", f.output_buffer_ids(), named_buffers);
        !s.ok()) {
      return s;
    }
    return CheckSpecs("forward.output_tensors", f.output_tensors(), f.output_buffer_ids_size(),
                      /*tokens=*/false, plan_.micro_batches(static_cast<int>(in.micro_batch())));
  }

  absl::Status CheckBackward(const v1::Instruction& in, uint64_t* named_buffers) {
    if (absl::Status s = CheckMicroBatchAndStage(in); !s.ok()) return s;
    const v1::BackwardPass& b = in.backward();
    if (absl::Status s =
            CheckIds("backward.output_grad_buffer_ids", b.output_grad_buffer_ids(), named_buffers);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckIds("backward.input_grad_buffer_ids", b.input_grad_buffer_ids(), named_buffers);
        !s.ok()) {
      return s;
    }
    return CheckSpecs("backward.input_grad_tensors", b.input_grad_tensors(),
                      b.input_grad_buffer_ids_size(), /*tokens=*/false,
                      plan_.micro_batches(static_cast<int>(in.micro_batch())));
  }

  // Ranks ascending, in the world, this rank among them; stages the plan's.
  absl::Status CheckAllReduce(const v1::AllReduceGradients& reduce) {
    const Repeated<int32_t>& group = reduce.group_ranks();
    bool self = false;
    for (int k = 0; k < group.size(); ++k) {
      if (group[k] < 0 || group[k] >= world_ || (k > 0 && group[k] <= group[k - 1])) {
        return Error(absl::StrCat("all_reduce.group_ranks[", k, "]"),
                     absl::StrCat("is ", group[k], " (ranks ascend, below ", world_, ")"));
      }
      self = self || group[k] == plan_.rank();
    }
    if (!group.empty() && !self) {
      return Error("all_reduce.group_ranks", "does not contain this rank");
    }
    return CheckGroup("all_reduce.stages", reduce.stages());
  }

  const v1::ExecutionPlan& plan_;
  const v1::JobConfig& config_;
  const PlanRecipient& recipient_;
  int64_t world_ = 1;
  uint32_t context_ = 1;
  uint64_t stages_ = 1;
  bool t5_ = false;
  uint32_t max_input_ = 0;
  uint32_t max_target_ = 0;
  int index_ = -1;  // the instruction being checked, -1 for the header
};

}  // namespace

absl::Status CheckPlan(const v1::ExecutionPlan& plan, const v1::JobConfig& config,
                       const PlanRecipient& recipient) {
  return PlanChecker(plan, config, recipient).Check();
}

absl::StatusOr<CheckedPlan> CheckedPlan::Check(std::shared_ptr<const v1::ExecutionPlan> plan,
                                               const v1::JobConfig& config,
                                               const PlanRecipient& recipient) {
  if (plan == nullptr) return absl::InvalidArgumentError("no plan to check");
  if (absl::Status status = CheckPlan(*plan, config, recipient); !status.ok()) return status;
  return CheckedPlan(std::move(plan));
}

absl::Status CheckWeightGradOrder(const v1::ExecutionPlan& plan) {
  const std::optional<plan_contract::ContractViolation> violation =
      plan_contract::CheckWeightGradOrder(plan);
  if (!violation.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(WhereInPlan(plan, violation->instruction), violation->Describe()));
}

}  // namespace varipipe::executor
