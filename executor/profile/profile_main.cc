// varipipe-profile: measures the executor's own model components on the
// device it runs on and writes the planner's cost-model JSON
// (docs/cost-model.md, "Profiling"). Grid points go to OUT.partial as they are
// measured, so a killed run continues where it stopped.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/binary_main.h"
#include "common/config/job_config.h"
#include "common/shutdown_signal.h"
#include "executor/model/model_spec.h"
#include "executor/profile/component_profile.h"
#include "executor/runtime/counting_allocator.h"
#include "executor/runtime/device.h"
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
    "A killed run continues from OUT.partial when started again with the same arguments.\n";

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

// The DP relies on time and memory never decreasing with size or length; a
// measured grid can dip by noise. Repair rule: each value becomes the largest
// value at any point with no larger size or length (running maxima along
// each axis). Returns how many values were raised.
int RepairMonotonicity(const Grid& g, std::vector<std::vector<double>*> values) {
  int repaired = 0;
  const size_t nb = g.b.size(), ne = g.e.size(), ns = g.s.size();
  const auto at = [&](size_t i, size_t j, size_t k) { return (i * ne + j) * ns + k; };
  for (std::vector<double>* v : values) {
    for (size_t i = 0; i < nb; ++i) {
      for (size_t j = 0; j < ne; ++j) {
        for (size_t k = 0; k < ns; ++k) {
          double floor = 0;
          if (i > 0) floor = std::max(floor, (*v)[at(i - 1, j, k)]);
          if (j > 0) floor = std::max(floor, (*v)[at(i, j - 1, k)]);
          if (k > 0) floor = std::max(floor, (*v)[at(i, j, k - 1)]);
          double& x = (*v)[at(i, j, k)];
          if (x != kInf && floor != kInf && x < floor) {
            x = floor;
            ++repaired;
          }
        }
      }
    }
  }
  return repaired;
}

std::string Duration(double seconds) {
  return seconds < 90
             ? absl::StrFormat("%.0fs", seconds)
             : absl::StrFormat("%.0fm%02.0fs", std::floor(seconds / 60), std::fmod(seconds, 60));
}

