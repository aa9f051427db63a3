// A safetensors file (Hugging Face's checkpoint format) read by byte ranges:
// an 8-byte little-endian header length N, N bytes of JSON naming every
// tensor's dtype, shape and [begin, end) byte offsets relative to the data
// that follows the header, then the data. Opening reads only the header; a
// tensor's bytes are read with pread into the caller's buffer, so a rank
// reads the tensors it needs and never the whole file.
//
// Every error names the file (and the tensor): a header that is not a JSON
// object, a header or tensor range outside the file, an unknown dtype, a
// shape whose size disagrees with its byte range, overlapping tensors.
//
//   VP_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
//   const SafetensorsTensor* t = file.Find("model.norm.weight");
//   std::vector<char> bytes(t->bytes());
//   VP_RETURN_IF_ERROR(file.Read(*t, bytes.data()));
#ifndef VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_FILE_H_
#define VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace varipipe {

// The dtypes Varipipe reads: F32, F16 and BF16 weights (converted to the
// master dtype by the loader) and I64 token ids of golden files. Other
// safetensors dtypes are recognised (their sizes are checked) but a loader
// refuses them.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as in the header: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // [] for a scalar
  uint64_t begin = 0;          // absolute byte offsets in the file
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype; 0 when unknown.
int SafetensorsDtypeSize(std::string_view dtype);

// What a header says: the tensors (in header order) and "__metadata__"
// (string values only, as the format says).
struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

class SafetensorsFile {
 public:
  // Reads and checks the header of the file at `path`.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  // Parses a header (the JSON text) of a file of `file_size` bytes whose
  // data starts at byte `data_begin`; `path` only names the file in errors.
  // The whole check Open does, without the file (the fuzz target's entry).
  static absl::StatusOr<SafetensorsHeader> ParseHeader(std::string_view json, uint64_t data_begin,
                                                       uint64_t file_size, const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  // In header order.
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // Copies the tensor's bytes (tensor.bytes() of them) into `out`.
  absl::Status Read(const SafetensorsTensor& tensor, void* out) const;
  // Bytes read by Read so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_CHECKPOINT_SAFETENSORS_FILE_H_
