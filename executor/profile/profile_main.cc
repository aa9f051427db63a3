// varipipe-profile: measures the executor's own model components on the
// device it runs on and writes the planner's cost-model JSON
// (docs/cost-model.md, "Profiling"). Grid points go to OUT.partial as they are
// measured, so a killed run continues where it stopped.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/cost_model_format.h"
#include "common/monotone_grid.h"
#include "common/redis/redis_client.h"
#include "common/redis/redis_server_process.h"
#include "common/secret_file.h"
#include "common/shutdown_signal.h"
#include "common/status.h"
#include "executor/comm/transport_factory.h"
#include "executor/model/model_spec.h"
#include "executor/profile/component_profile.h"
#include "executor/profile/update_profile.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/device.h"
#include "executor/runtime/launch_env.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"
#include "varipipe/v1/cost_model.pb.h"

ABSL_FLAG(std::string, config, "", "Job config (JSON, varipipe.v1.JobConfig). Required.");
ABSL_FLAG(std::string, out, "", "Cost-model JSON to write (varipipe.v1.CostModelFile). Required.");
ABSL_FLAG(bool, quick, false,
          "A small grid (lengths from 16, three measured passes per point): for tests and the "
          "quickstart.");
ABSL_FLAG(int32_t, repeats, 5, "Measured passes per grid point (times are their median).");
ABSL_FLAG(int32_t, warmup, 1, "Passes before measuring each grid point.");
ABSL_FLAG(std::string, device, "auto", "cpu, cuda:N, or auto (cuda:0 when LibTorch sees a GPU).");
ABSL_FLAG(std::string, store_file, "",
          "Launched on several ranks: the Redis they meet through, as a planner daemon's "
          "--store_file ('host:port password'). Default: rank 0 starts a private redis-server on "
          "loopback (one machine) and tells the others through OUT.rendezvous.");
ABSL_FLAG(int64_t, transfer_max_bytes, 0,
          "Largest message of the transfer measurements (default: 4 MiB with --quick, else 64 "
          "MiB).");
ABSL_FLAG(int32_t, threads, 1,
          "LibTorch intra-op threads on the CPU (an executor rank uses LibTorch's default; "
          "profile with what each rank gets: cores / ranks per machine).");

