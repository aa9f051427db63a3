// The standard gRPC health service of a server, asked without its generated
// stubs (the tests' servers register grpc.health.v1 by default).
#ifndef VARIPIPE_TESTS_TESTING_HEALTH_CHECK_H_
#define VARIPIPE_TESTS_TESTING_HEALTH_CHECK_H_

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace varipipe::testing {

// grpc.health.v1.Health/Check for the whole server: the status's number
// (1 SERVING, 2 NOT_SERVING), or -1 when the call failed (30 s deadline).
inline int HealthStatus(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice empty(std::string(""));
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) { done.set_value(s); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse: field 1 (status), varint.
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : -1;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_HEALTH_CHECK_H_
