#include "executor/runtime/counting_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace varipipe::executor {
namespace {

thread_local MemoryAccount* current_account = nullptr;

// The live allocations by data pointer: the original DataPtr (freed with the
// entry) and whom to credit. LibTorch requires a CPU DataPtr's context to be
// its data pointer (Allocator::raw_allocate), hence the table rather than a
// context object.
struct Allocation {
  c10::DataPtr inner;
  int64_t bytes = 0;
  MemoryAccount* account = nullptr;
};

class AllocationTable {
 public:
  void Insert(void* data, Allocation allocation) {
    absl::MutexLock lock(&mutex_);
    live_[data] = std::move(allocation);
  }
  // Removes the entry; its DataPtr frees the memory when the returned value
  // goes out of scope (outside the lock).
  Allocation Remove(void* data) {
    absl::MutexLock lock(&mutex_);
    auto node = live_.extract(data);
    return node.empty() ? Allocation{} : std::move(node.mapped());
  }

 private:
  absl::Mutex mutex_;
  absl::flat_hash_map<void*, Allocation> live_ ABSL_GUARDED_BY(mutex_);
};

AllocationTable& Table() {
  static AllocationTable* table = new AllocationTable();  // outlives every storage
  return *table;
}

void FreeCounted(void* data) {
  Allocation allocation = Table().Remove(data);
  if (allocation.account != nullptr) allocation.account->Add(-allocation.bytes);
}

// LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define VARIPIPE_ALLOCATE_CONST
#define VARIPIPE_ALLOCATOR_HAS_COPY_DATA 1
#else
#define VARIPIPE_ALLOCATE_CONST const
#endif

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) VARIPIPE_ALLOCATE_CONST override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    MemoryAccount* account = current_account != nullptr ? current_account : &ProcessMemoryAccount();
    account->Add(static_cast<int64_t>(n));
    Table().Insert(data, Allocation{std::move(inner), static_cast<int64_t>(n), account});
    return c10::DataPtr(data, data, &FreeCounted, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &FreeCounted; }

#ifdef VARIPIPE_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* base_;
};

std::atomic<bool> installed{false};

}  // namespace

void MemoryAccount::Add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

MemoryAccount& ProcessMemoryAccount() {
  static MemoryAccount* account = new MemoryAccount();
  return *account;
}

ScopedAccount::ScopedAccount(MemoryAccount* account) : previous_(current_account) {
  current_account = account;
}

ScopedAccount::~ScopedAccount() { current_account = previous_; }

void InstallCountingCpuAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: storages may outlive every static destructor.
    static CountingCpuAllocator* allocator = new CountingCpuAllocator(c10::GetCPUAllocator());
    // Priority above LibTorch's default (0) and its mobile allocator.
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    installed.store(true);
  });
}

bool CountingCpuAllocatorInstalled() { return installed.load(); }

}  // namespace varipipe::executor