namespace varipipe {
namespace {

constexpr char kUsage[] =
    "Measures the executor's model components (the GPT or T5 layers, embedding and LM head of\n"
    "executor/model) on this machine's device over a grid of micro-batch sizes and lengths,\n"
    "for every recompute mode of the job, and writes the planner's cost-model JSON.\n"
    "\n"
    "Usage:\n"
    "  varipipe-profile --config job.json --out cost-model.json [--quick]\n"
    "\n"
    "Then plan with it: planner.cost_model_path in the config, or\n"
    "  varipipe-plan --config job.json --cost-model cost-model.json\n"
    "A killed run continues from OUT.partial when started again with the same arguments.\n"
    "\n"
    "Launched like executors on several ranks, it first measures point-to-point messages\n"
    "(ranks 0 and 1) and the all-reduce (every rank) over the executor's transport, then\n"
    "rank 0 profiles the components:\n"
    "  torchrun --standalone --nproc_per_node 2 --no_python \\\n"
    "    varipipe-profile --config job.json --out cost-model.json\n"
    "On one rank the file keeps the transfer costs of an earlier run's OUT.\n"
    "With parallelism.tensor t > 1 launch at least t ranks: ranks 0 .. t-1 then measure\n"
    "the components together, each its part of the tensor-parallel layers, and rank 0\n"
    "writes the grids at that degree.\n";

constexpr double kInf = std::numeric_limits<double>::infinity();

// The grid of one component: axes and which points are worth measuring.
struct Grid {
  v1::CostComponent component = v1::ENCODER_LAYER;
  std::vector<uint32_t> b, e, s;  // e: DECODER_LAYER only (else {0})
};

// Powers of two from `first` below `max`, then `max`.
std::vector<uint32_t> Lengths(uint32_t first, uint32_t max) {
  std::vector<uint32_t> out;
  for (uint32_t l = first; l < max; l *= 2) out.push_back(l);
  out.push_back(max);
  return out;
}

// A micro-batch never pads more than this many tokens (b x length): twice a
// replica's tokens. Points beyond are not measured (infeasible in the file).
uint64_t TokenCap(const v1::JobConfig& c) {
  return 2 * c.data().tokens_per_global_batch() / std::max(1u, c.parallelism().data());
}

std::vector<Grid> Grids(const v1::JobConfig& c, bool quick) {
  const bool t5 = c.model().kind() == v1::T5;
  const uint32_t first = quick ? 16 : 8;
  const uint32_t input_max = c.data().max_sequence_length();
  const uint32_t target_max = t5 ? c.data().max_target_length() : input_max;
  std::vector<uint32_t> sizes;
  for (uint64_t b = 1; b * first <= TokenCap(c); b *= 2) sizes.push_back(static_cast<uint32_t>(b));
  std::vector<Grid> grids;
  grids.push_back({v1::ENCODER_LAYER, sizes, {0}, Lengths(first, input_max)});
  if (t5) {
    grids.push_back(
        {v1::DECODER_LAYER, sizes, Lengths(first, input_max), Lengths(first, target_max)});
  }
  grids.push_back({v1::EMBEDDING, sizes, {0}, Lengths(first, input_max)});
  grids.push_back({v1::POSTPROCESS, sizes, {0}, Lengths(first, target_max)});
  // The attention core alone, for packed rows priced per sample
  // (model.packed_attention PER_SAMPLE): one sample per row and whole rows.
  grids.push_back(
      {v1::ATTENTION_CORE, sizes, {0}, Lengths(first, std::max(input_max, target_max))});
  return grids;
}

// Embedding and LM head do not depend on the recompute mode: measured once.
bool DependsOnRecompute(v1::CostComponent c) {
  return c == v1::ENCODER_LAYER || c == v1::DECODER_LAYER;
}

using PointKey = std::tuple<int, int, uint32_t, uint32_t, uint32_t>;  // comp, mode, b, e, s

// OUT.partial: a header naming what is profiled, then one line per point.
class PartialFile {
 public:
  PartialFile(std::string path, std::string header) : path_(path), header_(header) {}

  // Points of an earlier run with the same header; a file of another run is
  // replaced.
  std::map<PointKey, executor::PointCosts> Load() {
    std::map<PointKey, executor::PointCosts> points;
    std::ifstream in(path_);
    std::string line;
    if (!std::getline(in, line) || line != header_) return points;
    while (std::getline(in, line)) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      int comp = 0, mode = 0;
      uint32_t b = 0, e = 0, s = 0;
      executor::PointCosts c;
      if (f.size() != 9 || !absl::SimpleAtoi(f[0], &comp) || !absl::SimpleAtoi(f[1], &mode) ||
          !absl::SimpleAtoi(f[2], &b) || !absl::SimpleAtoi(f[3], &e) ||
          !absl::SimpleAtoi(f[4], &s) || !absl::SimpleAtod(f[5], &c.forward_ms) ||
          !absl::SimpleAtod(f[6], &c.backward_ms) || !absl::SimpleAtod(f[7], &c.stored_mib) ||
          !absl::SimpleAtod(f[8], &c.peak_mib)) {
        break;  // a line cut by a kill: measure it again
      }
      points[{comp, mode, b, e, s}] = c;
    }
    return points;
  }

  // Rewrites the file with `points` (dropping a cut last line), then appends.
  bool Open(const std::map<PointKey, executor::PointCosts>& points) {
    out_.open(path_, std::ios::trunc);
    out_ << header_ << "\n";
    for (const auto& [key, c] : points) Append(key, c);
    return out_.good();
  }

  void Append(const PointKey& k, const executor::PointCosts& c) {
    out_ << absl::StrFormat("%d %d %u %u %u %.17g %.17g %.17g %.17g\n", std::get<0>(k),
                            std::get<1>(k), std::get<2>(k), std::get<3>(k), std::get<4>(k),
                            c.forward_ms, c.backward_ms, c.stored_mib, c.peak_mib);
    out_.flush();
  }

  void Remove() {
    out_.close();
    std::filesystem::remove(path_);
  }

 private:
  std::string path_;
  std::string header_;
  std::ofstream out_;
};

// A 20-character progress bar: "########------------".
std::string Bar(double fraction) {
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * 20);
  return std::string(filled, '#') + std::string(20 - filled, '-');
}

