// The executor's one door from device memory to host memory inside an
// iteration. On a GPU a read waits for every kernel queued before it, so the
// device idles while the host prepares what follows; the interpreter reads
// once per iteration (the local squared gradient norm together with the
// loss sum, which the gradient clipping and the log need) and queues
// everything else. Each read is counted, so that a test on CPUs (the same
// code path as on CUDA) and each iteration's log line can say how many there
// were (docs/executor.md, "Where the host waits").
//
//   HostReads reads;
//   torch::Tensor host = reads.Read(torch::stack({norm, loss}));  // 1 read
//   double norm = host[0].item<double>();                         // host memory
#ifndef VARIPIPE_EXECUTOR_RUNTIME_HOST_READS_H_
#define VARIPIPE_EXECUTOR_RUNTIME_HOST_READS_H_

#include <torch/torch.h>

namespace varipipe::executor {

class HostReads {
 public:
  // A host (CPU) tensor holding `tensor`'s values, contiguous; counts one
  // read whatever device `tensor` is on (a CPU tensor is returned as is).
  torch::Tensor Read(const torch::Tensor& tensor);

  // Reads since construction.
  int count() const { return count_; }

 private:
  int count_ = 0;
};

}  // namespace varipipe::executor

#endif  // VARIPIPE_EXECUTOR_RUNTIME_HOST_READS_H_
