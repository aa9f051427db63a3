// TLS for the gRPC services from PEM files, with gRPC's own SSL credentials
// (docs/security.md). A server with a certificate and key serves TLS; with a
// CA as well it requires and verifies client certificates signed by that CA
// (mutual TLS). A client with a CA verifies the server against it (else the
// system's roots); with a certificate and key it presents them.
#ifndef VARIPIPE_COMMON_GRPC_TLS_FILES_H_
#define VARIPIPE_COMMON_GRPC_TLS_FILES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace varipipe {

struct TlsFiles {
  std::string cert_file = "";  // --tls_cert
  std::string key_file = "";   // --tls_key
  std::string ca_file = "";    // --tls_ca
  // Clients: TLS although no file is given (verify with the system's roots).
  bool force = false;

  bool enabled() const {
    return force || !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
};

// Insecure credentials when no file is set; SSL credentials otherwise.
// INVALID_ARGUMENT naming the flag for a missing half of a certificate/key
// pair (a server needs both) or an unreadable file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const TlsFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFiles(
    const TlsFiles& files);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_GRPC_TLS_FILES_H_