std::string Duration(double seconds) {
  return seconds < 90
             ? absl::StrFormat("%.0fs", seconds)
             : absl::StrFormat("%.0fm%02.0fs", std::floor(seconds / 60), std::fmod(seconds, 60));
}

// Redis for the rendezvous: --store_file, else a private redis-server that
// rank 0 starts and announces in OUT.rendezvous ("host:port password id").
struct Rendezvous {
  std::unique_ptr<RedisServer> server;  // rank 0's private one
  RedisClient::Options redis;
  std::string announcement;  // the file rank 0 wrote
};

// Ranks 0 .. tensor - 1 under tensor parallelism: the transport of the
// transfer measurements stays open for the tensor group's collectives, and
// so does rank 0's private Redis, through which the group's Gloo context
// meets at its first collective.
struct TensorSession {
  Rendezvous rendezvous;
  std::unique_ptr<executor::Transport> transport;
  std::unique_ptr<executor::TensorGroup> group;
};

absl::StatusOr<Rendezvous> MeetThroughRedis(const executor::LaunchEnv& env,
                                            const std::string& out_path,
                                            const ShutdownSignal& shutdown) {
  Rendezvous r;
  std::string address, password;
  if (const std::string file = absl::GetFlag(FLAGS_store_file); !file.empty()) {
    std::ifstream in(file);
    if (!(in >> address >> password)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, " (--store_file): expected 'host:port password'"));
    }
  } else if (env.rank == 0) {
    VP_ASSIGN_OR_RETURN(r.server, RedisServer::Start());
    address = r.server->address();
    password = r.server->password();
    r.announcement = out_path + ".rendezvous";
    VP_RETURN_IF_ERROR(WriteSecretFile(
        r.announcement, absl::StrCat(address, " ", password, " ", executor::LaunchId(), "\n")));
  } else {
    // Wait for rank 0's announcement of this launch (an older one is stale).
    const std::string file = out_path + ".rendezvous";
    const absl::Time deadline = absl::Now() + absl::Minutes(5);
    for (;;) {
      std::ifstream in(file);
      std::string id;
      if (in >> address >> password >> id && id == executor::LaunchId()) break;
      if (shutdown.Requested()) return absl::CancelledError("stopped by a signal");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank 0 did not announce its Redis in ", file,
            " within 5 minutes (ranks must share OUT's folder, or pass --store_file)"));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  VP_ASSIGN_OR_RETURN(const auto host_port, ParseHostPort(address));
  r.redis.host = host_port.first;
  r.redis.port = host_port.second;
  r.redis.password = password;
  return r;
}

