#ifndef VARIPIPE_COMMON_PLAN_CONTRACT_BUFFER_LIFETIMES_H_
#define VARIPIPE_COMMON_PLAN_CONTRACT_BUFFER_LIFETIMES_H_

#include <optional>
#include <vector>

#include "common/plan_contract/contract_violation.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe::plan_contract {

// The lifetimes of one rank's buffers (docs/plan_format.md, "Buffers"):
// - every buffer id is below num_buffers;
// - a buffer is written once: by load_input, a forward's outputs, a
//   backward's input gradients, or a recv_start (complete at its recv_wait);
// - it is read (a forward's inputs, a backward's output gradients, a
//   send_start) only after it was written, after its recv_wait, and before
//   it is freed; it is freed at most once, never before its recv_wait;
// - every send_start / recv_start is completed by exactly one later wait of
//   the same transfer (kind, peer, buffer ids and tensor specs), in order
//   per peer and direction, and every wait completes an earlier start.
// The first violation in instruction order, or nullopt. With
// `start_of_wait`, start_of_wait[i] is set to the index of the start that
// wait i completes (-1 for instructions that are not waits).
std::optional<ContractViolation> CheckBufferLifetimes(const v1::ExecutionPlan& plan,
                                                      std::vector<int>* start_of_wait = nullptr);

// Whether two transfers carry tensors of the same dtypes and shapes.
bool SameTensorSpecs(const v1::Transfer& a, const v1::Transfer& b);

// Whether two transfers are the same one: kind, peer, buffer ids and
// tensor specs.
bool SameTransfer(const v1::Transfer& a, const v1::Transfer& b);

}  // namespace varipipe::plan_contract

#endif  // VARIPIPE_COMMON_PLAN_CONTRACT_BUFFER_LIFETIMES_H_
