// The iteration trace (executor/runtime/iteration_trace.h): summaries of
// hand-written Chrome traces whose shares are known (device kernels of each
// kind with an idle gap; host operators nested inside each other, only the
// outermost counted), a file that is not a trace refused naming it, and a
// real trace of LibTorch operators on the CPU, written by the profiler and
// summarised with its matrix products found.
#include "executor/runtime/iteration_trace.h"

#include <torch/torch.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/testing/test_directory.h"

namespace varipipe::executor {
namespace {

std::string Write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(IterationTraceTest, SummarisesDeviceKernelsByKindWithIdleGaps) {
  const std::string dir = ::varipipe::testing::PerTestDirectory("trace").string();
  // 0-100 GEMM, 100-150 flash attention, idle 150-200, 200-250 element-wise,
  // 250-300 NCCL, 300-310 a copy; the host operator is ignored when kernels
  // exist.
  const std::string path = Write(dir, "device.json", R"json({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 1000, "dur": 100},
    {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 1100, "dur": 50},
    {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": 1200, "dur": 50},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32", "ts": 1250, "dur": 50},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 1300, "dur": 10},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},
    {"ph": "i", "name": "marker", "ts": 1}
  ]})json");
  absl::StatusOr<TraceSummary> s = SummarizeChromeTrace(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->device);
  EXPECT_EQ(s->events, 5);
  EXPECT_DOUBLE_EQ(s->span_us, 310);
  EXPECT_DOUBLE_EQ(s->matrix_us, 100);
  EXPECT_DOUBLE_EQ(s->attention_us, 50);
  EXPECT_DOUBLE_EQ(s->other_us, 50);
  EXPECT_DOUBLE_EQ(s->communication_us, 50);
  EXPECT_DOUBLE_EQ(s->copy_us, 10);
  EXPECT_DOUBLE_EQ(s->idle_us, 50);
  const std::string line = FormatTraceSummary(*s);
  EXPECT_TRUE(absl::StrContains(line, "5 kernels")) << line;
  EXPECT_TRUE(absl::StrContains(line, "idle gaps 16.1%")) << line;
}

TEST(IterationTraceTest, CountsOnlyTheOutermostHostOperators) {
  const std::string dir = ::varipipe::testing::PerTestDirectory("trace").string();
  const std::string path = Write(dir, "host.json", R"json([
    {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 100, "pid": 1, "tid": 7},
    {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 80, "pid": 1, "tid": 7},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 150, "dur": 10, "pid": 1, "tid": 7}
  ])json");
  absl::StatusOr<TraceSummary> s = SummarizeChromeTrace(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->device);
  EXPECT_EQ(s->events, 2);
  EXPECT_DOUBLE_EQ(s->matrix_us, 100);
  EXPECT_DOUBLE_EQ(s->other_us, 10);
  EXPECT_DOUBLE_EQ(s->idle_us, 50);
}

TEST(IterationTraceTest, RefusesFilesThatAreNotTraces) {
  const std::string dir = ::varipipe::testing::PerTestDirectory("trace").string();
  for (const std::string& text : {std::string("not json"), std::string(R"({"events": 3})"),
                                  std::string(R"({"traceEvents": []})")}) {
    const std::string path = Write(dir, "bad.json", text);
    absl::StatusOr<TraceSummary> s = SummarizeChromeTrace(path);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(s.status().message(), path)) << s.status();
  }
  EXPECT_EQ(SummarizeChromeTrace(dir + "/missing.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(IterationTraceTest, TracesLibTorchOperatorsOnTheCpu) {
  const std::string dir = ::varipipe::testing::PerTestDirectory("trace").string();
  const absl::Status started = StartIterationTrace(/*cuda=*/false);
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(StartIterationTrace(false).code(), absl::StatusCode::kFailedPrecondition);
  const torch::Tensor a = torch::randn({128, 128});
  torch::Tensor b = a;
  for (int i = 0; i < 4; ++i) b = torch::relu(torch::mm(b, a));
  const std::string path = dir + "/cpu.trace.json";
  const absl::Status stopped = StopIterationTrace(path);
  ASSERT_TRUE(stopped.ok()) << stopped;
  EXPECT_EQ(StopIterationTrace(path).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<TraceSummary> s = SummarizeChromeTrace(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->device);
  EXPECT_GT(s->matrix_us, 0) << FormatTraceSummary(*s);
  EXPECT_GT(s->other_us, 0) << FormatTraceSummary(*s);
  std::printf("%s\n", FormatTraceSummary(*s).c_str());
}

}  // namespace
}  // namespace varipipe::executor
