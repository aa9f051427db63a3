#include "common/checkpoint/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace varipipe {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
  }
  return json;
}

}  // namespace

struct HuggingFaceCheckpoint::State {
  // Tensor name -> shard file name (sharded), and the opened shards.
  std::map<std::string, std::string, std::less<>> weight_map;
  std::map<std::string, std::unique_ptr<SafetensorsFile>, std::less<>> files;
};

HuggingFaceCheckpoint::HuggingFaceCheckpoint() : state_(std::make_unique<State>()) {}
HuggingFaceCheckpoint::HuggingFaceCheckpoint(HuggingFaceCheckpoint&&) noexcept = default;
HuggingFaceCheckpoint& HuggingFaceCheckpoint::operator=(HuggingFaceCheckpoint&&) noexcept = default;
HuggingFaceCheckpoint::~HuggingFaceCheckpoint() = default;

absl::StatusOr<HuggingFaceCheckpoint> HuggingFaceCheckpoint::Open(const std::string& given) {
  namespace fs = std::filesystem;
  HuggingFaceCheckpoint ckpt;
  std::error_code ec;
  // Messages say where this process looked, whatever its working directory.
  const fs::path absolute = fs::absolute(given.empty() ? "." : given, ec);
  const std::string dir = ec ? given : absolute.lexically_normal().string();
  ckpt.dir_ = dir;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  if (!fs::is_regular_file(fs::path(dir) / "config.json", ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json"));
  }
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index, ec)) {
    ckpt.sharded_ = true;
    VP_ASSIGN_OR_RETURN(nlohmann::json json, ReadJson(index));
    const auto map = json.find("weight_map");
    if (map == json.end() || !map->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index.string(), ": no \"weight_map\" object"));
    }
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index.string(), ": weight_map entry of '", name, "' is not a file name"));
      }
      const std::string shard = file.get<std::string>();
      // Shards live beside the index: no directories, no "..".
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": weight_map entry of '",
                                                       name, "' names '", shard,
                                                       "', not a file beside the index"));
      }
      if (!fs::is_regular_file(fs::path(dir) / shard, ec)) {
        return absl::NotFoundError(
            absl::StrCat(index.string(), ": shard '", shard, "' of '", name, "' is not in ", dir));
      }
      ckpt.state_->weight_map.emplace(name, shard);
    }
  } else if (fs::exists(single, ec)) {
    VP_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single.string()));
    for (const SafetensorsTensor& t : file.tensors()) {
      ckpt.state_->weight_map.emplace(t.name, "model.safetensors");
    }
    ckpt.state_->files.emplace("model.safetensors",
                               std::make_unique<SafetensorsFile>(std::move(file)));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  return ckpt;
}

std::vector<std::string> HuggingFaceCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : state_->weight_map) names.push_back(name);
  return names;  // std::map keeps them sorted
}

absl::StatusOr<HuggingFaceCheckpoint::Located> HuggingFaceCheckpoint::Find(std::string_view name) {
  const auto it = state_->weight_map.find(name);
  if (it == state_->weight_map.end()) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": the checkpoint has no tensor '", std::string(name), "'"));
  }
  auto file = state_->files.find(it->second);
  if (file == state_->files.end()) {
    VP_ASSIGN_OR_RETURN(SafetensorsFile opened,
                        SafetensorsFile::Open((std::filesystem::path(dir_) / it->second).string()));
    file = state_->files.emplace(it->second, std::make_unique<SafetensorsFile>(std::move(opened)))
               .first;
  }
  const SafetensorsTensor* tensor = file->second->Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat(file->second->path(), ": no tensor '",
                                            std::string(name), "', which the index places there"));
  }
  return Located{file->second.get(), tensor};
}

uint64_t HuggingFaceCheckpoint::bytes_read() const {
  uint64_t n = 0;
  for (const auto& [name, file] : state_->files) n += file->bytes_read();
  return n;
}

std::vector<std::string> HuggingFaceCheckpoint::opened_files() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : state_->files) names.push_back(name);
  return names;
}

}  // namespace varipipe