// Every rank: transfers over the executor's transport. Rank 0 returns the
// costs; the others return nothing. Ranks of the first tensor group (tensor
// > 1) keep the transport in `*session`.
absl::StatusOr<std::optional<v1::CommunicationCosts>> MeasureTransfers(
    const executor::LaunchEnv& env, const v1::JobConfig& config, torch::Device device,
    const std::string& out_path, bool quick, const ShutdownSignal& shutdown,
    TensorSession* session) {
  const int tensor = static_cast<int>(std::max(1u, config.parallelism().tensor()));
  const bool in_group = tensor > 1 && env.rank < tensor;
  VP_ASSIGN_OR_RETURN(Rendezvous rendezvous, MeetThroughRedis(env, out_path, shutdown));
  executor::TransportOptions options;
  options.redis = rendezvous.redis;
  options.prefix = absl::StrCat(config.store().key_prefix(), "/", config.job_id(), "/profile/",
                                executor::LaunchId());
  options.rank = env.rank;
  options.size = env.world_size;
  options.cuda_device = device.is_cuda() ? device.index() : -1;
  for (int r = 0; r < env.world_size; ++r) {
    if (r != env.rank) options.peers.push_back(r);
    options.data_parallel_group.push_back(r);
  }
  for (int r = 0; in_group && r < tensor; ++r) options.tensor_group.push_back(r);
  options.connect_timeout = absl::Minutes(5);
  spdlog::info("rank {} of {}: meeting the other ranks through Redis {}:{}", env.rank,
               env.world_size, options.redis.host, options.redis.port);
  VP_ASSIGN_OR_RETURN(std::unique_ptr<executor::Transport> transport,
                      executor::CreateTransport(options));
  int64_t max_bytes = absl::GetFlag(FLAGS_transfer_max_bytes);
  if (max_bytes <= 0) max_bytes = quick ? (4 << 20) : (64 << 20);
  spdlog::info("measuring transfers over {} (messages up to {} bytes)", transport->Describe(),
               max_bytes);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CommunicationCosts> costs = executor::MeasureCommunication(
      *transport, device, static_cast<size_t>(max_bytes), quick ? 5 : 11);
  if (!rendezvous.announcement.empty()) std::filesystem::remove(rendezvous.announcement);
  if (in_group && costs.ok()) {
    session->group = std::make_unique<executor::TensorGroup>(
        env.rank, tensor, config.parallelism().sequence_parallel());
    session->group->set_transport(transport.get());
    session->transport = std::move(transport);
    session->rendezvous = std::move(rendezvous);
  }
  transport.reset();  // before rank 0 stops the server the others talk to
  if (!costs.ok()) return costs.status();
  spdlog::info(
      "transfers measured in {:.1f} s: point-to-point {:.1f} us + n / {:.3f} GB/s; all-reduce "
      "over {} ranks {:.1f} us + n / {:.3f} GB/s; per ring step of a shard, all-gather "
      "{:.1f} us + n / {:.3f} GB/s, reduce-scatter {:.1f} us + n / {:.3f} GB/s",
      absl::ToDoubleSeconds(absl::Now() - start), costs->p2p_latency_us(),
      costs->p2p_bandwidth_gbps(), costs->all_reduce_ranks(), costs->all_reduce_latency_us(),
      costs->all_reduce_bandwidth_gbps(), costs->all_gather_step_latency_us(),
      costs->all_gather_step_bandwidth_gbps(), costs->reduce_scatter_step_latency_us(),
      costs->reduce_scatter_step_bandwidth_gbps());
  if (env.rank != 0) return std::nullopt;
  return *costs;
}

// The communication costs of an earlier run's OUT, if any.
std::optional<v1::CommunicationCosts> EarlierCommunication(const std::string& out_path) {
  std::ifstream in(out_path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  v1::CostModelFile earlier;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &earlier, options).ok() ||
      !earlier.has_communication()) {
    return std::nullopt;
  }
  return earlier.communication();
}

// The measurement settings from the flags and the config; `device` receives
// the device's name. An error is a usage error.
absl::StatusOr<executor::ProfileSettings> SettingsFromFlags(const v1::JobConfig& config,
                                                            const executor::LaunchEnv& env,
                                                            std::string* device) {
  const bool quick = absl::GetFlag(FLAGS_quick);
  executor::ProfileSettings settings;
  settings.warmup = absl::GetFlag(FLAGS_warmup);
  settings.repeats =
      quick ? std::min(3, absl::GetFlag(FLAGS_repeats)) : absl::GetFlag(FLAGS_repeats);
  *device = absl::GetFlag(FLAGS_device);
  if (*device == "auto") {
    *device = torch::cuda::is_available() ? absl::StrCat("cuda:", env.local_rank) : "cpu";
  }
  try {
    settings.device = torch::Device(*device);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", *device, "' is not a device (cpu, cuda:N)"));
  }
  if (settings.device.is_cuda()) {
    const v1::DType dtype = config.model().dtype();
    if (dtype == v1::BFLOAT16) settings.cuda_autocast_dtype = torch::kBFloat16;
    if (dtype == v1::FLOAT16) settings.cuda_autocast_dtype = torch::kHalf;
  } else {
    executor::InstallCountingCpuAllocator();
    torch::set_num_threads(std::max(1, absl::GetFlag(FLAGS_threads)));
  }
  return settings;
}

