#include "common/checkpoint/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/safetensors_file.h"
#include "nlohmann/json.hpp"

namespace varipipe {
namespace {

absl::Status WriteAll(int fd, const std::string& path, const void* data, uint64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t wrote = write(fd, p, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
    p += wrote;
    n -= static_cast<uint64_t>(wrote);
  }
  return absl::OkStatus();
}

// Calls `write_body(fd, tmp_path)` on PATH.tmp, then syncs and renames it.
template <typename Body>
absl::Status Atomically(const std::string& path, Body write_body) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  absl::Status status = write_body(fd, tmp);
  if (status.ok() && fsync(fd) != 0) {
    status = absl::UnavailableError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(errno)));
  }
  close(fd);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  if (!status.ok()) std::remove(tmp.c_str());
  return status;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorToWrite& a, const TensorToWrite& b) { return a.name < b.name; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    if (i > 0 && t.name == tensors[i - 1].name) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' twice"));
    }
    const int element = SafetensorsDtypeSize(t.dtype);
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (element == 0 || numel * static_cast<uint64_t>(element) != t.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' of dtype ",
                                                     t.dtype, " has ", t.bytes,
                                                     " bytes for its shape"));
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  return Atomically(path, [&](int fd, const std::string& tmp) -> absl::Status {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(json.size() >> (8 * i));
    if (absl::Status s = WriteAll(fd, tmp, length, 8); !s.ok()) return s;
    if (absl::Status s = WriteAll(fd, tmp, json.data(), json.size()); !s.ok()) return s;
    for (const TensorToWrite& t : tensors) {
      if (absl::Status s = WriteAll(fd, tmp, t.data, t.bytes); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  return Atomically(path, [&](int fd, const std::string& tmp) {
    return WriteAll(fd, tmp, text.data(), text.size());
  });
}

}  // namespace varipipe
