// DeviceStagingTransport: the host transport never sees the caller's
// buffers, a send copies at its start, a receive lands in the caller's
// buffer only when waited, and collectives come back. On the CPU (the
// copies are memcpys; the GPU machine runs the same code on cuda, through
// the equivalence cells whose ranks share one GPU), against a recording
// host transport and against real Gloo ranks over loopback.
#include "executor/comm/device_staging_transport.h"

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/comm/gloo/gloo_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace varipipe::executor {
namespace {

using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

// A host transport that records what it is given. A receive's data arrives
// (`incoming` is written to the buffer it was given) when it is waited; a
// collective doubles every value it is given.
class RecordingTransport final : public Transport {
 public:
  struct Call {
    std::string what;
    const void* data;
    std::vector<char> bytes;  // the buffer's contents when the call was made
  };

  class RecordedTransfer final : public Transfer {
   public:
    RecordedTransfer(RecordingTransport* owner, void* receive_into, size_t bytes)
        : owner_(owner), receive_into_(receive_into), bytes_(bytes) {}
    absl::Status Wait(absl::Time) override {
      if (!owner_->wait_status.ok()) return owner_->wait_status;
      if (receive_into_ != nullptr) {
        std::memcpy(receive_into_, owner_->incoming.data(),
                    std::min(bytes_, owner_->incoming.size()));
      }
      return absl::OkStatus();
    }

   private:
    RecordingTransport* owner_;
    void* receive_into_;
    size_t bytes_;
  };

  int rank() const override { return 3; }
  int size() const override { return 4; }
  absl::StatusOr<std::unique_ptr<Transfer>> StartSend(int peer, void* data, size_t bytes) override {
    Record(absl::StrCat("send ", peer), data, bytes);
    if (!start_status.ok()) return start_status;
    return std::unique_ptr<Transfer>(std::make_unique<RecordedTransfer>(this, nullptr, bytes));
  }
  absl::StatusOr<std::unique_ptr<Transfer>> StartRecv(int peer, void* data, size_t bytes) override {
    Record(absl::StrCat("recv ", peer), data, bytes);
    if (!start_status.ok()) return start_status;
    return std::unique_ptr<Transfer>(std::make_unique<RecordedTransfer>(this, data, bytes));
  }
  absl::Status AllReduceMean(std::span<float> data, const std::vector<int>&) override {
    return Collective("all-reduce", data);
  }
  absl::Status AllReduceSum(std::span<float> data, const std::vector<int>&) override {
    return Collective("all-reduce-sum", data);
  }
  absl::Status ReduceScatterSum(std::span<float> data, const std::vector<int>&) override {
    return Collective("reduce-scatter", data);
  }
  absl::Status AllGather(std::span<float> data, const std::vector<int>&) override {
    return Collective("all-gather", data);
  }
  std::string Describe() const override { return "recording"; }
  void Abort(const std::string& reason) override { aborted = reason; }

  std::vector<Call> calls;
  std::vector<char> incoming;
  absl::Status start_status = absl::OkStatus();
  absl::Status wait_status = absl::OkStatus();
  std::string aborted;

 private:
  void Record(const std::string& what, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    calls.push_back({what, data, std::vector<char>(p, p + bytes)});
  }
  absl::Status Collective(const std::string& what, std::span<float> data) {
    Record(what, data.data(), data.size_bytes());
    for (float& x : data) x *= 2;
    return absl::OkStatus();
  }
};

class DeviceStagingTransportTest : public ::testing::Test {
 protected:
  DeviceStagingTransportTest() {
    auto host = std::make_unique<RecordingTransport>();
    host_ = host.get();
    staging_ = std::make_unique<DeviceStagingTransport>(std::move(host), torch::kCPU);
  }
  RecordingTransport* host_;
  std::unique_ptr<DeviceStagingTransport> staging_;
  const absl::Time deadline_ = absl::Now() + absl::Seconds(10);
};

TEST_F(DeviceStagingTransportTest, ASendCopiesTheBufferWhenItStarts) {
  std::vector<float> data = {1, 2, 3};
  absl::StatusOr<std::unique_ptr<Transfer>> t = staging_->StartSend(2, data.data(), 12);
  ASSERT_THAT(t, IsOk());
  ASSERT_EQ(host_->calls.size(), 1u);
  EXPECT_EQ(host_->calls[0].what, "send 2");
  EXPECT_NE(host_->calls[0].data, data.data());
  std::vector<float> sent(3);
  std::memcpy(sent.data(), host_->calls[0].bytes.data(), 12);
  EXPECT_EQ(sent, data);
  EXPECT_THAT((*t)->Wait(deadline_), IsOk());
  EXPECT_EQ(staging_->rank(), 3);
  EXPECT_EQ(staging_->size(), 4);
}

TEST_F(DeviceStagingTransportTest, AReceiveLandsInTheCallersBufferWhenWaited) {
  std::vector<float> arriving = {7, 8, 9, 10};
  host_->incoming.resize(16);
  std::memcpy(host_->incoming.data(), arriving.data(), 16);
  std::vector<float> data(4, -1);
  absl::StatusOr<std::unique_ptr<Transfer>> t = staging_->StartRecv(1, data.data(), 16);
  ASSERT_THAT(t, IsOk());
  ASSERT_EQ(host_->calls.size(), 1u);
  EXPECT_NE(host_->calls[0].data, data.data());
  EXPECT_EQ(data, std::vector<float>(4, -1)) << "written before the wait";
  ASSERT_THAT((*t)->Wait(deadline_), IsOk());
  EXPECT_EQ(data, arriving);
}

TEST_F(DeviceStagingTransportTest, AFailedReceiveLeavesTheBufferAlone) {
  host_->incoming.assign(8, 1);
  host_->wait_status = absl::UnavailableError("rank 1 is gone");
  std::vector<float> data(2, -1);
  absl::StatusOr<std::unique_ptr<Transfer>> t = staging_->StartRecv(1, data.data(), 8);
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT((*t)->Wait(deadline_), StatusIs(absl::StatusCode::kUnavailable, "rank 1 is gone"));
  EXPECT_EQ(data, std::vector<float>(2, -1));
}

TEST_F(DeviceStagingTransportTest, AFailedStartIsReturned) {
  host_->start_status = absl::CancelledError("stopped by SIGTERM");
  float x = 1;
  EXPECT_THAT(staging_->StartSend(0, &x, 4), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(staging_->StartRecv(0, &x, 4), StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(DeviceStagingTransportTest, CollectivesRunOnAHostCopyAndComeBack) {
  std::vector<float> data = {1, 2, 3, 4};
  ASSERT_THAT(staging_->AllReduceMean(data, {1, 3}), IsOk());
  EXPECT_EQ(data, (std::vector<float>{2, 4, 6, 8}));
  ASSERT_THAT(staging_->ReduceScatterSum(data, {1, 3}), IsOk());
  ASSERT_THAT(staging_->AllGather(data, {1, 3}), IsOk());
  EXPECT_EQ(data, (std::vector<float>{8, 16, 24, 32}));
  ASSERT_EQ(host_->calls.size(), 3u);
  for (const RecordingTransport::Call& call : host_->calls) {
    EXPECT_NE(call.data, data.data()) << call.what;
  }
  EXPECT_EQ(host_->calls[1].what, "reduce-scatter");
}

TEST_F(DeviceStagingTransportTest, DescribesBothAndForwardsAbort) {
  EXPECT_EQ(staging_->Describe(), "recording staging cpu");
  staging_->Abort("stopped by SIGTERM");
  EXPECT_EQ(host_->aborted, "stopped by SIGTERM");
}

// Real Gloo ranks (threads over loopback, rendezvous through a real
// redis-server) behind the staging layer: a pipeline exchange and the
// data-parallel mean.
TEST(DeviceStagingOverGloo, TwoRanksExchangeAndAverage) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_THAT(redis, IsOk());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooTransport::Options o;
      o.redis.host = (*redis)->host();
      o.redis.port = (*redis)->port();
      o.redis.password = (*redis)->password();
      o.prefix = "test/staging";
      o.rank = rank;
      o.size = 2;
      o.connect_timeout = absl::Seconds(20);
      absl::StatusOr<std::unique_ptr<GlooTransport>> gloo = GlooTransport::Create(o);
      ASSERT_THAT(gloo, IsOk()) << "rank " << rank;
      DeviceStagingTransport t(*std::move(gloo), torch::kCPU);
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      std::vector<float> mine(100, static_cast<float>(rank + 1)), theirs(100, 0);
      // The channel pairs each rank's k-th transfer with the peer's k-th.
      absl::StatusOr<std::unique_ptr<Transfer>> send, recv;
      if (rank == 0) {
        send = t.StartSend(1, mine.data(), 400);
        recv = t.StartRecv(1, theirs.data(), 400);
      } else {
        recv = t.StartRecv(0, theirs.data(), 400);
        send = t.StartSend(0, mine.data(), 400);
      }
      ASSERT_THAT(send, IsOk());
      ASSERT_THAT(recv, IsOk());
      EXPECT_THAT((*recv)->Wait(deadline), IsOk());
      EXPECT_THAT((*send)->Wait(deadline), IsOk());
      EXPECT_EQ(theirs, std::vector<float>(100, static_cast<float>(2 - rank)));
      ASSERT_THAT(t.AllReduceMean(mine, {0, 1}), IsOk());
      EXPECT_EQ(mine, std::vector<float>(100, 1.5f)) << "rank " << rank;
      EXPECT_THAT(t.Describe(), HasSubstr("staging cpu"));
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace varipipe::executor
