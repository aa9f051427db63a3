#include "executor/runtime/device_timeline.h"

#ifdef VARIPIPE_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace varipipe::executor {

// The CUDA calls, behind one seam; a build without CUDA never makes events.
#ifdef VARIPIPE_HAVE_NCCL
namespace {

void* RecordEvent(int device) {
  cudaSetDevice(device);
  cudaEvent_t event = nullptr;
  TORCH_CHECK(cudaEventCreate(&event) == cudaSuccess, "cudaEventCreate failed");
  // LibTorch queues its kernels on the legacy default stream of the device.
  TORCH_CHECK(cudaEventRecord(event, cudaStreamLegacy) == cudaSuccess, "cudaEventRecord failed");
  return event;
}

void WaitEvent(void* event) {
  TORCH_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)) == cudaSuccess,
              "cudaEventSynchronize failed");
}

double EventSeconds(void* from, void* to) {
  float ms = 0;
  TORCH_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from),
                                   static_cast<cudaEvent_t>(to)) == cudaSuccess,
              "cudaEventElapsedTime failed");
  return static_cast<double>(ms) / 1e3;
}

void DestroyEvent(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

constexpr bool kCudaBuild = true;

}  // namespace
#else
namespace {
void* RecordEvent(int) { return nullptr; }
void WaitEvent(void*) {}
double EventSeconds(void*, void*) { return 0; }
void DestroyEvent(void*) {}
constexpr bool kCudaBuild = false;
}  // namespace
#endif

DeviceTimeline::DeviceTimeline(torch::Device device, bool device_events)
    : device_events_(device_events && device.is_cuda() && kCudaBuild) {
  device_index_ = device.has_index() ? device.index() : 0;
}

DeviceTimeline::~DeviceTimeline() {
  for (void* event : events_) DestroyEvent(event);
}

int DeviceTimeline::Mark() {
  if (device_events_) {
    events_.push_back(RecordEvent(device_index_));
    return static_cast<int>(events_.size()) - 1;
  }
  host_marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(host_marks_.size()) - 1;
}

void DeviceTimeline::Finish() {
  if (device_events_ && !events_.empty()) WaitEvent(events_.back());
}

double DeviceTimeline::Seconds(int from, int to) const {
  if (device_events_) return EventSeconds(events_.at(from), events_.at(to));
  return std::chrono::duration<double>(host_marks_.at(to) - host_marks_.at(from)).count();
}

}  // namespace varipipe::executor
