#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_CONTRACT_VIOLATION_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_CONTRACT_VIOLATION_H_

#include <string>

namespace varipipe::plan_contract {

// A rule of the plan contract that one rank's plan breaks, without context:
// the planner's validator and the executor's plan check each render it
// their own way (with the neighbouring instructions, or with the plan's
// iteration and rank).
struct ContractViolation {
  // The instruction that breaks the rule; -1 for the plan's header and its
  // micro-batches.
  int instruction = -1;
  // The field at fault, relative to what was checked (e.g.
  // "sample_input_offsets[3]" of a micro-batch); empty when the problem
  // names it.
  std::string field;
  // What is wrong, e.g. "weight_grad runs twice (first at instruction #7)".
  std::string problem;

  // "FIELD PROBLEM", or the problem alone.
  std::string Describe() const { return field.empty() ? problem : field + " " + problem; }
};

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_CONTRACT_VIOLATION_H_