// Every grid point to measure, in order: a component's points one after
// another (its parameters are built once).
std::vector<PointKey> PointsToMeasure(const std::vector<Grid>& grids,
                                      const std::vector<v1::RecomputeMode>& modes, uint64_t cap) {
  std::vector<PointKey> todo;
  for (const Grid& g : grids) {
    const std::vector<v1::RecomputeMode> measured =
        DependsOnRecompute(g.component) ? modes
                                        : std::vector<v1::RecomputeMode>{v1::RECOMPUTE_NONE};
    for (v1::RecomputeMode mode : measured) {
      for (uint32_t b : g.b) {
        for (uint32_t e : g.e) {
          for (uint32_t s : g.s) {
            if (uint64_t{b} * std::max(e, s) > cap) continue;
            todo.emplace_back(g.component, mode, b, e, s);
          }
        }
      }
    }
  }
  return todo;
}

// Measures the points of `todo` not in `done` into it (and the partial
// file), logging progress every 5 s. CANCELLED on a signal.
absl::Status MeasureAll(const std::vector<PointKey>& todo, const executor::ModelSpec& spec,
                        const executor::ProfileSettings& settings, const ShutdownSignal& shutdown,
                        PartialFile* partial, std::map<PointKey, executor::PointCosts>& done) {
  executor::ComponentCache parameters;
  const absl::Time start = absl::Now();
  size_t measured_now = 0;
  absl::Time last_report = start;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (shutdown.Requested()) {
      return absl::CancelledError(absl::StrCat("stopped by a signal after ", done.size(), " of ",
                                               todo.size(), " points; run again to continue"));
    }
    const PointKey& key = todo[i];
    if (done.count(key) > 0) continue;
    executor::ProfilePoint point;
    point.component = static_cast<v1::CostComponent>(std::get<0>(key));
    point.recompute = static_cast<v1::RecomputeMode>(std::get<1>(key));
    point.micro_batch = std::get<2>(key);
    point.encoder_len = std::get<3>(key);
    point.seq_len = std::get<4>(key);
    absl::StatusOr<executor::PointCosts> costs =
        executor::MeasurePoint(spec, point, settings, &parameters);
    if (absl::IsResourceExhausted(costs.status())) {
      spdlog::warn("{}: infeasible", std::string(costs.status().message()));
      costs = executor::PointCosts{kInf, kInf, kInf, kInf};
    } else if (!costs.ok()) {
      return costs.status();
    }
    done[key] = *costs;
    if (partial != nullptr) partial->Append(key, *costs);
    ++measured_now;
    const absl::Time now = absl::Now();
    if (now - last_report > absl::Seconds(5) || i + 1 == todo.size()) {
      last_report = now;
      const double elapsed = absl::ToDoubleSeconds(now - start);
      const size_t left = todo.size() - done.size();
      spdlog::info("[{}] {}/{} {:.0f}% {} {} b={} s={}: {} elapsed, about {} left",
                   Bar(static_cast<double>(done.size()) / todo.size()), done.size(), todo.size(),
                   100.0 * done.size() / todo.size(), v1::CostComponent_Name(point.component),
                   v1::RecomputeMode_Name(point.recompute), point.micro_batch, point.seq_len,
                   Duration(elapsed), Duration(elapsed / measured_now * left));
    }
  }
  return absl::OkStatus();
}

