#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_INSTRUCTION_TEXT_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_INSTRUCTION_TEXT_H_

#include <string>

#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// The instruction's operation as the plan format names it ("forward",
// "recv_wait", ...), or "no operation" when none is set.
std::string OpName(const v1::Instruction& instruction);

// One line per instruction with its buffers, peers and tensor shapes, e.g.
// "recv_wait ACTIVATION from 3 [2x128x256 BFLOAT16] buffers 4 mb1 s2" (for
// varipipe-ctl and the validator's messages).
std::string FormatInstruction(const v1::Instruction& instruction);

// Tensor specs as "[2x128x256 BFLOAT16, ...]".
std::string FormatTensorSpecs(const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs);

// Where a message about one rank's plan points: "plan of iteration I for
// rank R: instruction #i (op, micro-batch m, stage s): ", without the
// instruction part for index < 0 (the plan's header).
std::string WhereInPlan(const v1::ExecutionPlan& plan, int index);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_INSTRUCTION_TEXT_H_
