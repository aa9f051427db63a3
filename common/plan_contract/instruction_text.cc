#include "common/plan_contract/instruction_text.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace varipipe::plan_contract {

std::string FormatTensorSpecs(const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs) {
  std::vector<std::string> parts;
  for (const v1::TensorSpec& s : specs) {
    parts.push_back(absl::StrCat(absl::StrJoin(s.dims(), "x"), " ", v1::DType_Name(s.dtype())));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string OpName(const v1::Instruction& instruction) {
  const auto* field = v1::Instruction::descriptor()->FindFieldByNumber(instruction.op_case());
  return field == nullptr ? "no operation" : field->name();
}

std::string FormatInstruction(const v1::Instruction& in) {
  const std::string where = absl::StrCat(" mb", in.micro_batch(), " s", in.stage());
  const auto transfer = [&](const char* what, const v1::Transfer& t, const char* dir) {
    return absl::StrCat(what, " ", CommKind_Name(t.kind()), " ", dir, " ", t.peer(), " ",
                        FormatTensorSpecs(t.tensors()), " buffers ",
                        absl::StrJoin(t.buffer_ids(), ","), where);
  };
  switch (in.op_case()) {
    case v1::Instruction::kLoadInput:
      return absl::StrCat("load_input buffers ", absl::StrJoin(in.load_input().buffer_ids(), ","),
                          " ", FormatTensorSpecs(in.load_input().tensors()), where);
    case v1::Instruction::kForward:
      return absl::StrCat("forward in ", absl::StrJoin(in.forward().input_buffer_ids(), ","),
                          " out ", absl::StrJoin(in.forward().output_buffer_ids(), ","), where);
    case v1::Instruction::kBackward:
      return absl::StrCat(
          in.backward().weight_grad_deferred() ? "backward(input) grad-in " : "backward grad-in ",
          absl::StrJoin(in.backward().output_grad_buffer_ids(), ","), " grad-out ",
          absl::StrJoin(in.backward().input_grad_buffer_ids(), ","), where);
    case v1::Instruction::kWeightGrad:
      return absl::StrCat("weight_grad", where);
    case v1::Instruction::kSendStart:
      return transfer("send_start", in.send_start(), "to");
    case v1::Instruction::kSendWait:
      return transfer("send_wait", in.send_wait(), "to");
    case v1::Instruction::kRecvStart:
      return transfer("recv_start", in.recv_start(), "from");
    case v1::Instruction::kRecvWait:
      return transfer("recv_wait", in.recv_wait(), "from");
    case v1::Instruction::kFreeBuffer:
      return absl::StrCat("free_buffer ", absl::StrJoin(in.free_buffer().buffer_ids(), ","));
    case v1::Instruction::kAllReduce:
      return absl::StrCat("all_reduce stages ", absl::StrJoin(in.all_reduce().stages(), ","),
                          " group ", absl::StrJoin(in.all_reduce().group_ranks(), ","));
    case v1::Instruction::kOptimizerStep:
      return absl::StrCat("optimizer_step stages ",
                          absl::StrJoin(in.optimizer_step().stages(), ","));
    default:
      return "(empty)";
  }
}

std::string WhereInPlan(const v1::ExecutionPlan& plan, int index) {
  std::string where =
      absl::StrCat("plan of iteration ", plan.iteration(), " for rank ", plan.rank(), ": ");
  if (index >= 0 && index < plan.instructions_size()) {
    const v1::Instruction& in = plan.instructions(index);
    absl::StrAppend(&where, "instruction #", index, " (", OpName(in), ", micro-batch ",
                    in.micro_batch(), ", stage ", in.stage(), "): ");
  }
  return where;
}

}  // namespace varipipe::plan_contract
