#include "planner/plan/validator.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/plan_contract/buffer_lifetimes.h"
#include "common/plan_contract/format_version.h"
#include "common/plan_contract/instruction_text.h"
#include "common/plan_contract/weight_grad_order.h"
#include "planner/parallel.h"
#include "planner/plan/memory_replay.h"

namespace varipipe::planner {
namespace {

using plan_contract::FormatInstruction;

absl::Status Fail(int rank, int index, const v1::ExecutionPlan& plan, const std::string& why) {
  std::string context;
  for (int i = std::max(0, index - 3); i < std::min(plan.instructions_size(), index + 2); ++i) {
    absl::StrAppend(&context, i == index ? "\n  > " : "\n    ", i, ": ",
                    FormatInstruction(plan.instructions(i)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid plan: rank ", rank, ", instruction ", index, ": ", why, context));
}

// Per-rank static checks (1, 2): the plan contract's format version, buffer
// lifetimes and weight-gradient order, then what the planner adds: the
// plan is the rank's, each micro-batch runs forward then backward once on
// every stage the rank holds, and every peer is another rank.
class RankChecker {
 public:
  RankChecker(int rank, const v1::ExecutionPlan& plan, int ranks, std::vector<int>& start_of_wait)
      : rank_(rank),
        plan_(plan),
        ranks_(ranks),
        start_of_wait_(start_of_wait),
        stages_(plan.stages().begin(), plan.stages().end()) {}

  absl::Status Check() {
    if (const auto violation = plan_contract::CheckFormatVersion(plan_)) {
      return Fail(rank_, 0, plan_, violation->Describe());
    }
    if (plan_.rank() != rank_) {
      return Fail(rank_, 0, plan_, absl::StrCat("plan says rank ", plan_.rank()));
    }
    // Split backwards: the contract's order of weight_grads.
    if (const auto violation = plan_contract::CheckWeightGradOrder(plan_)) {
      return Fail(rank_, violation->instruction, plan_, violation->Describe());
    }
    if (const auto violation = plan_contract::CheckBufferLifetimes(plan_, &start_of_wait_)) {
      return Fail(rank_, violation->instruction, plan_, violation->Describe());
    }
    for (int i = 0; i < plan_.instructions_size(); ++i) {
      if (absl::Status s = Step(i); !s.ok()) return s;
      if (absl::Status s = CheckPeer(i); !s.ok()) return s;
    }
    return Finish();
  }

 private:
  // With context parallelism, the micro-batches this lane runs: the split
  // ones and its own whole ones.
  bool Runs(uint32_t mb) const {
    if (plan_.context_parallel() <= 1) return true;
    if (static_cast<int>(mb) >= plan_.micro_batches_size()) return true;  // the contract's check
    const v1::ContextPlacement& c = plan_.micro_batches(static_cast<int>(mb)).context();
    return c.split() || c.lane() == plan_.context_rank();
  }

  absl::Status Compute(int i, const v1::Instruction& in) {
    const std::pair<uint32_t, uint32_t> key{in.stage(), in.micro_batch()};
    if (!Runs(in.micro_batch())) {
      return Fail(
          rank_, i, plan_,
          absl::StrCat("micro-batch ", in.micro_batch(), " runs whole on lane ",
                       plan_.micro_batches(static_cast<int>(in.micro_batch())).context().lane(),
                       ", not on this lane (", plan_.context_rank(), ")"));
    }
    if (in.op_case() == v1::Instruction::kForward) {
      if (!stages_.count(in.stage())) {
        return Fail(rank_, i, plan_, "forward of a stage the rank does not hold");
      }
      if (!forwards_.insert(key).second) return Fail(rank_, i, plan_, "forward runs twice");
      return absl::OkStatus();
    }
    if (!forwards_.count(key)) return Fail(rank_, i, plan_, "backward before its forward");
    if (!backwards_.insert(key).second) return Fail(rank_, i, plan_, "backward runs twice");
    return absl::OkStatus();
  }

  absl::Status Step(int i) {
    const v1::Instruction& in = plan_.instructions(i);
    switch (in.op_case()) {
      case v1::Instruction::kForward:
      case v1::Instruction::kBackward:
        return Compute(i, in);
      case v1::Instruction::kLoadInput:
      case v1::Instruction::kWeightGrad:
      case v1::Instruction::kSendStart:
      case v1::Instruction::kRecvStart:
      case v1::Instruction::kSendWait:
      case v1::Instruction::kRecvWait:
      case v1::Instruction::kFreeBuffer:
      case v1::Instruction::kAllReduce:
      case v1::Instruction::kOptimizerStep:
        return absl::OkStatus();  // buffers and weight_grads: the contract's checks
      default:
        return Fail(rank_, i, plan_, "instruction without an op");
    }
  }

  absl::Status CheckPeer(int i) const {
    const v1::Instruction& in = plan_.instructions(i);
    if (in.op_case() != v1::Instruction::kSendStart &&
        in.op_case() != v1::Instruction::kRecvStart) {
      return absl::OkStatus();
    }
    const int32_t peer = in.op_case() == v1::Instruction::kSendStart ? in.send_start().peer()
                                                                     : in.recv_start().peer();
    if (peer < 0 || peer >= ranks_ || peer == rank_) {
      return Fail(rank_, i, plan_, absl::StrCat("peer ", peer, " is not another rank"));
    }
    return absl::OkStatus();
  }

  // Every micro-batch's forward and backward on every stage the rank
  // holds.
  absl::Status Finish() const {
    for (uint32_t stage : stages_) {
      for (int m = 0; m < plan_.micro_batches_size(); ++m) {
        if (!Runs(static_cast<uint32_t>(m))) continue;
        const std::pair<uint32_t, uint32_t> key{stage, static_cast<uint32_t>(m)};
        if (!forwards_.count(key) || !backwards_.count(key)) {
          return Fail(
              rank_, plan_.instructions_size() - 1, plan_,
              absl::StrCat("micro-batch ", m, " never runs ",
                           forwards_.count(key) ? "backward" : "forward", " on stage ", stage));
        }
      }
    }
    return absl::OkStatus();
  }

  const int rank_;
  const v1::ExecutionPlan& plan_;
  const int ranks_;
  std::vector<int>& start_of_wait_;
  std::set<std::pair<uint32_t, uint32_t>> forwards_;
  std::set<std::pair<uint32_t, uint32_t>> backwards_;
  std::set<uint32_t> stages_;
};

// Per-rank static checks (1, 2). Fills start_of_wait[i] with the index of
// the Start that Wait i completes.
absl::Status CheckRank(int rank, const v1::ExecutionPlan& plan, int ranks,
                       std::vector<int>& start_of_wait) {
  return RankChecker(rank, plan, ranks, start_of_wait).Check();
}

// The channel replay (check 3) over one set of ranks that only exchange
// transfers among themselves.
class ChannelReplay {
 public:
  ChannelReplay(std::span<const v1::ExecutionPlan> plans,
                const std::vector<std::vector<int>>& start_of_wait, std::span<const int> ranks)
      : plans_(plans), start_of_wait_(start_of_wait), ranks_(ranks), pc_(plans.size(), 0) {}

  absl::Status Run() {
    while (true) {
      bool progress = false;
      bool all_done = true;
      for (int r : ranks_) {
        absl::StatusOr<bool> advanced = Advance(r);
        if (!advanced.ok()) return advanced.status();
        progress |= *advanced;
        all_done &= pc_[r] == plans_[r].instructions_size();
      }
      if (all_done) return absl::OkStatus();
      if (!progress) return Deadlock();
    }
  }

 private:
  struct Started {
    int rank;
    int index;
  };
  using Pair = std::pair<int, int>;

  static Pair PairOf(int a, int b) { return {std::min(a, b), std::max(a, b)}; }
  static const v1::Transfer& StartOf(const v1::Instruction& in) {
    return in.op_case() == v1::Instruction::kSendStart ? in.send_start() : in.recv_start();
  }

  // The forward or backward of a split micro-batch: a collective of the
  // rank's context group (the attention's all-gather, its backward's
  // reduce-scatter), which every lane of the group must reach.
  static bool IsSplitPass(const v1::ExecutionPlan& plan, const v1::Instruction& in) {
    if (plan.context_parallel() <= 1) return false;
    if (in.op_case() != v1::Instruction::kForward && in.op_case() != v1::Instruction::kBackward) {
      return false;
    }
    const int mb = static_cast<int>(in.micro_batch());
    return mb < plan.micro_batches_size() && plan.micro_batches(mb).context().split();
  }

  // Runs rank r until it blocks on a Wait or a split pass the rest of its
  // context group has not reached, or ends; true when it moved.
  absl::StatusOr<bool> Advance(int r) {
    const v1::ExecutionPlan& plan = plans_[r];
    bool progress = false;
    while (pc_[r] < plan.instructions_size()) {
      const v1::Instruction& in = plan.instructions(pc_[r]);
      const auto op = in.op_case();
      if (IsSplitPass(plan, in)) {
        const CollectiveKey key{plan.dp_rank(), plan.pp_rank(), static_cast<int>(op), in.stage(),
                                in.micro_batch()};
        if (arrived_at_[r] != pc_[r]) {
          arrived_at_[r] = pc_[r];
          ++arrivals_[key];
          progress = true;
        }
        if (arrivals_[key] < static_cast<int>(plan.context_parallel())) break;  // blocked
      } else if (op == v1::Instruction::kSendStart || op == v1::Instruction::kRecvStart) {
        const Pair p = PairOf(r, StartOf(in).peer());
        std::vector<Started>& mine = side_[r == p.first ? 0 : 1][p];
        position_[{r, pc_[r]}] = static_cast<int>(mine.size());
        mine.push_back({r, pc_[r]});
        if (absl::Status s = Settle(p); !s.ok()) return s;
      } else if (op == v1::Instruction::kSendWait || op == v1::Instruction::kRecvWait) {
        const v1::Transfer& t = op == v1::Instruction::kSendWait ? in.send_wait() : in.recv_wait();
        const int start = start_of_wait_[r][pc_[r]];
        if (start < 0) return Fail(r, pc_[r], plan, "Wait without a Start");
        if (completed_[PairOf(r, t.peer())] <= position_[{r, start}]) break;  // blocked
      }
      ++pc_[r];
      progress = true;
    }
    return progress;
  }

  // Advances the pair's completed count while both sides have started the
  // next transfer; checks that matched transfers agree.
  absl::Status Settle(Pair p) {
    int& done = completed_[p];
    const std::vector<Started>& low = side_[0][p];
    const std::vector<Started>& high = side_[1][p];
    for (; done < static_cast<int>(low.size()) && done < static_cast<int>(high.size()); ++done) {
      const Started& a = low[done];
      const Started& b = high[done];
      const v1::Instruction& ia = plans_[a.rank].instructions(a.index);
      const v1::Instruction& ib = plans_[b.rank].instructions(b.index);
      const bool a_sends = ia.op_case() == v1::Instruction::kSendStart;
      const bool b_sends = ib.op_case() == v1::Instruction::kSendStart;
      const v1::Transfer& ta = StartOf(ia);
      const v1::Transfer& tb = StartOf(ib);
      if (a_sends == b_sends) {
        return Fail(a.rank, a.index, plans_[a.rank],
                    absl::StrCat("transfer ", done, " with rank ", b.rank, " is a ",
                                 a_sends ? "send" : "receive", " on both sides (rank ", b.rank,
                                 " instruction ", b.index, ")"));
      }
      if (ta.kind() != tb.kind() || !plan_contract::SameTensorSpecs(ta, tb)) {
        return Fail(a.rank, a.index, plans_[a.rank],
                    absl::StrCat("transfer ", done, " with rank ", b.rank,
                                 " does not match: ", CommKind_Name(ta.kind()), " ",
                                 plan_contract::FormatTensorSpecs(ta.tensors()), " vs ",
                                 CommKind_Name(tb.kind()), " ",
                                 plan_contract::FormatTensorSpecs(tb.tensors()), " (rank ", b.rank,
                                 " instruction ", b.index, ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Deadlock() const {
    std::vector<std::string> stuck;
    int first = -1;
    for (int r : ranks_) {
      if (pc_[r] >= plans_[r].instructions_size()) continue;
      if (first < 0) first = r;
      const v1::Instruction& in = plans_[r].instructions(pc_[r]);
      stuck.push_back(absl::StrCat(
          "rank ", r, " at instruction ", pc_[r], " (", FormatInstruction(in), ")",
          IsSplitPass(plans_[r], in) ? " waiting for its context group's other lanes" : ""));
    }
    return Fail(first, pc_[first], plans_[first],
                absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; ")));
  }

  // (dp rank, pp rank, op, stage, micro-batch) of a split pass.
  using CollectiveKey = std::tuple<int, int, int, uint32_t, uint32_t>;

  std::span<const v1::ExecutionPlan> plans_;
  const std::vector<std::vector<int>>& start_of_wait_;
  std::span<const int> ranks_;
  std::vector<int> pc_;
  // Per rank: the instruction at which it last arrived at a split pass.
  std::vector<int> arrived_at_ = std::vector<int>(plans_.size(), -1);
  std::map<CollectiveKey, int> arrivals_;  // lanes arrived at each split pass
  // Per unordered pair: the transfers each side started, in order.
  std::map<Pair, std::vector<Started>> side_[2];
  std::map<Pair, int> completed_;  // transfers completed on the pair
  // (rank, instruction) of a Start -> its position on the pair's channel.
  std::map<Pair, int> position_;
};

absl::Status CheckDeadlockFree(std::span<const v1::ExecutionPlan> plans,
                               const std::vector<std::vector<int>>& start_of_wait,
                               std::span<const int> ranks) {
  return ChannelReplay(plans, start_of_wait, ranks).Run();
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
      const int peer = static_cast<int>(op == v1::Instruction::kSendStart ? in.send_start().peer()
                                                                          : in.recv_start().peer());
      if (peer < 0 || peer >= n) continue;  // CheckRank reports it
      const int a = find(r);
      const int b = find(peer);
      parent[std::max(a, b)] = std::min(a, b);
    }
  }
  // A context group's lanes meet in every split pass: one replay.
  std::map<std::pair<int, int>, int> first_lane;  // (dp rank, pp rank) -> rank
  for (int r = 0; r < n; ++r) {
    if (plans[r].context_parallel() <= 1) continue;
    const auto [it, added] =
        first_lane.emplace(std::make_pair(plans[r].dp_rank(), plans[r].pp_rank()), r);
    if (added) continue;
    const int a = find(r);
    const int b = find(it->second);
    parent[std::max(a, b)] = std::min(a, b);
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

// Context parallelism: every lane of a context group runs the split
// micro-batches' forwards and backwards in the same order (per stage, and
// so over the rank's stages), which the split's collectives need. Names
// the first lane and instruction that differ from the group's lowest lane.
absl::Status CheckSplitOrder(std::span<const v1::ExecutionPlan> plans) {
  struct Pass {
    int op;
    uint32_t stage;
    uint32_t micro_batch;
    int instruction;
    bool operator==(const Pass& o) const {
      return op == o.op && stage == o.stage && micro_batch == o.micro_batch;
    }
  };
  const auto split_passes = [](const v1::ExecutionPlan& plan) {
    std::vector<Pass> passes;
    for (int i = 0; i < plan.instructions_size(); ++i) {
      const v1::Instruction& in = plan.instructions(i);
      if (in.op_case() != v1::Instruction::kForward && in.op_case() != v1::Instruction::kBackward) {
        continue;
      }
      const int mb = static_cast<int>(in.micro_batch());
      if (mb >= plan.micro_batches_size() || !plan.micro_batches(mb).context().split()) continue;
      passes.push_back({static_cast<int>(in.op_case()), in.stage(), in.micro_batch(), i});
    }
    return passes;
  };
  const auto describe = [](const std::vector<Pass>& passes, size_t k) {
    if (k >= passes.size()) return std::string("nothing");
    const Pass& p = passes[k];
    return absl::StrCat(p.op == v1::Instruction::kForward ? "forward" : "backward", " of stage ",
                        p.stage, " micro-batch ", p.micro_batch);
  };
  std::map<std::pair<int, int>, int> first_lane;  // (dp rank, pp rank) -> rank
  std::map<int, std::vector<Pass>> passes_of;     // first lanes' passes
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    const v1::ExecutionPlan& plan = plans[r];
    if (plan.context_parallel() <= 1) continue;
    const auto [it, added] = first_lane.emplace(std::make_pair(plan.dp_rank(), plan.pp_rank()), r);
    std::vector<Pass> mine = split_passes(plan);
    if (added) {
      passes_of[r] = std::move(mine);
      continue;
    }
    const std::vector<Pass>& theirs = passes_of[it->second];
    for (size_t k = 0; k < std::max(mine.size(), theirs.size()); ++k) {
      if (k < mine.size() && k < theirs.size() && mine[k] == theirs[k]) continue;
      const int at = k < mine.size() ? mine[k].instruction : plan.instructions_size() - 1;
      return Fail(r, std::max(0, at), plan,
                  absl::StrCat("split micro-batches out of order in the context group: its ", k + 1,
                               "th split pass is the ", describe(mine, k), ", rank ", it->second,
                               "'s (lane ", plans[it->second].context_rank(), ") the ",
                               describe(theirs, k)));
    }
  }
  return absl::OkStatus();
}

// Each micro-batch's recompute mode (MicroBatch.recompute, empty: the
// plan's) is a known one, and every rank of a data-parallel replica (its
// stages and lanes) records the same for it: a micro-batch's passes on
// different stages keep what one simulation priced.
absl::Status CheckMicroBatchModes(std::span<const v1::ExecutionPlan> plans) {
  const auto known = [](const std::string& mode) {
    return mode == "none" || mode == "selective" || mode == "full";
  };
  std::map<std::pair<int, uint32_t>, std::pair<std::string, int>> first;  // (dp, id) -> mode, rank
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    const v1::ExecutionPlan& plan = plans[r];
    for (int m = 0; m < plan.micro_batches_size(); ++m) {
      const v1::MicroBatch& mb = plan.micro_batches(m);
      const std::string& mode = mb.recompute().empty() ? plan.recompute() : mb.recompute();
      if (!known(mode)) {
        return absl::InvalidArgumentError(absl::StrCat("invalid plan: rank ", r, ": micro_batches[",
                                                       m, "].recompute is '", mode,
                                                       "' (expected none, selective or full)"));
      }
      const auto [it, added] = first.try_emplace({plan.dp_rank(), mb.id()}, mode, r);
      if (!added && it->second.first != mode) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid plan: rank ", r, ": micro-batch ", mb.id(), " recomputes '", mode,
                         "' but rank ", it->second.second, " of its replica recomputes '",
                         it->second.first, "'"));
      }
    }
  }
  return absl::OkStatus();
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

absl::Status ValidateMicroBatchLengths(std::span<const v1::ExecutionPlan> plans,
                                       const LengthLimits& limits) {
  for (size_t r = 0; r < plans.size(); ++r) {
    for (int m = 0; m < plans[r].micro_batches_size(); ++m) {
      const v1::MicroBatch& mb = plans[r].micro_batches(m);
      const auto over = [&](absl::string_view field, uint32_t length, uint32_t limit,
                            absl::string_view limit_field) {
        return absl::InvalidArgumentError(absl::StrCat("invalid plan: rank ", r, ", micro_batches[",
                                                       m, "].", field, " is ", length, ", over ",
                                                       limit_field, " ", limit));
      };
      if (mb.context().split()) {
        // A split micro-batch's input_len is a lane's share of all its
        // samples packed back to back: the limit bounds each sample's
        // sequence (GPT, Llama: its input then its target tokens).
        for (int i = 0; i < mb.sample_input_lens_size(); ++i) {
          const uint32_t sequence =
              mb.sample_input_lens(i) +
              (i < mb.sample_target_lens_size() ? mb.sample_target_lens(i) : 0);
          if (limits.max_input > 0 && sequence > limits.max_input) {
            return over(absl::StrCat("sample ", i, "'s sequence"), sequence, limits.max_input,
                        "data.max_sequence_length");
          }
        }
        continue;
      }
      if (limits.max_input > 0 && mb.input_len() > limits.max_input) {
        return over("input_len", mb.input_len(), limits.max_input, "data.max_sequence_length");
      }
      if (limits.max_target > 0 && mb.target_len() > limits.max_target) {
        return over("target_len", mb.target_len(), limits.max_target, "data.max_target_length");
      }
    }
  }
  return absl::OkStatus();
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
  if (absl::Status s = CheckSplitOrder(plans); !s.ok()) return s;
  if (absl::Status s = CheckMicroBatchModes(plans); !s.ok()) return s;
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

absl::Status ValidatePlans(std::span<const v1::ExecutionPlan> plans,
                           std::span<const double> peak_bytes,
                           std::span<const double> memory_limit_bytes, int threads,
                           std::span<const StageCostTable* const> rank_costs) {
  if (absl::Status s = ValidatePlans(plans, peak_bytes, memory_limit_bytes, threads); !s.ok()) {
    return s;
  }
  const size_t n = std::min({plans.size(), rank_costs.size(), memory_limit_bytes.size()});
  std::vector<absl::Status> status(n);
  ParallelFor(n, threads, [&](size_t r) {
    if (rank_costs[r] == nullptr) return;
    absl::StatusOr<ReplayedPeak> peak = ReplayActivationMemory(plans[r], *rank_costs[r]);
    if (!peak.ok()) {
      status[r] = absl::InvalidArgumentError(
          absl::StrCat("invalid plan: rank ", r, ": ", peak.status().message()));
      return;
    }
    const double limit = memory_limit_bytes[r];
    if (peak->bytes > limit * (1 + 1e-9)) {
      status[r] = absl::InvalidArgumentError(absl::StrFormat(
          "invalid plan: rank %d: its live buffers and kept activations reach %.1f MiB after "
          "instruction %d (%s), over its limit of %.1f MiB",
          r, peak->bytes / (1 << 20), peak->instruction,
          FormatInstruction(plans[r].instructions(peak->instruction)), limit / (1 << 20)));
    }
  });
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace varipipe::planner
