#include "common/checkpoint/hf_export_config.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/safetensors_writer.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace varipipe {

absl::StatusOr<std::string> CarriedHuggingFaceConfig(absl::string_view source,
                                                     absl::string_view source_name,
                                                     absl::string_view torch_dtype) {
  // ordered_json keeps the fields in the source's order.
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(
      source.begin(), source.end(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": not a JSON object"));
  }
  const std::string dtype(torch_dtype);
  const bool has_dtype = config.contains("dtype");
  if (has_dtype) config["dtype"] = dtype;
  if (config.contains("torch_dtype") || !has_dtype) config["torch_dtype"] = dtype;
  return config.dump(2) + "\n";
}

absl::Status CarryHuggingFaceModelFiles(const std::string& init_from, const std::string& out,
                                        absl::string_view torch_dtype) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path from = fs::absolute(init_from.empty() ? "." : init_from, ec).lexically_normal();
  const auto annotate = [](const absl::Status& status) {
    return Annotate(status, "training.init_from");
  };
  if (!fs::is_directory(from, ec)) {
    return annotate(absl::NotFoundError(absl::StrCat(from.string(), ": not a directory")));
  }
  const std::string source = (from / "config.json").string();
  absl::StatusOr<std::string> text = ReadFileToString(source);
  if (!text.ok()) return annotate(text.status());
  absl::StatusOr<std::string> config = CarriedHuggingFaceConfig(*text, source, torch_dtype);
  if (!config.ok()) return annotate(config.status());
  VP_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out) / "config.json").string(), *config));
  for (absl::string_view model_file : kHuggingFaceModelFiles) {
    const std::string name(model_file);
    const fs::path file = from / name;
    if (!fs::exists(file, ec)) continue;
    absl::StatusOr<std::string> bytes = ReadFileToString(file.string());
    if (!bytes.ok()) return annotate(bytes.status());
    VP_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out) / name).string(), *bytes));
  }
  return absl::OkStatus();
}

}  // namespace varipipe