// One grid per component and recompute mode; `repaired` counts the values
// raised to keep them monotone (the planner's documented rule).
void AddGrids(const std::vector<Grid>& grids, const std::vector<v1::RecomputeMode>& modes,
              const std::map<PointKey, executor::PointCosts>& done, const executor::ModelSpec& spec,
              v1::CostModelFile& file, int& repaired) {
  for (const Grid& g : grids) {
    // The attention core is tabulated without recomputation; the planner
    // derives the other modes (cost_model.h).
    const std::vector<v1::RecomputeMode> written =
        g.component == v1::ATTENTION_CORE ? std::vector<v1::RecomputeMode>{v1::RECOMPUTE_NONE}
                                          : modes;
    for (v1::RecomputeMode mode : written) {
      const int measured_mode = DependsOnRecompute(g.component) ? mode : v1::RECOMPUTE_NONE;
      v1::CostGrid* out = file.add_grids();
      out->set_component(g.component);
      out->set_recompute(mode);
      out->set_tensor_parallel(static_cast<uint32_t>(spec.tensor_parallel));
      for (uint32_t b : g.b) out->add_micro_batch_sizes(b);
      for (uint32_t s : g.s) out->add_seq_lens(s);
      if (g.component == v1::DECODER_LAYER) {
        for (uint32_t e : g.e) out->add_encoder_seq_lens(e);
      }
      std::vector<double> fw, bw, stored, peak;
      for (uint32_t b : g.b) {
        for (uint32_t e : g.e) {
          for (uint32_t s : g.s) {
            const auto it = done.find({g.component, measured_mode, b, e, s});
            const executor::PointCosts c =
                it == done.end() ? executor::PointCosts{kInf, kInf, kInf, kInf} : it->second;
            fw.push_back(c.forward_ms);
            bw.push_back(c.backward_ms);
            stored.push_back(c.stored_mib);
            peak.push_back(c.peak_mib);
          }
        }
      }
      for (std::vector<double>* v : {&fw, &bw, &stored, &peak}) {
        repaired += RaiseToRunningMaxima(
            g.b, g.component == v1::DECODER_LAYER ? g.e : std::vector<uint32_t>{}, g.s, *v);
      }
      for (size_t k = 0; k < fw.size(); ++k) {
        out->add_forward_ms(fw[k]);
        out->add_backward_ms(bw[k]);
        out->add_stored_activation_mib(stored[k]);
        out->add_peak_activation_mib(std::max(peak[k], stored[k]));
      }
    }
    if (g.component == v1::ATTENTION_CORE) continue;  // part of a layer
    v1::ComponentParameters* p = file.add_parameters();
    p->set_component(g.component);
    p->set_parameters(executor::ComponentParameters(spec, g.component));
  }
}

// The file as JSON, written to a temporary file and renamed.
absl::Status WriteCostModel(const v1::CostModelFile& file, const std::string& out_path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(file, &json, options).ok()) {
    return absl::InternalError("cannot render the cost model as JSON");
  }
  const std::string temporary = out_path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << json;
    if (!out.good()) return absl::UnavailableError(absl::StrCat("cannot write ", temporary));
  }
  std::filesystem::rename(temporary, out_path);
  return absl::OkStatus();
}

// Transfer costs: measured over the ranks (then only rank 0 goes on, or
// under tensor parallelism the ranks of the first tensor group, in
// `*session`: `*rank_done`), or kept from an earlier run's file on one rank.
absl::StatusOr<std::optional<v1::CommunicationCosts>> Communication(
    const executor::LaunchEnv& env, const v1::JobConfig& config, torch::Device device,
    const std::string& out_path, bool quick, const ShutdownSignal& shutdown, bool* rank_done,
    TensorSession* session) {
  *rank_done = false;
  if (env.world_size > 1) {
    absl::StatusOr<std::optional<v1::CommunicationCosts>> measured =
        MeasureTransfers(env, config, device, out_path, quick, shutdown, session);
    if (!measured.ok()) return Annotate(measured.status(), "measuring transfers");
    *rank_done = env.rank != 0 && session->group == nullptr;
    return measured;
  }
  std::optional<v1::CommunicationCosts> earlier = EarlierCommunication(out_path);
  if (earlier.has_value()) {
    spdlog::info("keeping the transfer costs of {} ({})", out_path, earlier->transport());
  } else {
    spdlog::info("one rank: no transfer costs measured (launch on two or more ranks for them)");
  }
  return earlier;
}

// What a profile is of: the job, its model, this rank and the measurement
// settings.
struct ProfileInputs {
  v1::JobConfig config;
  executor::ModelSpec spec;
  executor::LaunchEnv env;
  executor::ProfileSettings settings;
  std::string device;  // described for the file's header
};

absl::StatusOr<ProfileInputs> ReadInputs(const std::string& config_path) {
  ProfileInputs inputs;
  VP_ASSIGN_OR_RETURN(inputs.config, LoadJobConfigFile(config_path));
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(inputs.config);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", spec.status().message()));
  }
  inputs.spec = *std::move(spec);
  VP_ASSIGN_OR_RETURN(inputs.env, executor::ReadLaunchEnv());
  if (inputs.spec.tensor_parallel > inputs.env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": parallelism.tensor is ", inputs.spec.tensor_parallel,
        ": launch varipipe-profile on at least that many ranks (got ", inputs.env.world_size,
        "); each tensor rank measures its part of every component, rank 0 writes the file"));
  }
  VP_ASSIGN_OR_RETURN(inputs.settings,
                      SettingsFromFlags(inputs.config, inputs.env, &inputs.device));
  return inputs;
}

