#include "common/plan_contract/buffer_lifetimes.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace varipipe::plan_contract {
namespace {

// One pass over a rank's instructions with the state of every buffer.
class BufferLifetimes {
 public:
  BufferLifetimes(const v1::ExecutionPlan& plan, std::vector<int>* start_of_wait)
      : plan_(plan),
        start_of_wait_(start_of_wait),
        // Sized by the ids the instructions name, not by num_buffers, which
        // a corrupt plan may set to anything; larger ids are refused.
        state_(std::min<uint64_t>(plan.num_buffers(), NamedIds(plan)), kUnwritten) {
    if (start_of_wait_ != nullptr) start_of_wait_->assign(plan.instructions_size(), -1);
  }

  std::optional<ContractViolation> Check() {
    for (int i = 0; i < plan_.instructions_size(); ++i) {
      if (auto violation = Step(i)) return violation;
    }
    // Every start waited for.
    for (const auto& [peer_direction, starts] : open_) {
      if (!starts.empty()) return ContractViolation{starts.front(), "", "Start without a Wait"};
    }
    return std::nullopt;
  }

 private:
  enum State { kUnwritten, kPendingReceive, kReady, kFreed };
  using Ids = google::protobuf::RepeatedField<uint32_t>;

  // One more than the largest buffer id any instruction names.
  static uint64_t NamedIds(const v1::ExecutionPlan& plan) {
    uint64_t named = 0;
    const auto add = [&named](const Ids& ids) {
      for (uint32_t id : ids) named = std::max<uint64_t>(named, uint64_t{id} + 1);
    };
    for (const v1::Instruction& in : plan.instructions()) {
      add(in.load_input().buffer_ids());
      add(in.forward().input_buffer_ids());
      add(in.forward().output_buffer_ids());
      add(in.backward().output_grad_buffer_ids());
      add(in.backward().input_grad_buffer_ids());
      add(in.send_start().buffer_ids());
      add(in.recv_start().buffer_ids());
      add(in.send_wait().buffer_ids());
      add(in.recv_wait().buffer_ids());
      add(in.free_buffer().buffer_ids());
    }
    return named;
  }

  std::optional<ContractViolation> CheckIds(int i, const Ids& ids) const {
    for (uint32_t id : ids) {
      if (id >= plan_.num_buffers()) {
        return ContractViolation{
            i, "", absl::StrCat("buffer ", id, " >= num_buffers ", plan_.num_buffers())};
      }
    }
    return std::nullopt;
  }

  std::optional<ContractViolation> Write(int i, const Ids& ids, State to = kReady) {
    if (auto violation = CheckIds(i, ids)) return violation;
    for (uint32_t id : ids) {
      if (state_[id] != kUnwritten) {
        return ContractViolation{i, "", absl::StrCat("buffer ", id, " written twice")};
      }
      state_[id] = to;
    }
    return std::nullopt;
  }

  std::optional<ContractViolation> Read(int i, const Ids& ids) const {
    if (auto violation = CheckIds(i, ids)) return violation;
    for (uint32_t id : ids) {
      const char* problem = state_[id] == kFreed            ? " read after it was freed"
                            : state_[id] == kPendingReceive ? " read before its RecvWait"
                            : state_[id] == kUnwritten      ? " read before it was written"
                                                            : nullptr;
      if (problem != nullptr) return ContractViolation{i, "", absl::StrCat("buffer ", id, problem)};
    }
    return std::nullopt;
  }

  std::optional<ContractViolation> Wait(int i, const v1::Instruction& in) {
    const bool send = in.op_case() == v1::Instruction::kSendWait;
    const v1::Transfer& t = send ? in.send_wait() : in.recv_wait();
    std::vector<int>& starts = open_[{t.peer(), send}];
    const auto it = std::find_if(starts.begin(), starts.end(), [&](int start) {
      const v1::Instruction& st = plan_.instructions(start);
      return SameTransfer(send ? st.send_start() : st.recv_start(), t);
    });
    if (it == starts.end())
      return ContractViolation{i, "", "Wait without a matching Start before it"};
    if (start_of_wait_ != nullptr) (*start_of_wait_)[i] = *it;
    starts.erase(it);
    if (!send) {
      for (uint32_t id : t.buffer_ids()) state_[id] = kReady;
    }
    return std::nullopt;
  }

  std::optional<ContractViolation> Free(int i, const Ids& ids) {
    if (auto violation = CheckIds(i, ids)) return violation;
    for (uint32_t id : ids) {
      if (state_[id] == kFreed) {
        return ContractViolation{i, "", absl::StrCat("buffer ", id, " freed twice")};
      }
      if (state_[id] == kPendingReceive) {
        return ContractViolation{i, "", absl::StrCat("buffer ", id, " freed before its RecvWait")};
      }
      state_[id] = kFreed;
    }
    return std::nullopt;
  }

  std::optional<ContractViolation> Step(int i) {
    const v1::Instruction& in = plan_.instructions(i);
    switch (in.op_case()) {
      case v1::Instruction::kLoadInput:
        return Write(i, in.load_input().buffer_ids());
      case v1::Instruction::kForward:
        if (auto violation = Read(i, in.forward().input_buffer_ids())) return violation;
        return Write(i, in.forward().output_buffer_ids());
      case v1::Instruction::kBackward:
        if (auto violation = Read(i, in.backward().output_grad_buffer_ids())) return violation;
        return Write(i, in.backward().input_grad_buffer_ids());
      case v1::Instruction::kSendStart:
        open_[{in.send_start().peer(), true}].push_back(i);
        return Read(i, in.send_start().buffer_ids());
      case v1::Instruction::kRecvStart:
        open_[{in.recv_start().peer(), false}].push_back(i);
        return Write(i, in.recv_start().buffer_ids(), kPendingReceive);
      case v1::Instruction::kSendWait:
      case v1::Instruction::kRecvWait:
        return Wait(i, in);
      case v1::Instruction::kFreeBuffer:
        return Free(i, in.free_buffer().buffer_ids());
      default:
        return std::nullopt;
    }
  }

  const v1::ExecutionPlan& plan_;
  std::vector<int>* start_of_wait_;
  std::vector<State> state_;
  // Open transfers: index of the start, per (peer, is a send), in order.
  std::map<std::pair<int32_t, bool>, std::vector<int>> open_;
};

}  // namespace

bool SameTensorSpecs(const v1::Transfer& a, const v1::Transfer& b) {
  if (a.tensors_size() != b.tensors_size()) return false;
  for (int i = 0; i < a.tensors_size(); ++i) {
    const v1::TensorSpec& x = a.tensors(i);
    const v1::TensorSpec& y = b.tensors(i);
    if (x.dtype() != y.dtype() || x.dims_size() != y.dims_size() ||
        !std::equal(x.dims().begin(), x.dims().end(), y.dims().begin())) {
      return false;
    }
  }
  return true;
}

bool SameTransfer(const v1::Transfer& a, const v1::Transfer& b) {
  return a.kind() == b.kind() && a.peer() == b.peer() &&
         a.buffer_ids_size() == b.buffer_ids_size() &&
         std::equal(a.buffer_ids().begin(), a.buffer_ids().end(), b.buffer_ids().begin()) &&
         SameTensorSpecs(a, b);
}

std::optional<ContractViolation> CheckBufferLifetimes(const v1::ExecutionPlan& plan,
                                                      std::vector<int>* start_of_wait) {
  return BufferLifetimes(plan, start_of_wait).Check();
}

}  // namespace varipipe::plan_contract
