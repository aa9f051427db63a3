// Marks in the order of the work queued on the compute device, whose
// distances (the device time of the passes between them) are read once, at
// the end of an iteration, instead of draining the device around every pass.
// On a GPU with device timing a mark is a CUDA event recorded on the compute
// stream (LibTorch's default stream); otherwise it is the host's clock when
// the mark was made: exact on CPUs, the launch time on GPUs.
//
//   DeviceTimeline timeline(device, /*device_events=*/true);
//   const int start = timeline.Mark();
//   ... queue a pass ...
//   const int end = timeline.Mark();
//   timeline.Finish();                         // one wait, for the last mark
//   double seconds = timeline.Seconds(start, end);
#ifndef VARIPIPE_EXECUTOR_RUNTIME_DEVICE_TIMELINE_H_
#define VARIPIPE_EXECUTOR_RUNTIME_DEVICE_TIMELINE_H_

#include <torch/torch.h>

#include <chrono>
#include <vector>

namespace varipipe::executor {

class DeviceTimeline {
 public:
  // `device_events` takes effect on CUDA devices of a build with CUDA
  // (VARIPIPE_HAVE_NCCL); elsewhere marks are host times.
  DeviceTimeline(torch::Device device, bool device_events);
  ~DeviceTimeline();
  DeviceTimeline(const DeviceTimeline&) = delete;
  DeviceTimeline& operator=(const DeviceTimeline&) = delete;

  // Whether marks are device events (Finish then waits for the device).
  bool device_events() const { return device_events_; }

  // A new mark after everything queued so far; returns its index.
  int Mark();
  // Waits for the last mark (device events) so that Seconds may be read.
  // Call once, after the last Mark.
  void Finish();
  // Seconds from mark `from` to mark `to` (after Finish).
  double Seconds(int from, int to) const;

 private:
  bool device_events_;
  int device_index_ = 0;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
  std::vector<void*> events_;  // cudaEvent_t, with device events
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_DEVICE_TIMELINE_H_
