// Linked into every test binary (an object library, so the linker keeps it):
// a test that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) writes the
// failing thread's stack to stderr before it dies, so a crash on a machine
// without a debugger (the GPU machine of docs/gpu.md) still says where it
// happened. glibc's backtrace() unwinds with the unwind tables (it needs no
// frame pointers); test binaries export their symbols (ENABLE_EXPORTS) so
// that backtrace_symbols_fd can name their functions too.
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

void WriteString(const char* s) {
  // Best effort: nothing to do about a short write while dying.
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, s, strlen(s));
}

void OnCrash(int signal_number) {
  WriteString("\n*** test crashed: ");
  WriteString(strsignal(signal_number));
  WriteString("; stack of the failing thread:\n");
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  // Default action (core dump, the right exit status for CTest).
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigaction(signal_number, &action, nullptr);
  raise(signal_number);
}

const bool kInstalled = [] {
  // Load libgcc's unwinder now, not inside the handler.
  void* warm_up[1];
  backtrace(warm_up, 1);
  // An alternate stack, so a stack overflow can be reported too.
  static char alternate_stack[1 << 16];
  stack_t stack{};
  stack.ss_sp = alternate_stack;
  stack.ss_size = sizeof(alternate_stack);
  sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_handler = OnCrash;
  action.sa_flags = SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(s, &action, nullptr);
  return true;
}();

}  // namespace