// Measures every grid point not yet in OUT.partial (resuming it), then
// writes the cost model file with the transfer and optimizer costs.
// Under tensor parallelism every rank of the group measures the points rank 0
// has not measured yet (in its partial file), in the same order: rank 0's
// list of done points is summed over the group (on `device`: an NCCL
// transport takes device memory). Throws c10::Error when the collective fails.
void ShareDonePoints(const executor::TensorGroup& group, torch::Device device,
                     const std::vector<PointKey>& todo,
                     std::map<PointKey, executor::PointCosts>& done) {
  std::vector<float> mask(todo.size(), 0.0f);
  for (size_t i = 0; i < todo.size(); ++i) mask[i] = done.count(todo[i]) > 0 ? 1.0f : 0.0f;
  if (group.index() != 0) std::fill(mask.begin(), mask.end(), 0.0f);
  const torch::Tensor summed =
      group
          .AllReduceSum(torch::from_blob(mask.data(), {static_cast<int64_t>(mask.size())},
                                         torch::dtype(torch::kFloat32))
                            .to(device))
          .cpu()
          .contiguous();
  const float* marks = summed.data_ptr<float>();
  for (size_t i = 0; i < todo.size(); ++i) {
    if (marks[i] > 0) done.emplace(todo[i], executor::PointCosts{});
  }
}

// The points measured already: rank 0's partial file (opened for appending
// in `*partial`), shared with the rest of its tensor group, if any.
absl::Status LoadDonePoints(const ProfileInputs& inputs, const std::string& out_path,
                            const std::string& header, const std::vector<PointKey>& todo,
                            std::optional<PartialFile>& partial,
                            std::map<PointKey, executor::PointCosts>& done) {
  const executor::TensorGroup* group = inputs.settings.tensor;
  if (group == nullptr || group->index() == 0) {
    partial.emplace(out_path + ".partial", header);
    done = partial->Load();
    if (!partial->Open(done)) {
      return absl::UnavailableError(absl::StrCat("cannot write ", out_path, ".partial"));
    }
  }
  if (group == nullptr) return absl::OkStatus();
  try {
    ShareDonePoints(*group, inputs.settings.device, todo, done);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("sharing the measured points over the tensor group: ", e.what()));
  }
  spdlog::info("tensor rank {} of {}{}: measuring this rank's part of every component",
               group->index(), group->size(),
               group->sequence_parallel() ? " (sequence parallel)" : "");
  return absl::OkStatus();
}

