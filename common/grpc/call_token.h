// The job token on gRPC calls (docs/security.md): clients send it in the
// standard "authorization" request header as "Bearer <token>", added to
// every call by a client interceptor on the channel; services check it with
// CallTokenVerifier before doing anything else and answer UNAUTHENTICATED
// when it is missing or wrong. The standard health service and server
// reflection are not checked.
//
// Why in the handlers: gRPC 1.51 attaches an AuthMetadataProcessor only to
// secure server credentials (InsecureServerCredentials aborts) and a server
// interceptor cannot end a call, so the services call Verify() first; the
// same check serves plaintext and TLS.
//
//   server:  if (grpc::Status s = verifier.Verify(*context); !s.ok()) return s;
//   client:  CreateClientChannel(address, {.token = token}, args)  (client_channel.h)
#ifndef VARIPIPE_COMMON_GRPC_CALL_TOKEN_H_
#define VARIPIPE_COMMON_GRPC_CALL_TOKEN_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"

namespace varipipe {

inline constexpr char kCallTokenHeader[] = "authorization";
inline constexpr char kCallTokenScheme[] = "Bearer ";

class CallTokenVerifier {
 public:
  // `token` empty: every call is accepted (no authentication).
  explicit CallTokenVerifier(std::string token) : token_(std::move(token)) {}

  // OK when the call carries the token (compared in constant time);
  // UNAUTHENTICATED, with a message saying where clients find the token,
  // otherwise.
  grpc::Status Verify(const grpc::ServerContext& context) const;

 private:
  std::string token_;
};

// Adds "authorization: Bearer <token>" to every call of a channel.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> CallTokenInterceptor(
    std::string token);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_GRPC_CALL_TOKEN_H_
