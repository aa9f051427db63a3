// The /metrics endpoint: an HTTP server (cpp-httplib) that answers
// GET /metrics with a registry's text exposition (Prometheus' format 0.0.4)
// on its own thread. Any other path answers 404. The port is never shared
// with another process (no SO_REUSEPORT).
#ifndef VARIPIPE_COMMON_METRICS_METRICS_HTTP_SERVER_H_
#define VARIPIPE_COMMON_METRICS_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metric_registry.h"

namespace httplib {
class Server;
}

namespace varipipe::metrics {

class MetricsHttpServer {
 public:
  // `listen`: "HOST:PORT" ("[::1]:PORT" for IPv6) or "PORT" (loopback);
  // port 0 picks a free one.
  // InvalidArgument for a malformed address, Unavailable when the port
  // cannot be bound; both name `flag`.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, Registry* registry, const std::string& flag = "--metrics_listen");
  ~MetricsHttpServer();  // stops serving

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> ended_{false};  // listen_after_bind returned
  std::string host_;
  int port_ = 0;
};

}  // namespace varipipe::metrics

#endif  // VARIPIPE_COMMON_METRICS_METRICS_HTTP_SERVER_H_