int ProfileGrids(const ProfileInputs& inputs,
                 const std::optional<v1::CommunicationCosts>& communication,
                 const v1::OptimizerCosts& optimizer, const ShutdownSignal& shutdown) {
  const executor::TensorGroup* group = inputs.settings.tensor;
  // Rank 0 writes the partial file and the cost model.
  const bool writer = group == nullptr || group->index() == 0;
  const std::string out_path = absl::GetFlag(FLAGS_out);
  const v1::JobConfig& config = inputs.config;
  const bool quick = absl::GetFlag(FLAGS_quick);
  std::vector<v1::RecomputeMode> modes;
  for (int m : config.planner().recompute_modes()) {
    modes.push_back(static_cast<v1::RecomputeMode>(m));
  }
  if (modes.empty()) modes = {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL};
  const std::vector<Grid> grids = Grids(config, quick);
  const std::vector<PointKey> todo = PointsToMeasure(grids, modes, TokenCap(config));
  const std::string header =
      absl::StrCat("# varipipe-profile v", kCostModelFormatVersion, " ", inputs.device,
                   " threads=", absl::GetFlag(FLAGS_threads), " repeats=", inputs.settings.repeats,
                   " quick=", quick, " tensor=", inputs.spec.tensor_parallel,
                   inputs.spec.sequence_parallel ? " sequence_parallel" : "",
                   " model=", config.model().ShortDebugString(), " points=", todo.size());
  std::optional<PartialFile> partial;
  std::map<PointKey, executor::PointCosts> done;
  if (absl::Status s = LoadDonePoints(inputs, out_path, header, todo, partial, done); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return kExitFailure;
  }
  spdlog::info("profiling {} grid points on {} ({} already measured in {}.partial)", todo.size(),
               inputs.device, done.size(), out_path);
  const absl::Time start = absl::Now();
  if (absl::Status s = MeasureAll(todo, inputs.spec, inputs.settings, shutdown,
                                  partial.has_value() ? &*partial : nullptr, done);
      !s.ok()) {
    if (absl::IsCancelled(s)) {
      spdlog::warn("{}", std::string(s.message()));
    } else {
      spdlog::error("{}", std::string(s.message()));
    }
    return kExitFailure;
  }
  if (!writer) {
    spdlog::info("tensor rank {}: measured every point with rank 0, which writes {}",
                 group->index(), out_path);
    return kExitOk;
  }
  v1::CostModelFile file;
  file.set_format_version(kCostModelFormatVersion);
  file.set_description(absl::StrCat(
      "varipipe-profile on ", inputs.device, " (LibTorch ", executor::TorchVersion(), ", ",
      absl::GetFlag(FLAGS_threads), " threads), ",
      absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone()), quick ? ", quick grid" : "",
      inputs.spec.tensor_parallel > 1
          ? absl::StrCat(", tensor-parallel degree ", inputs.spec.tensor_parallel,
                         inputs.spec.sequence_parallel ? " with sequence parallelism" : "")
          : ""));
  *file.mutable_model() = config.model();
  if (communication.has_value()) *file.mutable_communication() = *communication;
  *file.mutable_optimizer() = optimizer;
  int repaired = 0;
  AddGrids(grids, modes, done, inputs.spec, file, repaired);
  if (absl::Status s = WriteCostModel(file, out_path); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return kExitFailure;
  }
  partial->Remove();
  spdlog::info(
      "wrote {}: {} grid points measured in {} ({} values raised to keep the grid "
      "monotone)",
      out_path, todo.size(), Duration(absl::ToDoubleSeconds(absl::Now() - start)), repaired);
  return kExitOk;
}

int Run(const ShutdownSignal& shutdown) {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (config_path.empty() || out_path.empty()) {
    std::fprintf(stderr, "varipipe-profile: --config and --out are required (try --help)\n");
    return kExitUsage;
  }
  absl::StatusOr<ProfileInputs> inputs = ReadInputs(config_path);
  if (!inputs.ok()) {
    std::fprintf(stderr, "varipipe-profile: %s\n", std::string(inputs.status().message()).c_str());
    return kExitUsage;
  }
  // Several ranks: transfers first, then rank 0 alone profiles the rest (the
  // first tensor group's ranks together under tensor parallelism).
  bool rank_done = false;
  TensorSession session;
  absl::StatusOr<std::optional<v1::CommunicationCosts>> communication =
      Communication(inputs->env, inputs->config, inputs->settings.device, out_path,
                    absl::GetFlag(FLAGS_quick), shutdown, &rank_done, &session);
  if (!communication.ok()) {
    spdlog::error("{}", std::string(communication.status().message()));
    return kExitFailure;
  }
  if (rank_done) return kExitOk;
  inputs->settings.tensor = session.group.get();
  absl::StatusOr<v1::OptimizerCosts> optimizer = executor::MeasureOptimizer(
      inputs->spec, inputs->config, inputs->settings.device, inputs->settings.repeats);
  if (!optimizer.ok()) {
    spdlog::error("{}", std::string(optimizer.status().message()));
    return kExitFailure;
  }
  spdlog::info("optimizer step ({}): {:.3f} ms + {:.3f} ms per million parameters",
               optimizer->optimizer(), optimizer->fixed_ms(),
               optimizer->ms_per_million_parameters());
  return ProfileGrids(*inputs, *communication, *optimizer, shutdown);
}

}  // namespace
}  // namespace varipipe

int main(int argc, char** argv) {
  varipipe::ShutdownSignal shutdown;
  const std::vector<std::string> args =
      varipipe::InitBinary(argc, argv, "varipipe-profile", varipipe::kUsage);
  if (!args.empty()) {
    std::fprintf(stderr, "varipipe-profile: unexpected argument '%s' (try --help)\n",
                 args.front().c_str());
    return varipipe::kExitUsage;
  }
  return varipipe::Run(shutdown);
}
