// A Chrome trace of one iteration from LibTorch's profiler (Kineto), and its
// summary by kind of work: matrix products, attention, communication,
// copies, other kernels (element-wise, normalisation, reductions) and the
// idle gaps between them (varipipe-executor --profile_iteration).
//
// The summary reads the trace file, whose format (Chrome's trace-event
// JSON) is the same for every LibTorch, rather than the profiler's event
// classes, which change between versions. On a GPU it covers the device's
// kernels and copies; without device events (a CPU run) the host's
// outermost operators on each thread.
//
//   VP_RETURN_IF_ERROR(StartIterationTrace(/*cuda=*/true));
//   ... run the iteration ...
//   VP_RETURN_IF_ERROR(StopIterationTrace("iteration_5.rank_0.trace.json"));
//   absl::StatusOr<TraceSummary> s = SummarizeChromeTrace("iteration_5.rank_0.trace.json");
//   spdlog::info("{}", FormatTraceSummary(*s));
#ifndef VARIPIPE_EXECUTOR_RUNTIME_ITERATION_TRACE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_ITERATION_TRACE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace varipipe::executor {

// Starts the profiler (CPU activities, and CUDA's when `cuda`).
// FailedPrecondition when one is already running.
absl::Status StartIterationTrace(bool cuda);
// Stops it and writes the Chrome trace to `path`.
absl::Status StopIterationTrace(const std::string& path);

struct TraceSummary {
  bool device = false;  // device kernels (else host operators)
  int events = 0;       // the events summarised
  // From the first event's start to the last one's end, and the parts of it
  // (overlapping events of different kinds count for each; idle is the time
  // no summarised event covers).
  double span_us = 0;
  double matrix_us = 0;
  double attention_us = 0;
  double communication_us = 0;
  double copy_us = 0;
  double other_us = 0;
  double idle_us = 0;
};

// InvalidArgument naming the file and what is wrong when it is not a trace.
absl::StatusOr<TraceSummary> SummarizeChromeTrace(const std::string& path);

// "device trace: 1234 kernels over 512.3 ms: matrix products 61.0%, ...".
std::string FormatTraceSummary(const TraceSummary& summary);

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_ITERATION_TRACE_H_
