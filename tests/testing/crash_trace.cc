// Linked into every test binary (an object library, so the linker keeps it):
// a test that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) writes the
// failing thread's stack to stderr before it dies, so a crash on a machine
// without a debugger (the GPU machine of docs/gpu.md) still says where it
// happened: the faulting address and instruction, the return address on
// top of the stack (the caller, when the crash is a call through a null or
// stale function pointer, which leaves nothing to unwind), and the stack as
// glibc's backtrace() unwinds it, as "object(+offset)" for addr2line.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

void WriteString(const char* s) {
  // Best effort: nothing to do about a short write while dying.
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, s, strlen(s));
}

// Writes "label 0x... (object+0x...)" without allocating.
void WriteAddress(const char* label, uintptr_t address) {
  char text[32];
  int n = 0;
  text[n++] = '0';
  text[n++] = 'x';
  for (int shift = 60; shift >= 0; shift -= 4)
    text[n++] = "0123456789abcdef"[(address >> shift) & 15];
  text[n] = 0;
  WriteString(label);
  WriteString(text);
  Dl_info info{};
  if (address != 0 && dladdr(reinterpret_cast<void*>(address), &info) != 0 &&
      info.dli_fname != nullptr) {
    const uintptr_t offset = address - reinterpret_cast<uintptr_t>(info.dli_fbase);
    n = 0;
    for (int shift = 60; shift >= 0; shift -= 4)
      text[n++] = "0123456789abcdef"[(offset >> shift) & 15];
    text[n] = 0;
    WriteString(" (");
    WriteString(info.dli_fname);
    WriteString("+0x");
    WriteString(text);
    if (info.dli_sname != nullptr) {
      WriteString(" in ");
      WriteString(info.dli_sname);
    }
    WriteString(")");
  }
  WriteString("\n");
}

void OnCrash(int signal_number, siginfo_t* info, void* context) {
  WriteString("\n*** test crashed: ");
  WriteString(strsignal(signal_number));
  WriteString("\n");
  WriteAddress("fault address ", reinterpret_cast<uintptr_t>(info->si_addr));
#if defined(__x86_64__)
  const auto* uc = static_cast<const ucontext_t*>(context);
  WriteAddress("instruction   ", static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]));
  const uintptr_t sp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  if (sp != 0 && sp % sizeof(uintptr_t) == 0) {
    WriteAddress("return address on the stack ", *reinterpret_cast<const uintptr_t*>(sp));
  }
#else
  (void)context;
#endif
  WriteString("stack of the failing thread:\n");
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
  action.sa_sigaction = OnCrash;
  action.sa_flags = SA_ONSTACK | SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(s, &action, nullptr);
  return true;
}();

}  // namespace
