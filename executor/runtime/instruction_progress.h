// Where a running plan is, for status endpoints on other threads: the index
// of the instruction being executed (-1 between iterations) and when it
// started (steady-clock nanoseconds). Written by the plan interpreter before
// every instruction.
#ifndef VARIPIPE_EXECUTOR_RUNTIME_INSTRUCTION_PROGRESS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_INSTRUCTION_PROGRESS_H_

#include <atomic>
#include <cstdint>

namespace varipipe::executor {

struct InstructionProgress {
  std::atomic<int> index{-1};
  std::atomic<int64_t> started_ns{0};
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_INSTRUCTION_PROGRESS_H_
