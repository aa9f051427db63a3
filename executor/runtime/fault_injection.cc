#include "executor/runtime/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace varipipe::executor {
namespace {

constexpr char kVariable[] = "VARIPIPE_FAULT_INJECTION";

enum class FaultAction { kKill, kSigterm, kError };

constexpr FaultPoint kPoints[] = {
    FaultPoint::kBeforeRendezvous,    FaultPoint::kAfterRendezvous,
    FaultPoint::kBeforeAllReduce,     FaultPoint::kInSend,
    FaultPoint::kInReceive,           FaultPoint::kInAllReduce,
    FaultPoint::kInShardedCollective, FaultPoint::kInCheckpointWrite,
    FaultPoint::kBetweenIterations,   FaultPoint::kInReport,
    FaultPoint::kInContextGather,
};

struct Fault {
  FaultPoint point;
  FaultAction action;
  std::optional<uint64_t> iteration;  // default: the launch's first
};

struct State {
  absl::Mutex mu;
  std::optional<Fault> fault ABSL_GUARDED_BY(mu);  // this rank's, until it fired
  std::optional<uint64_t> iteration ABSL_GUARDED_BY(mu);
  uint64_t first_iteration ABSL_GUARDED_BY(mu) = 0;
};

State& GetState() {
  static State* state = new State;
  return *state;
}

bool InsideIteration(FaultPoint point) {
  return point != FaultPoint::kBeforeRendezvous && point != FaultPoint::kAfterRendezvous;
}

absl::string_view ActionName(FaultAction action) {
  switch (action) {
    case FaultAction::kKill:
      return "kill";
    case FaultAction::kSigterm:
      return "sigterm";
    case FaultAction::kError:
      return "error";
  }
  return "?";
}

}  // namespace

absl::string_view FaultPointName(FaultPoint point) {
  switch (point) {
    case FaultPoint::kBeforeRendezvous:
      return "before_rendezvous";
    case FaultPoint::kAfterRendezvous:
      return "after_rendezvous";
    case FaultPoint::kBeforeAllReduce:
      return "before_all_reduce";
    case FaultPoint::kInSend:
      return "in_send";
    case FaultPoint::kInReceive:
      return "in_receive";
    case FaultPoint::kInAllReduce:
      return "in_all_reduce";
    case FaultPoint::kInShardedCollective:
      return "in_sharded_collective";
    case FaultPoint::kInContextGather:
      return "in_context_gather";
    case FaultPoint::kInCheckpointWrite:
      return "in_checkpoint_write";
    case FaultPoint::kBetweenIterations:
      return "between_iterations";
    case FaultPoint::kInReport:
      return "in_report";
  }
  return "?";
}

absl::Status ConfigureFaultInjection(int rank) {
  const char* value = std::getenv(kVariable);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  const auto bad = [value](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(kVariable, "='", value, "': ", why,
                     " (expected rank=R,point=P,action=kill|sigterm|error[,iteration=I]; "
                     "docs/operations.md, \"Fault injection\")"));
  };
  std::optional<int> fault_rank;
  std::optional<FaultPoint> point;
  std::optional<FaultAction> action;
  std::optional<uint64_t> iteration;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return bad(absl::StrCat("'", part, "' is not key=value"));
    const absl::string_view key = kv[0];
    const absl::string_view v = kv[1];
    if (key == "rank") {
      int r = 0;
      if (!absl::SimpleAtoi(v, &r) || r < 0) return bad(absl::StrCat("rank '", v, "'"));
      fault_rank = r;
    } else if (key == "point") {
      for (FaultPoint p : kPoints) {
        if (FaultPointName(p) == v) point = p;
      }
      if (!point) return bad(absl::StrCat("unknown point '", v, "'"));
    } else if (key == "action") {
      for (FaultAction a : {FaultAction::kKill, FaultAction::kSigterm, FaultAction::kError}) {
        if (ActionName(a) == v) action = a;
      }
      if (!action) return bad(absl::StrCat("unknown action '", v, "'"));
    } else if (key == "iteration") {
      uint64_t i = 0;
      if (!absl::SimpleAtoi(v, &i)) return bad(absl::StrCat("iteration '", v, "'"));
      iteration = i;
    } else {
      return bad(absl::StrCat("unknown key '", key, "'"));
    }
  }
  if (!fault_rank || !point || !action) return bad("rank, point and action are required");
  spdlog::warn("fault injection armed ({}={}){}", kVariable, value,
               *fault_rank == rank ? ": this rank will fail" : "");
  if (*fault_rank != rank) return absl::OkStatus();
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  state.fault = Fault{.point = *point, .action = *action, .iteration = iteration};
  return absl::OkStatus();
}

void SetFaultIteration(uint64_t iteration) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  state.iteration = iteration;
}

void SetFirstFaultIteration(uint64_t iteration) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  state.first_iteration = iteration;
}

absl::Status MaybeInjectFault(FaultPoint point) { return MaybeInjectFault(point, std::nullopt); }

absl::Status MaybeInjectFault(FaultPoint point, std::optional<uint64_t> at_iteration) {
  State& state = GetState();
  Fault fault;
  uint64_t iteration = 0;
  {
    absl::MutexLock lock(&state.mu);
    if (!state.fault.has_value() || state.fault->point != point) return absl::OkStatus();
    if (InsideIteration(point)) {
      if (!at_iteration.has_value() && !state.iteration.has_value()) return absl::OkStatus();
      iteration = at_iteration.has_value() ? *at_iteration : *state.iteration;
      if (iteration != state.fault->iteration.value_or(state.first_iteration)) {
        return absl::OkStatus();
      }
    }
    fault = *state.fault;
    state.fault.reset();  // fires once
  }
  const std::string where =
      InsideIteration(point) ? absl::StrCat(" in iteration ", iteration) : std::string();
  spdlog::warn("injecting fault: {} at {}{} (at_us={})", std::string(ActionName(fault.action)),
               std::string(FaultPointName(point)), where, absl::ToUnixMicros(absl::Now()));
  spdlog::default_logger()->flush();
  switch (fault.action) {
    case FaultAction::kKill:
      ::kill(::getpid(), SIGKILL);
      break;
    case FaultAction::kSigterm:
      // To the process, not this thread: the shutdown thread sigwait()s for
      // it (every other thread blocks it).
      ::kill(::getpid(), SIGTERM);
      return absl::OkStatus();
    case FaultAction::kError:
      break;
  }
  return absl::InternalError(
      absl::StrCat("injected failure at ", FaultPointName(point), where, " (", kVariable, ")"));
}

}  // namespace varipipe::executor
