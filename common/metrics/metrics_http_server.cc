#include "common/metrics/metrics_http_server.h"

#include <sys/socket.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace varipipe::metrics {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, Registry* registry, const std::string& flag) {
  // A bare port listens on loopback.
  const std::string address =
      listen.find(':') == std::string::npos ? absl::StrCat("127.0.0.1:", listen) : listen;
  const size_t colon = address.rfind(':');
  int port = -1;
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", listen, "': expected HOST:PORT (port 0: a free one)"));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const bool bound = port == 0 ? (port = s->server_->bind_to_any_port(host)) > 0
                               : s->server_->bind_to_port(host, port);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (", flag,
        "): the port is in use by another process, or the host is not an address of this "
        "machine"));
  }
  s->host_ = host;
  s->port_ = port;
  s->thread_ = std::thread([server = s->server_.get(), ended = &s->ended_] {
    server->listen_after_bind();
    ended->store(true);
  });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  // stop() only reaches a server that is running: wait for it to start.
  if (!thread_.joinable()) return;  // never served (the bind failed)
  while (!server_->is_running() && !ended_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  thread_.join();
}

}  // namespace varipipe::metrics
