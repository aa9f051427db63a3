#include "executor/runtime/iteration_trace.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace varipipe::executor {
namespace {

namespace profiler = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

bool tracing = false;  // one trace at a time (the interpreter's thread)

enum class Kind { kMatrix, kAttention, kCommunication, kCopy, kOther };

// The kind of a kernel or operator, by its name.
Kind KindOf(const std::string& name, const std::string& category) {
  const std::string n = absl::AsciiStrToLower(name);
  const auto any = [&n](std::initializer_list<const char*> words) {
    for (const char* w : words) {
      if (absl::StrContains(n, w)) return true;
    }
    return false;
  };
  if (any({"nccl", "gloo", "allreduce", "all_reduce", "reducescatter", "allgather", "sendrecv"})) {
    return Kind::kCommunication;
  }
  if (absl::StrContains(category, "memcpy") || absl::StrContains(category, "memset") ||
      any({"memcpy", "memset", "aten::copy_", "aten::to", "aten::_to_copy"})) {
    return Kind::kCopy;
  }
  if (any({"flash", "fmha", "attention", "softmax", "scaled_dot_product", "sdpa"})) {
    return Kind::kAttention;
  }
  if (any({"gemm", "matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
           "aten::linear", "cutlass", "xmma", "cublas", "wgmma", "sm90_", "sm80_"})) {
    return Kind::kMatrix;
  }
  return Kind::kOther;
}

// An event's start and duration in microseconds: LibTorch 1.x and early 2.x
// count in microseconds, later ones in nanoseconds.
template <typename Event>
double StartUs(const Event& e) {
  if constexpr (requires { e.startNs(); }) {
    return static_cast<double>(e.startNs()) / 1e3;
  } else {
    return static_cast<double>(e.startUs());
  }
}
template <typename Event>
double DurationUs(const Event& e) {
  if constexpr (requires { e.durationNs(); }) {
    return static_cast<double>(e.durationNs()) / 1e3;
  } else {
    return static_cast<double>(e.durationUs());
  }
}

// The events as a Chrome trace, for a LibTorch built without Kineto, whose
// profiler records the host's operators but cannot save them.
absl::Status WriteEvents(const profiler::ProfilerResult& result, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  for (const profiler::KinetoEvent& e : result.events()) {
    const bool device = e.deviceType() != c10::DeviceType::CPU;
    events.push_back({{"ph", "X"},
                      {"cat", device ? "kernel" : "cpu_op"},
                      {"name", e.name()},
                      {"ts", StartUs(e)},
                      {"dur", DurationUs(e)},
                      {"pid", device ? 1 : 0},
                      {"tid", e.startThreadId()}});
  }
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", events}}.dump() << "\n";
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write the trace"));
  return absl::OkStatus();
}

struct Interval {
  double begin = 0;
  double end = 0;
  Kind kind = Kind::kOther;
};

}  // namespace

absl::Status StartIterationTrace(bool cuda) {
  if (tracing) return absl::FailedPreconditionError("a trace is already being recorded");
  try {
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (cuda) activities.insert(impl::ActivityType::CUDA);
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("starting LibTorch's profiler: ", e.what()));
  }
  tracing = true;
  return absl::OkStatus();
}

absl::Status StopIterationTrace(const std::string& path) {
  if (!tracing) return absl::FailedPreconditionError("no trace is being recorded");
  tracing = false;
  try {
    std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
    if (result == nullptr) return absl::InternalError("LibTorch's profiler returned no result");
    try {
      result->save(path);  // Kineto's own trace: streams, copies, flows
    } catch (const c10::Error&) {
      // Built without Kineto (Debian's CPU LibTorch): the recorded events.
      if (absl::Status s = WriteEvents(*result, path); !s.ok()) return s;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("writing the trace ", path, ": ", e.what()));
  }
  if (!std::ifstream(path).good()) {
    return absl::InternalError(absl::StrCat("LibTorch's profiler wrote no trace to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<TraceSummary> SummarizeChromeTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the trace"));
  nlohmann::json trace;
  try {
    in >> trace;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON: ", e.what()));
  }
  const nlohmann::json* events = nullptr;
  if (trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array()) {
    events = &trace["traceEvents"];
  } else if (trace.is_array()) {
    events = &trace;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a Chrome trace (no traceEvents array)"));
  }
  // Complete events ("ph": "X") with a start and a duration: device kernels
  // and copies when there are any, else host operators.
  std::vector<Interval> device;
  std::map<std::pair<std::string, std::string>, std::vector<Interval>> host;  // by (pid, tid)
  std::vector<std::string> host_names;
  for (const nlohmann::json& e : *events) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("ts") || !e.contains("dur") ||
        !e["ts"].is_number() || !e["dur"].is_number()) {
      continue;
    }
    const std::string category = absl::AsciiStrToLower(e.value("cat", ""));
    const std::string name = e.value("name", "");
    const Interval interval{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>(),
                            KindOf(name, category)};
    if (category == "kernel" || absl::StartsWith(category, "gpu_")) {
      device.push_back(interval);
    } else if (category == "cpu_op" || category == "operator") {
      host[{e.contains("pid") ? e["pid"].dump() : "", e.contains("tid") ? e["tid"].dump() : ""}]
          .push_back(interval);
    }
  }
  TraceSummary summary;
  std::vector<Interval> chosen;
  if (!device.empty()) {
    summary.device = true;
    chosen = std::move(device);
  } else {
    // Each thread's outermost operators (nested ones are inside them).
    for (auto& [thread, intervals] : host) {
      std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
      });
      double covered_until = -1;
      for (const Interval& i : intervals) {
        if (i.begin >= covered_until) {
          chosen.push_back(i);
          covered_until = i.end;
        }
      }
    }
  }
  if (chosen.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the trace holds no operator or kernel events"));
  }
  std::sort(chosen.begin(), chosen.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  summary.events = static_cast<int>(chosen.size());
  double first = chosen.front().begin;
  double last = chosen.front().end;
  double busy = 0;
  double busy_until = first;
  for (const Interval& i : chosen) {
    last = std::max(last, i.end);
    const double d = i.end - i.begin;
    switch (i.kind) {
      case Kind::kMatrix:
        summary.matrix_us += d;
        break;
      case Kind::kAttention:
        summary.attention_us += d;
        break;
      case Kind::kCommunication:
        summary.communication_us += d;
        break;
      case Kind::kCopy:
        summary.copy_us += d;
        break;
      case Kind::kOther:
        summary.other_us += d;
        break;
    }
    // The union of the intervals: what some event covers.
    if (i.end > busy_until) {
      busy += i.end - std::max(i.begin, busy_until);
      busy_until = i.end;
    }
  }
  summary.span_us = last - first;
  summary.idle_us = std::max(0.0, summary.span_us - busy);
  return summary;
}

std::string FormatTraceSummary(const TraceSummary& s) {
  const auto share = [&s](double us) { return s.span_us > 0 ? 100.0 * us / s.span_us : 0.0; };
  return absl::StrFormat(
      "%s trace: %d %s over %.1f ms: matrix products %.1f%%, attention %.1f%%, communication "
      "%.1f%%, copies %.1f%%, other (element-wise, norms, reductions) %.1f%%, idle gaps %.1f%%",
      s.device ? "device" : "host", s.events, s.device ? "kernels" : "operators", s.span_us / 1e3,
      share(s.matrix_us), share(s.attention_us), share(s.communication_us), share(s.copy_us),
      share(s.other_us), share(s.idle_us));
}

}  // namespace varipipe::executor
