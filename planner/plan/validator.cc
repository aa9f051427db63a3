#include "planner/plan/validator.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/parallel.h"

namespace varipipe::planner {
namespace {

std::string Specs(const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs) {
  std::vector<std::string> parts;
  for (const v1::TensorSpec& s : specs) {
    parts.push_back(absl::StrCat(absl::StrJoin(s.dims(), "x"), " ", v1::DType_Name(s.dtype())));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

absl::Status Fail(int rank, int index, const v1::ExecutionPlan& plan, const std::string& why) {
  std::string context;
  for (int i = std::max(0, index - 3); i < std::min(plan.instructions_size(), index + 2); ++i) {
    absl::StrAppend(&context, i == index ? "\n  > " : "\n    ", i, ": ",
                    FormatInstruction(plan.instructions(i)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid plan: rank ", rank, ", instruction ", index, ": ", why, context));
}

bool SameSpecs(const v1::Transfer& a, const v1::Transfer& b) {
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
         SameSpecs(a, b);
}

// Per-rank static checks (1, 2). Fills start_of_wait[i] with the index of
// the Start that Wait i completes.
absl::Status CheckRank(int rank, const v1::ExecutionPlan& plan, int ranks,
                       std::vector<int>& start_of_wait) {
  start_of_wait.assign(plan.instructions_size(), -1);
  if (plan.format_version() != v1::PLAN_FORMAT_V1) {
    return Fail(rank, 0, plan, absl::StrCat("format_version ", plan.format_version()));
  }
  if (plan.rank() != rank) {
    return Fail(rank, 0, plan, absl::StrCat("plan says rank ", plan.rank()));
  }
  enum State { kUnwritten, kPendingReceive, kReady, kFreed };
  std::vector<State> state(plan.num_buffers(), kUnwritten);
  std::set<std::pair<uint32_t, uint32_t>> forwards;
  std::set<std::pair<uint32_t, uint32_t>> backwards;
  std::set<uint32_t> stages(plan.stages().begin(), plan.stages().end());
  // Open transfers: index of the Start, per (peer, direction) in order.
  std::map<std::pair<int32_t, bool>, std::vector<int>> open;
  const auto check_ids = [&](int i, const auto& ids) -> absl::Status {
    for (uint32_t id : ids) {
      if (id >= plan.num_buffers()) {
        return Fail(rank, i, plan,
                    absl::StrCat("buffer ", id, " >= num_buffers ", plan.num_buffers()));
      }
    }
    return absl::OkStatus();
  };
  const auto write = [&](int i, const auto& ids) -> absl::Status {
    if (auto s = check_ids(i, ids); !s.ok()) return s;
    for (uint32_t id : ids) {
      if (state[id] != kUnwritten)
        return Fail(rank, i, plan, absl::StrCat("buffer ", id, " written twice"));
      state[id] = kReady;
    }
    return absl::OkStatus();
  };
  const auto read = [&](int i, const auto& ids) -> absl::Status {
    if (auto s = check_ids(i, ids); !s.ok()) return s;
    for (uint32_t id : ids) {
      if (state[id] == kFreed)
        return Fail(rank, i, plan, absl::StrCat("buffer ", id, " read after it was freed"));
      if (state[id] == kPendingReceive) {
        return Fail(rank, i, plan, absl::StrCat("buffer ", id, " read before its RecvWait"));
      }
      if (state[id] == kUnwritten)
        return Fail(rank, i, plan, absl::StrCat("buffer ", id, " read before it was written"));
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < plan.instructions_size(); ++i) {
    const v1::Instruction& in = plan.instructions(i);
    const std::pair<uint32_t, uint32_t> key{in.stage(), in.micro_batch()};
    absl::Status s;
    switch (in.op_case()) {
      case v1::Instruction::kLoadInput:
        s = write(i, in.load_input().buffer_ids());
        break;
      case v1::Instruction::kForward:
        if (!stages.count(in.stage()))
          s = Fail(rank, i, plan, "forward of a stage the rank does not hold");
        else if (!forwards.insert(key).second)
          s = Fail(rank, i, plan, "forward runs twice");
        if (s.ok()) s = read(i, in.forward().input_buffer_ids());
        if (s.ok()) s = write(i, in.forward().output_buffer_ids());
        break;
      case v1::Instruction::kBackward:
        if (!forwards.count(key))
          s = Fail(rank, i, plan, "backward before its forward");
        else if (!backwards.insert(key).second)
          s = Fail(rank, i, plan, "backward runs twice");
        if (s.ok()) s = read(i, in.backward().output_grad_buffer_ids());
        if (s.ok()) s = write(i, in.backward().input_grad_buffer_ids());
        break;
      case v1::Instruction::kSendStart:
        s = read(i, in.send_start().buffer_ids());
        open[{in.send_start().peer(), true}].push_back(i);
        break;
      case v1::Instruction::kRecvStart:
        s = check_ids(i, in.recv_start().buffer_ids());
        if (s.ok()) {
          for (uint32_t id : in.recv_start().buffer_ids()) {
            if (state[id] != kUnwritten) {
              s = Fail(rank, i, plan, absl::StrCat("buffer ", id, " written twice"));
              break;
            }
            state[id] = kPendingReceive;
          }
        }
        open[{in.recv_start().peer(), false}].push_back(i);
        break;
      case v1::Instruction::kSendWait:
      case v1::Instruction::kRecvWait: {
        const bool send = in.op_case() == v1::Instruction::kSendWait;
        const v1::Transfer& t = send ? in.send_wait() : in.recv_wait();
        auto& starts = open[{t.peer(), send}];
        const auto it = std::find_if(starts.begin(), starts.end(), [&](int start) {
          const v1::Instruction& st = plan.instructions(start);
          return SameTransfer(send ? st.send_start() : st.recv_start(), t);
        });
        if (it == starts.end()) {
          s = Fail(rank, i, plan, "Wait without a matching Start before it");
          break;
        }
        start_of_wait[i] = *it;
        starts.erase(it);
        if (!send) {
          for (uint32_t id : t.buffer_ids()) state[id] = kReady;
        }
        break;
      }
      case v1::Instruction::kFreeBuffer:
        s = check_ids(i, in.free_buffer().buffer_ids());
        for (uint32_t id : in.free_buffer().buffer_ids()) {
          if (!s.ok()) break;
          if (state[id] == kFreed)
            s = Fail(rank, i, plan, absl::StrCat("buffer ", id, " freed twice"));
          else if (state[id] == kPendingReceive)
            s = Fail(rank, i, plan, absl::StrCat("buffer ", id, " freed before its RecvWait"));
          state[id] = kFreed;
        }
        break;
      case v1::Instruction::kAllReduce:
      case v1::Instruction::kOptimizerStep:
        break;
      default:
        s = Fail(rank, i, plan, "instruction without an op");
    }
    if (!s.ok()) return s;
    if (in.op_case() == v1::Instruction::kSendStart ||
        in.op_case() == v1::Instruction::kRecvStart) {
      const int32_t peer = in.op_case() == v1::Instruction::kSendStart ? in.send_start().peer()
                                                                       : in.recv_start().peer();
      if (peer < 0 || peer >= ranks || peer == rank) {
        return Fail(rank, i, plan, absl::StrCat("peer ", peer, " is not another rank"));
      }
    }
  }
  for (const auto& [peer_direction, starts] : open) {
    if (!starts.empty()) {
      return Fail(rank, starts.front(), plan, "Start without a Wait");
    }
  }
  for (uint32_t stage : stages) {
    for (int m = 0; m < plan.micro_batches_size(); ++m) {
      if (!forwards.count({stage, static_cast<uint32_t>(m)}) ||
          !backwards.count({stage, static_cast<uint32_t>(m)})) {
        return Fail(
            rank, plan.instructions_size() - 1, plan,
            absl::StrCat("micro-batch ", m, " never runs ",
                         forwards.count({stage, static_cast<uint32_t>(m)}) ? "backward" : "forward",
                         " on stage ", stage));
      }
    }
  }
  return absl::OkStatus();
}

// The channel replay (check 3).
// `ranks`: one set of ranks that only exchange transfers among themselves.
absl::Status CheckDeadlockFree(std::span<const v1::ExecutionPlan> plans,
                               const std::vector<std::vector<int>>& start_of_wait,
                               std::span<const int> ranks) {
  const int n = static_cast<int>(plans.size());
  struct Started {
    int rank;
    int index;
  };
  // Per unordered pair: the transfers each side started, in order.
  std::map<std::pair<int, int>, std::vector<Started>> side[2];
  std::map<std::pair<int, int>, int> completed;  // transfers completed on the pair
  // (rank, instruction) of a Start -> its position on the pair's channel.
  std::map<std::pair<int, int>, int> position;
  std::vector<int> pc(n, 0);
  const auto pair_of = [](int a, int b) { return std::make_pair(std::min(a, b), std::max(a, b)); };
  const auto start_of = [&](int rank, const v1::Instruction& in) -> const v1::Transfer& {
    return in.op_case() == v1::Instruction::kSendStart ? in.send_start() : in.recv_start();
  };
  // Advances the pair's completed count while both sides have started the
  // next transfer; checks that matched transfers agree.
  const auto settle = [&](std::pair<int, int> p) -> absl::Status {
    int& done = completed[p];
    auto& low = side[0][p];
    auto& high = side[1][p];
    while (done < static_cast<int>(low.size()) && done < static_cast<int>(high.size())) {
      const Started& a = low[done];
      const Started& b = high[done];
      const v1::Instruction& ia = plans[a.rank].instructions(a.index);
      const v1::Instruction& ib = plans[b.rank].instructions(b.index);
      const bool a_sends = ia.op_case() == v1::Instruction::kSendStart;
      const bool b_sends = ib.op_case() == v1::Instruction::kSendStart;
      const v1::Transfer& ta = start_of(a.rank, ia);
      const v1::Transfer& tb = start_of(b.rank, ib);
      if (a_sends == b_sends) {
        return Fail(a.rank, a.index, plans[a.rank],
                    absl::StrCat("transfer ", done, " with rank ", b.rank, " is a ",
                                 a_sends ? "send" : "receive", " on both sides (rank ", b.rank,
                                 " instruction ", b.index, ")"));
      }
      if (ta.kind() != tb.kind() || !SameSpecs(ta, tb)) {
        return Fail(a.rank, a.index, plans[a.rank],
                    absl::StrCat("transfer ", done, " with rank ", b.rank, " does not match: ",
                                 CommKind_Name(ta.kind()), " ", Specs(ta.tensors()), " vs ",
                                 CommKind_Name(tb.kind()), " ", Specs(tb.tensors()), " (rank ",
                                 b.rank, " instruction ", b.index, ")"));
      }
      ++done;
    }
    return absl::OkStatus();
  };
  while (true) {
    bool progress = false;
    bool all_done = true;
    for (int r : ranks) {
      const v1::ExecutionPlan& plan = plans[r];
      while (pc[r] < plan.instructions_size()) {
        const v1::Instruction& in = plan.instructions(pc[r]);
        const auto op = in.op_case();
        if (op == v1::Instruction::kSendStart || op == v1::Instruction::kRecvStart) {
          const int peer = start_of(r, in).peer();
          const auto p = pair_of(r, peer);
          auto& mine = side[r == p.first ? 0 : 1][p];
          position[{r, pc[r]}] = static_cast<int>(mine.size());
          mine.push_back({r, pc[r]});
          if (absl::Status s = settle(p); !s.ok()) return s;
        } else if (op == v1::Instruction::kSendWait || op == v1::Instruction::kRecvWait) {
          const bool send = op == v1::Instruction::kSendWait;
          const v1::Transfer& t = send ? in.send_wait() : in.recv_wait();
          const int start = start_of_wait[r][pc[r]];
          if (start < 0) return Fail(r, pc[r], plan, "Wait without a Start");
          const auto p = pair_of(r, t.peer());
          if (completed[p] <= position[{r, start}]) break;  // blocked
        }
        ++pc[r];
        progress = true;
      }
      all_done &= pc[r] == plan.instructions_size();
    }
    if (all_done) return absl::OkStatus();
    if (!progress) {
      std::vector<std::string> stuck;
      for (int r : ranks) {
        if (pc[r] < plans[r].instructions_size()) {
          stuck.push_back(absl::StrCat("rank ", r, " at instruction ", pc[r], " (",
                                       FormatInstruction(plans[r].instructions(pc[r])), ")"));
        }
      }
      int first = 0;
      for (int r : ranks) {
        if (pc[r] < plans[r].instructions_size()) {
          first = r;
          break;
        }
      }
      return Fail(first, pc[first], plans[first],
                  absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; ")));
    }
  }
}

// Ranks grouped by the transfers between them (union-find over peers),
// each group ascending, groups by their first rank. Point-to-point transfers
// stay within a pipeline replica, so each replica replays on its own.
std::vector<std::vector<int>> TransferGroups(std::span<const v1::ExecutionPlan> plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<int> parent(n);
  for (int r = 0; r < n; ++r) parent[r] = r;
  const auto find = [&](int r) {
    while (parent[r] != r) r = parent[r] = parent[parent[r]];
    return r;
  };
  for (int r = 0; r < n; ++r) {
    for (const v1::Instruction& in : plans[r].instructions()) {
      const v1::Instruction::OpCase op = in.op_case();
      if (op != v1::Instruction::kSendStart && op != v1::Instruction::kRecvStart) continue;
      const int peer = static_cast<int>(
          op == v1::Instruction::kSendStart ? in.send_start().peer() : in.recv_start().peer());
      if (peer < 0 || peer >= n) continue;  // CheckRank reports it
      const int a = find(r);
      const int b = find(peer);
      parent[std::max(a, b)] = std::min(a, b);
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(n, -1);
  for (int r = 0; r < n; ++r) {
    const int root = find(r);
    if (group_of[root] < 0) {
      group_of[root] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[group_of[root]].push_back(r);
  }
  return groups;
}

absl::Status CheckPeaks(std::span<const double> peak_bytes, std::span<const double> limit_bytes) {
  for (size_t r = 0; r < peak_bytes.size() && r < limit_bytes.size(); ++r) {
    if (peak_bytes[r] > limit_bytes[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid plan: rank ", r, ": predicted peak activation memory ",
                       peak_bytes[r] / (1 << 20), " MiB exceeds the limit of ",
                       limit_bytes[r] / (1 << 20), " MiB"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string FormatInstruction(const v1::Instruction& in) {
  const std::string where = absl::StrCat(" mb", in.micro_batch(), " s", in.stage());
  const auto transfer = [&](const char* what, const v1::Transfer& t, const char* dir) {
    return absl::StrCat(what, " ", CommKind_Name(t.kind()), " ", dir, " ", t.peer(), " ",
                        Specs(t.tensors()), " buffers ", absl::StrJoin(t.buffer_ids(), ","), where);
  };
  switch (in.op_case()) {
    case v1::Instruction::kLoadInput:
      return absl::StrCat("load_input buffers ", absl::StrJoin(in.load_input().buffer_ids(), ","),
                          " ", Specs(in.load_input().tensors()), where);
    case v1::Instruction::kForward:
      return absl::StrCat("forward in ", absl::StrJoin(in.forward().input_buffer_ids(), ","),
                          " out ", absl::StrJoin(in.forward().output_buffer_ids(), ","), where);
    case v1::Instruction::kBackward:
      return absl::StrCat("backward grad-in ",
                          absl::StrJoin(in.backward().output_grad_buffer_ids(), ","), " grad-out ",
                          absl::StrJoin(in.backward().input_grad_buffer_ids(), ","), where);
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

absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes, double memory_limit_bytes) {
  const std::vector<double> limits(peak_bytes.size(), memory_limit_bytes);
  return ValidatePlans(plans, peak_bytes, limits, 1);
}

absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes,
                           std::span<const double> memory_limit_bytes, int threads) {
  const int n = static_cast<int>(plans.size());
  std::vector<std::vector<int>> start_of_wait(n);
  std::vector<absl::Status> rank_status(n);
  ParallelFor(n, threads,
              [&](size_t r) { rank_status[r] = CheckRank(r, plans[r], n, start_of_wait[r]); });
  for (const absl::Status& s : rank_status) {
    if (!s.ok()) return s;
  }
  const std::vector<std::vector<int>> groups = TransferGroups(plans);
  std::vector<absl::Status> group_status(groups.size());
  ParallelFor(groups.size(), threads, [&](size_t g) {
    group_status[g] = CheckDeadlockFree(plans, start_of_wait, groups[g]);
  });
  for (const absl::Status& s : group_status) {
    if (!s.ok()) return s;
  }
  return CheckPeaks(peak_bytes, memory_limit_bytes);
}

}  // namespace varipipe::planner
