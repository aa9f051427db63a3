// Linked into every test binary (an object library, so the linker keeps it):
// a test that crashes (SIGSEGV, SIGABRT, ...) prints a symbolized stack trace
// of the failing thread before it dies, so a crash on a machine without a
// debugger (the GPU machine of docs/gpu.md) still says where it happened.
#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"

namespace {

const bool kInstalled = [] {
  absl::InitializeSymbolizer("/proc/self/exe");
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  return true;
}();

}  // namespace
