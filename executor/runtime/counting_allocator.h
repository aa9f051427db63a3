// Measured memory on CPUs: a c10 CPU allocator that wraps LibTorch's own and
// counts the bytes of every live tensor storage, so an executor can report its
// current and peak memory per instruction as the CUDA caching allocator's
// statistics do on GPUs.
//
// Bytes are charged to a MemoryAccount: the calling thread's (ScopedAccount),
// else the process-wide one. A storage is credited back to the account that
// paid for it, whichever thread frees it, so ranks running as threads of one
// process (the tests) each see their own memory.
//
//   InstallCountingCpuAllocator();           // once, before tensors exist
//   MemoryAccount account;
//   ScopedAccount scope(&account);           // this thread's allocations
//   ... account.current_bytes(), account.peak_bytes(), account.ResetPeak()
#ifndef VARIPIPE_EXECUTOR_RUNTIME_COUNTING_ALLOCATOR_H_
#define VARIPIPE_EXECUTOR_RUNTIME_COUNTING_ALLOCATOR_H_

#include <atomic>
#include <cstdint>

namespace varipipe::executor {

class MemoryAccount {
 public:
  int64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak at the current level.
  void ResetPeak() { peak_.store(current_bytes(), std::memory_order_relaxed); }

  void Add(int64_t bytes);

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// The process-wide account (allocations of threads without a scoped one).
MemoryAccount& ProcessMemoryAccount();

// Charges the current thread's CPU allocations to `account` while it lives.
// The account must outlive every storage charged to it (they credit it back
// when freed).
class ScopedAccount {
 public:
  explicit ScopedAccount(MemoryAccount* account);
  ~ScopedAccount();
  ScopedAccount(const ScopedAccount&) = delete;
  ScopedAccount& operator=(const ScopedAccount&) = delete;

 private:
  MemoryAccount* previous_;
};

// Makes the counting allocator LibTorch's CPU allocator (idempotent). Storages
// allocated before keep their original deleter and are not counted.
void InstallCountingCpuAllocator();
bool CountingCpuAllocatorInstalled();

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_COUNTING_ALLOCATOR_H_
