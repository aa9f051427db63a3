#include "common/config/cost_model_device.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/json_util.h"
#include "varipipe/v1/cost_model.pb.h"

namespace varipipe {
namespace {

// What varipipe-profile writes first in its description.
constexpr absl::string_view kProfiledOn = "varipipe-profile on ";

// The description of a varipipe-profile JSON file; empty when unreadable.
std::string ProfileDescription(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return "";
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  v1::CostModelFile file;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  options.case_insensitive_enum_parsing = true;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &file, options).ok()) return "";
  return file.description();
}

std::string Article(const std::string& kind) { return kind == "cpu" ? "the CPU" : "a GPU"; }

}  // namespace

std::string DeviceKind(const std::string& device) {
  if (device == "cpu" || absl::StartsWith(device, "cpu:")) return "cpu";
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) return "cuda";
  return "";
}

CostModelDevice CostModelDeviceOf(const v1::JobConfig& config) {
  CostModelDevice device;
  const std::string& path = config.planner().cost_model_path();
  if (path.empty()) {
    const std::string hardware =
        config.cluster().hardware().empty() ? "a100-40gb" : config.cluster().hardware();
    device.source = absl::StrCat("the analytic model of ", hardware,
                                 " (cluster.hardware; no planner.cost_model_path)");
    device.kind = "cuda";  // every preset is a GPU (planner/cost/hardware.h)
    device.analytic = true;
    return device;
  }
  const std::string description = ProfileDescription(path);
  device.source = description.empty() ? absl::StrCat("the profile ", path)
                                      : absl::StrCat("the profile ", path, " (", description, ")");
  if (absl::StartsWith(description, kProfiledOn)) {
    const absl::string_view rest = absl::string_view(description).substr(kProfiledOn.size());
    device.kind = DeviceKind(std::string(rest.substr(0, rest.find_first_of(" ,("))));
  }
  return device;
}

std::string CostModelDeviceMismatch(const CostModelDevice& model,
                                    const std::string& executor_device) {
  const std::string kind = DeviceKind(executor_device);
  if (model.kind.empty() || kind.empty() || model.kind == kind) return "";
  return absl::StrCat("the plans' times come from ", model.source, ", which describes ",
                      Article(model.kind), ", but this executor runs on ", executor_device,
                      ": predicted iteration times will be far off (and the memory model's ",
                      "limits may not fit). ", HowToProfile());
}

std::string HowToProfile() {
  return "Profile the executors' device: `torchrun --standalone --nproc_per_node 2 --no_python "
         "--redirects 2 --tee 2 varipipe-profile --config job.json --out profile.json --quick` "
         "on an executor machine, then set planner.cost_model_path to profile.json "
         "(docs/cost-model.md, \"Profiling: varipipe-profile\").";
}

}  // namespace varipipe