int Run(const ShutdownSignal& shutdown) {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (config_path.empty() || out_path.empty()) {
    std::fprintf(stderr, "varipipe-profile: --config and --out are required (try --help)\n");
    return kExitUsage;
  }
  absl::StatusOr<v1::JobConfig> config = LoadJobConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "varipipe-profile: %s\n", std::string(config.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<executor::ModelSpec> spec = executor::ModelSpecFromConfig(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "varipipe-profile: %s: %s\n", config_path.c_str(),
                 std::string(spec.status().message()).c_str());
    return kExitUsage;
  }
  const bool quick = absl::GetFlag(FLAGS_quick);
  executor::ProfileSettings settings;
  settings.warmup = absl::GetFlag(FLAGS_warmup);
  settings.repeats =
      quick ? std::min(3, absl::GetFlag(FLAGS_repeats)) : absl::GetFlag(FLAGS_repeats);
  std::string device = absl::GetFlag(FLAGS_device);
  if (device == "auto") device = torch::cuda::is_available() ? "cuda:0" : "cpu";
  try {
    settings.device = torch::Device(device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "varipipe-profile: --device: '%s' is not a device (cpu, cuda:N)\n",
                 device.c_str());
    return kExitUsage;
  }
  if (settings.device.is_cuda()) {
    const v1::DType dtype = config->model().dtype();
    if (dtype == v1::BFLOAT16) settings.cuda_autocast_dtype = torch::kBFloat16;
    if (dtype == v1::FLOAT16) settings.cuda_autocast_dtype = torch::kHalf;
  } else {
    executor::InstallCountingCpuAllocator();
    torch::set_num_threads(std::max(1, absl::GetFlag(FLAGS_threads)));
  }
  std::vector<v1::RecomputeMode> modes;
  for (int m : config->planner().recompute_modes())
    modes.push_back(static_cast<v1::RecomputeMode>(m));
  if (modes.empty()) modes = {v1::RECOMPUTE_NONE, v1::RECOMPUTE_SELECTIVE, v1::RECOMPUTE_FULL};
  const std::vector<Grid> grids = Grids(*config, quick);
  const uint64_t cap = TokenCap(*config);

  // What to measure, in order.
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
  const std::string header =
      absl::StrCat("# varipipe-profile v1 ", device, " threads=", absl::GetFlag(FLAGS_threads),
                   " repeats=", settings.repeats, " quick=", quick,
                   " model=", config->model().ShortDebugString(), " points=", todo.size());
  PartialFile partial(out_path + ".partial", header);
  std::map<PointKey, executor::PointCosts> done = partial.Load();
  if (!partial.Open(done)) {
    std::fprintf(stderr, "varipipe-profile: cannot write %s.partial\n", out_path.c_str());
    return kExitFailure;
  }
  spdlog::info("profiling {} grid points on {} ({} already measured in {}.partial)", todo.size(),
               device, done.size(), out_path);

  const absl::Time start = absl::Now();
  size_t measured_now = 0;
  absl::Time last_report = start;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (shutdown.Requested()) {
      spdlog::warn("stopped by a signal after {} of {} points; run again to continue", done.size(),
                   todo.size());
      return kExitFailure;
    }
    const PointKey& key = todo[i];
    if (done.count(key) > 0) continue;
    executor::ProfilePoint point;
    point.component = static_cast<v1::CostComponent>(std::get<0>(key));
    point.recompute = static_cast<v1::RecomputeMode>(std::get<1>(key));
    point.micro_batch = std::get<2>(key);
    point.encoder_len = std::get<3>(key);
    point.seq_len = std::get<4>(key);
    absl::StatusOr<executor::PointCosts> costs = executor::MeasurePoint(*spec, point, settings);
    if (absl::IsResourceExhausted(costs.status())) {
      spdlog::warn("{}: infeasible", std::string(costs.status().message()));
      costs = executor::PointCosts{kInf, kInf, kInf, kInf};
    } else if (!costs.ok()) {
      spdlog::error("{}", std::string(costs.status().message()));
      return kExitFailure;
    }
    done[key] = *costs;
    partial.Append(key, *costs);
    ++measured_now;
    const absl::Time now = absl::Now();
    if (now - last_report > absl::Seconds(5) || i + 1 == todo.size()) {
      last_report = now;
      const double elapsed = absl::ToDoubleSeconds(now - start);
      const size_t left = todo.size() - done.size();
      spdlog::info("[{}/{}] {:.0f}% {} {} b={} s={}: {} elapsed, about {} left", done.size(),
                   todo.size(), 100.0 * done.size() / todo.size(),
                   v1::CostComponent_Name(point.component), v1::RecomputeMode_Name(point.recompute),
                   point.micro_batch, point.seq_len, Duration(elapsed),
                   Duration(elapsed / measured_now * left));
    }
  }

  // The file: one grid per component and recompute mode.
  v1::CostModelFile file;
  file.set_format_version(1);
  file.set_description(absl::StrCat(
      "varipipe-profile on ", device, " (LibTorch ", executor::TorchVersion(), ", ",
      absl::GetFlag(FLAGS_threads), " threads), ",
      absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone()), quick ? ", quick grid" : ""));
  *file.mutable_model() = config->model();
  int repaired = 0;
  for (const Grid& g : grids) {
    for (v1::RecomputeMode mode : modes) {
      const int measured_mode = DependsOnRecompute(g.component) ? mode : v1::RECOMPUTE_NONE;
      v1::CostGrid* out = file.add_grids();
      out->set_component(g.component);
      out->set_recompute(mode);
      out->set_tensor_parallel(1);
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
      repaired += RepairMonotonicity(g, {&fw, &bw, &stored, &peak});
      for (size_t k = 0; k < fw.size(); ++k) {
        out->add_forward_ms(fw[k]);
        out->add_backward_ms(bw[k]);
        out->add_stored_activation_mib(stored[k]);
        out->add_peak_activation_mib(std::max(peak[k], stored[k]));
      }
    }
    v1::ComponentParameters* p = file.add_parameters();
    p->set_component(g.component);
    p->set_parameters(executor::ComponentParameters(*spec, g.component));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(file, &json, options).ok()) {
    spdlog::error("cannot render the cost model as JSON");
    return kExitFailure;
  }
  const std::string temporary = out_path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << json;
    if (!out.good()) {
      spdlog::error("cannot write {}", temporary);
      return kExitFailure;
    }
  }
  std::filesystem::rename(temporary, out_path);
  partial.Remove();
  spdlog::info(
      "wrote {}: {} grid points measured in {} ({} values raised to keep the grid "
      "monotone)",
      out_path, todo.size(), Duration(absl::ToDoubleSeconds(absl::Now() - start)), repaired);
  return kExitOk;
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
