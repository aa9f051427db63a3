#include "executor/comm/transport_factory.h"

#include "absl/strings/str_cat.h"
#include "executor/comm/device_staging_transport.h"
#include "executor/comm/gloo/gloo_transport.h"
#ifdef VARIPIPE_HAVE_NCCL
#include "executor/comm/nccl/nccl_transport.h"
#endif

namespace varipipe::executor {

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& o) {
  if (o.cuda_device >= 0 && !o.gloo_on_gpu) {
#ifdef VARIPIPE_HAVE_NCCL
    NcclTransport::Options n;
    n.redis = o.redis;
    n.prefix = o.prefix;
    n.rank = o.rank;
    n.size = o.size;
    n.device = o.cuda_device;
    n.peers = o.peers;
    n.data_parallel_group = o.data_parallel_group;
    n.tensor_group = o.tensor_group;
    n.connect_timeout = o.connect_timeout;
    n.collective_timeout = o.collective_timeout;
    n.cancelled = o.cancelled;
    absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(n);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Transport>(std::move(*t));
#else
    return absl::FailedPreconditionError(
        "this executor was built without NCCL (VARIPIPE_WITH_CUDA); it cannot drive GPUs");
#endif
  }
  GlooTransport::Options g;
  g.redis = o.redis;
  g.prefix = o.prefix;
  g.rank = o.rank;
  g.size = o.size;
  g.hostname = o.hostname;
  g.connect_timeout = o.connect_timeout;
  g.collective_timeout = o.collective_timeout;
  g.cancelled = o.cancelled;
  absl::StatusOr<std::unique_ptr<GlooTransport>> t = GlooTransport::Create(g);
  if (!t.ok()) return t.status();
  if (o.cuda_device >= 0) {
    return std::unique_ptr<Transport>(std::make_unique<DeviceStagingTransport>(
        std::move(*t), torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(o.cuda_device))));
  }
  return std::unique_ptr<Transport>(std::move(*t));
}

}  // namespace varipipe::executor
