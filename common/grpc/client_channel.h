// A client channel to a Varipipe gRPC service (a planner daemon, an
// executor's status endpoint) that presents the job token on every call and
// speaks TLS when TLS files are given (docs/security.md).
//
//   VP_ASSIGN_OR_RETURN(std::string token, ClientJobToken(token_file, store_file));
//   VP_ASSIGN_OR_RETURN(auto channel,
//                       CreateClientChannel(address, {.token = token}, grpc::ChannelArguments()));
#ifndef VARIPIPE_COMMON_GRPC_CLIENT_CHANNEL_H_
#define VARIPIPE_COMMON_GRPC_CLIENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc/tls_files.h"
#include "grpcpp/grpcpp.h"

namespace varipipe {

struct ClientSecurity {
  // The job token (common/auth/job_token.h: ClientJobToken); empty: none.
  std::string token = "";
  TlsFiles tls = {};
};

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& address, const ClientSecurity& security, const grpc::ChannelArguments& args);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_GRPC_CLIENT_CHANNEL_H_
