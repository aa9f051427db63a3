#include "common/checkpoint/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace varipipe {
namespace {

// Headers beyond this are refused before allocating (the format's own
// readers use 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Reads exactly `n` bytes at `offset`; an error names the file.
absl::Status ReadAt(int fd, const std::string& path, uint64_t offset, void* out, uint64_t n) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t got = pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat(path, ": read at byte ", offset, " failed: ", std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": file ends at byte ", offset, ", ", n, " bytes short"));
    }
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

// One tensor's entry of the header: dtype, shape and data offsets, sized
// consistently and inside the file's data bytes (which start at
// `data_begin`).
absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& name,
                                                   const nlohmann::json& entry, uint64_t data_begin,
                                                   uint64_t file_size, const std::string& path) {
  const uint64_t data_bytes = file_size - data_begin;
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!entry.is_object()) return Bad(path, absl::StrCat(where, " is not an object"));
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) {
    return Bad(path, absl::StrCat(where, " has no dtype string"));
  }
  if (shape == entry.end() || !shape->is_array()) {
    return Bad(path, absl::StrCat(where, " has no shape array"));
  }
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Bad(path, absl::StrCat(where, " has no data_offsets [begin, end]"));
  }
  SafetensorsTensor t;
  t.name = name;
  t.dtype = dtype->get<std::string>();
  const int element = SafetensorsDtypeSize(t.dtype);
  if (element == 0) return Bad(path, absl::StrCat(where, " has unknown dtype '", t.dtype, "'"));
  // The element count, guarded against overflow by the file's size.
  uint64_t numel = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) {
      return Bad(path, absl::StrCat(where, " has a shape entry that is not a size: ", d.dump()));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (v != 0 && numel > file_size / v)) {
      return Bad(path, absl::StrCat(where, " has shape ", shape->dump(), ", larger than the file"));
    }
    numel *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    return Bad(path, absl::StrCat(where, " has data_offsets [", begin, ", ", end,
                                  "] outside the file's ", data_bytes, " data bytes"));
  }
  if (end - begin != numel * static_cast<uint64_t>(element)) {
    return Bad(path, absl::StrCat(where, " of shape ", shape->dump(), " and dtype ", t.dtype,
                                  " needs ", numel * static_cast<uint64_t>(element),
                                  " bytes but data_offsets give ", end - begin));
  }
  t.begin = data_begin + begin;
  t.end = data_begin + end;
  return t;
}

// No two tensors share bytes.
absl::Status CheckNoOverlap(const std::vector<SafetensorsTensor>& tensors,
                            const std::string& path) {
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : tensors) {
    if (t.bytes() > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Bad(path, absl::StrCat("tensors '", by_offset[i - 1]->name, "' and '",
                                    by_offset[i]->name, "' overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int SafetensorsDtypeSize(std::string_view dtype) {
  static const std::pair<std::string_view, int> kSizes[] = {
      {"F64", 8}, {"I64", 8}, {"U64", 8},  {"F32", 4},     {"I32", 4},
      {"U32", 4}, {"F16", 2}, {"BF16", 2}, {"I16", 2},     {"U16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsHeader> SafetensorsFile::ParseHeader(std::string_view json,
                                                               uint64_t data_begin,
                                                               uint64_t file_size,
                                                               const std::string& path) {
  if (data_begin > file_size) return Bad(path, "the header runs past the end of the file");
  nlohmann::json header = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Bad(path, "the header is not valid JSON");
  if (!header.is_object()) return Bad(path, "the header is not a JSON object");
  SafetensorsHeader out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Bad(path, absl::StrCat("__metadata__ field '", key, "' is not a string"));
        }
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    VP_ASSIGN_OR_RETURN(SafetensorsTensor t,
                        ParseTensorEntry(name, entry, data_begin, file_size, path));
    out.tensors.push_back(std::move(t));
  }
  VP_RETURN_IF_ERROR(CheckNoOverlap(out.tensors, path));
  return out;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd_ < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(file.fd_, &st) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  file.file_size_ = static_cast<uint64_t>(st.st_size);
  if (file.file_size_ < 8) {
    return Bad(path, absl::StrCat("only ", file.file_size_,
                                  " bytes: too short for the 8-byte header length"));
  }
  unsigned char length_bytes[8];
  VP_RETURN_IF_ERROR(ReadAt(file.fd_, path, 0, length_bytes, 8));
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  if (header_length > kMaxHeaderBytes || header_length > file.file_size_ - 8) {
    return Bad(path, absl::StrCat("header length ", header_length, " does not fit the file's ",
                                  file.file_size_, " bytes"));
  }
  std::string json(header_length, '\0');
  VP_RETURN_IF_ERROR(ReadAt(file.fd_, path, 8, json.data(), header_length));
  VP_ASSIGN_OR_RETURN(file.header_, ParseHeader(json, 8 + header_length, file.file_size_, path));
  for (size_t i = 0; i < file.header_.tensors.size(); ++i) {
    file.index_.emplace(file.header_.tensors[i].name, i);
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_ = other.file_size_;
    header_ = std::move(other.header_);
    index_ = std::move(other.index_);
    bytes_read_ = other.bytes_read_;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) close(fd_);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Status SafetensorsFile::Read(const SafetensorsTensor& tensor, void* out) const {
  absl::Status status = ReadAt(fd_, path_, tensor.begin, out, tensor.bytes());
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("tensor '", tensor.name, "': ", status.message()));
  }
  bytes_read_ += tensor.bytes();
  return absl::OkStatus();
}

}  // namespace varipipe
