#include "common/grpc/client_channel.h"

#include <vector>

#include "common/grpc/call_token.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"

namespace varipipe {

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& address, const ClientSecurity& security,
    const grpc::ChannelArguments& args) {
  VP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      ChannelCredentialsFromFiles(security.tls));
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) interceptors.push_back(CallTokenInterceptor(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace varipipe
