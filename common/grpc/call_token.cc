#include "common/grpc/call_token.h"

#include <string_view>
#include <utility>

#include "grpcpp/support/interceptor.h"

namespace varipipe {
namespace {

// Compares without an early exit, so the time taken does not reveal how much
// of the token a guess got right (the length is no secret).
bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return difference == 0;
}

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kCallTokenHeader, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token)
      : header_(std::string(kCallTokenScheme) + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives the channel's calls (the channel owns the factory)
};

}  // namespace

grpc::Status CallTokenVerifier::Verify(const grpc::ServerContext& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kCallTokenHeader);
  if (found == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this call needs the job's token (varipipe-ctl --token_file FILE, or the "
                        "token file beside the daemon's --store_file; docs/security.md)");
  }
  std::string_view value(found->second.data(), found->second.size());
  const std::string_view scheme(kCallTokenScheme);
  if (value.substr(0, scheme.size()) != scheme ||
      !ConstantTimeEqual(value.substr(scheme.size()), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the call's job token is not this job's token");
  }
  return grpc::Status::OK;
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> CallTokenInterceptor(
    std::string token) {
  return std::make_unique<TokenInterceptorFactory>(std::move(token));
}

}  // namespace varipipe
