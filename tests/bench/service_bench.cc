// The store and service path: GetPlan latency over loopback gRPC with 16
// concurrent clients (plans already published), and plans published per
// second by one daemon with one planning worker. A real redis-server is
// started for the run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/config/job_config.h"
#include "common/grpc/client_channel.h"
#include "common/redis/redis_server_process.h"
#include "grpcpp/grpcpp.h"
#include "planner/service/planner_daemon.h"
#include "varipipe/v1/service.grpc.pb.h"

namespace varipipe::service {
namespace {

constexpr uint64_t kIterations = 200;

struct World {
  std::unique_ptr<RedisServer> redis;
  std::unique_ptr<PlannerDaemon> daemon;
  double publish_seconds = 0;
};

v1::JobConfig MakeConfig(const RedisServer& redis, const std::string& password_file) {
  const std::string json =
      absl::StrCat(R"({"job_id": "bench", "model": {"kind": "GPT",
      "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 32000},
      "parallelism": {"pipeline": 4, "data": 2},
      "cluster": {"device_memory_limit_mib": 16384},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 16384,
               "max_sequence_length": 2048, "synthetic_num_samples": 100000},
      "planner": {"plan_ahead": 100000},
      "store": {"redis_address": ")",
                   redis.address(), R"(", "password_file": ")", password_file, R"("},
      "training": {"iterations": )",
                   kIterations, "}}");
  absl::StatusOr<v1::JobConfig> c = ParseJobConfigJson(json, "bench");
  ApplyJobConfigDefaults(*c);
  return *c;
}

World& GetWorld() {
  static World* world = [] {
    auto* w = new World;
    w->redis = *RedisServer::Start();
    const std::string password_file =
        (std::filesystem::temp_directory_path() / absl::StrCat("bench-pw-", getpid())).string();
    std::ofstream(password_file) << w->redis->password();
    DaemonOptions options;
    options.worker_threads = 1;
    options.progress_interval = absl::ZeroDuration();
    const absl::Time start = absl::Now();
    w->daemon = *PlannerDaemon::Start(MakeConfig(*w->redis, password_file), options);
    w->daemon->WaitUntilAllPublished();
    w->publish_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::filesystem::remove(password_file);
    return w;
  }();
  return *world;
}

void BM_PublishRate(benchmark::State& state) {
  World& w = GetWorld();
  for (auto _ : state) benchmark::DoNotOptimize(w.publish_seconds);
  state.counters["plans_per_second"] = kIterations / w.publish_seconds;
  state.counters["ranks"] = 8;
}
BENCHMARK(BM_PublishRate)->Iterations(1);

// 16 client threads each fetch plans of random published iterations; the
// latency distribution is reported as p50/p99 counters.
void BM_GetPlan16Clients(benchmark::State& state) {
  World& w = GetWorld();
  const std::string address = absl::StrCat("127.0.0.1:", w.daemon->port());
  std::vector<double> latencies;
  std::mutex mu;
  for (auto _ : state) {
    std::vector<std::thread> clients;
    for (int c = 0; c < 16; ++c) {
      clients.emplace_back([&, c] {
        grpc::ChannelArguments args;
        args.SetInt("grpc.channel_id", c);  // one connection per client
        auto stub = v1::PlanService::NewStub(
            *CreateClientChannel(address, {.token = w.daemon->token()}, args));
        std::vector<double> mine;
        for (int k = 0; k < 50; ++k) {
          v1::GetPlanRequest request;
          request.set_iteration((c * 50 + k) % kIterations);
          request.set_rank(k % 8);
          v1::PlanEnvelope envelope;
          grpc::ClientContext context;
          const auto start = std::chrono::steady_clock::now();
          if (!stub->GetPlan(&context, request, &envelope).ok()) continue;
          mine.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
        }
        std::lock_guard<std::mutex> lock(mu);
        latencies.insert(latencies.end(), mine.begin(), mine.end());
      });
    }
    for (auto& t : clients) t.join();
  }
  std::sort(latencies.begin(), latencies.end());
  if (!latencies.empty()) {
    state.counters["p50_ms"] = latencies[latencies.size() / 2];
    state.counters["p99_ms"] = latencies[latencies.size() * 99 / 100];
    state.counters["requests"] = static_cast<double>(latencies.size());
  }
}
BENCHMARK(BM_GetPlan16Clients)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace varipipe::service

BENCHMARK_MAIN();
