#include "common/dataset/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dataset/token_range.h"
#include "common/status.h"

namespace varipipe {
namespace {

// Megatron-LM's index layout (megatron/core/datasets/indexed_dataset.py):
//   9-byte magic "MMIDIDX\0\0", uint64 version (1), uint8 dtype code,
//   uint64 sequence count, uint64 document count,
//   int32 sizes[sequences], int64 pointers[sequences] (byte offsets into
//   .bin), int64 document_index[documents] (sequence boundaries, first 0,
//   last == sequences). All little-endian.
constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

int ElementSize(int code) {
  switch (code) {
    case 1:  // uint8
    case 2:  // int8
      return 1;
    case 3:  // int16
    case 8:  // uint16
      return 2;
    case 4:  // int32
      return 4;
    case 5:  // int64
      return 8;
    default:  // 6, 7: floating point, not token ids
      return 0;
  }
}

int64_t Element(const uint8_t* p, int code) {
  switch (code) {
    case 1:
      return *p;
    case 2:
      return static_cast<int8_t>(*p);
    case 3: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 8: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

class Reader {
 public:
  Reader(const std::string& data, const std::string& path) : data_(data), path_(path) {}
  template <typename T>
  absl::Status Read(T* out, size_t count, const char* what) {
    const size_t bytes = sizeof(T) * count;
    if (data_.size() - offset_ < bytes) {
      return absl::DataLossError(absl::StrCat(path_, ": truncated index: ", what, " needs ", bytes,
                                              " bytes at offset ", offset_, ", the file has ",
                                              data_.size()));
    }
    // An empty array may have no storage (out == nullptr), which memcpy
    // must not be given even for zero bytes.
    if (bytes == 0) return absl::OkStatus();
    std::memcpy(out, data_.data() + offset_, bytes);
    offset_ += bytes;
    return absl::OkStatus();
  }
  size_t remaining() const { return data_.size() - offset_; }

 private:
  const std::string& data_;
  const std::string& path_;
  size_t offset_ = 0;
};

// A whole file mapped read-only (bytes null for an empty file); unmapped
// by its owner.
struct MappedFile {
  const uint8_t* bytes = nullptr;
  size_t size = 0;
};

absl::StatusOr<MappedFile> MapReadOnly(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoToStatus(error, absl::StrCat("stat ", path));
  }
  MappedFile file;
  file.size = static_cast<size_t>(st.st_size);
  if (file.size > 0) {
    void* mapped = mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      close(fd);
      return ErrnoToStatus(error, absl::StrCat("mmap ", path));
    }
    file.bytes = static_cast<const uint8_t*>(mapped);
  }
  close(fd);
  return file;
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedFile>> IndexedFile::Open(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  VP_ASSIGN_OR_RETURN(const std::string index, ReadFileToString(idx_path));
  std::unique_ptr<IndexedFile> f(new IndexedFile());
  f->prefix_ = prefix;
  Reader r(index, idx_path);
  char magic[9];
  VP_RETURN_IF_ERROR(r.Read(magic, 9, "the header"));
  if (std::memcmp(magic, kMagic, 9) != 0) {
    return absl::DataLossError(
        absl::StrCat(idx_path, ": not a Megatron-LM indexed dataset (bad magic)"));
  }
  uint64_t version = 0;
  uint8_t code = 0;
  uint64_t sequences = 0;
  uint64_t documents = 0;
  VP_RETURN_IF_ERROR(r.Read(&version, 1, "the version"));
  if (version != 1) {
    return absl::DataLossError(absl::StrCat(idx_path, ": unsupported index version ", version));
  }
  VP_RETURN_IF_ERROR(r.Read(&code, 1, "the dtype code"));
  f->dtype_code_ = code;
  f->element_size_ = ElementSize(code);
  if (f->element_size_ == 0) {
    return absl::DataLossError(
        absl::StrCat(idx_path, ": dtype code ", int{code}, " is not an integer token type"));
  }
  VP_RETURN_IF_ERROR(r.Read(&sequences, 1, "the sequence count"));
  VP_RETURN_IF_ERROR(r.Read(&documents, 1, "the document count"));
  if (sequences > r.remaining() / 12 || documents > r.remaining() / 8 + 1) {
    return absl::DataLossError(absl::StrCat(idx_path, ": truncated index: ", sequences,
                                            " sequences and ", documents,
                                            " documents do not fit the file"));
  }
  f->sizes_.resize(sequences);
  f->pointers_.resize(sequences);
  f->document_index_.resize(documents);
  VP_RETURN_IF_ERROR(r.Read(f->sizes_.data(), sequences, "the sizes"));
  VP_RETURN_IF_ERROR(r.Read(f->pointers_.data(), sequences, "the pointers"));
  VP_RETURN_IF_ERROR(r.Read(f->document_index_.data(), documents, "the document index"));

  VP_ASSIGN_OR_RETURN(const MappedFile data, MapReadOnly(bin_path));
  f->data_ = data.bytes;
  f->data_size_ = data.size;
  // Every sequence must lie inside the .bin file.
  for (uint64_t i = 0; i < sequences; ++i) {
    const int64_t begin = f->pointers_[i];
    const int64_t bytes = static_cast<int64_t>(f->sizes_[i]) * f->element_size_;
    // Compared without computing begin + bytes, which can overflow.
    if (f->sizes_[i] < 0 || begin < 0 || static_cast<uint64_t>(begin) > f->data_size_ ||
        static_cast<uint64_t>(bytes) > f->data_size_ - static_cast<uint64_t>(begin)) {
      return absl::DataLossError(absl::StrCat(prefix, ": sequence ", i, " (", f->sizes_[i],
                                              " tokens at byte ", begin, ") lies outside ",
                                              bin_path, " (", f->data_size_,
                                              " bytes): index and data do not match"));
    }
  }
  if (!f->document_index_.empty() &&
      (f->document_index_.front() != 0 ||
       f->document_index_.back() != static_cast<int64_t>(sequences))) {
    return absl::DataLossError(
        absl::StrCat(idx_path, ": document index must run from 0 to ", sequences));
  }
  return f;
}

IndexedFile::~IndexedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), data_size_);
}

void IndexedFile::Read(uint64_t sequence, std::vector<int64_t>* out) const {
  const uint8_t* p = data_ + pointers_[sequence];
  for (int32_t k = 0; k < sizes_[sequence]; ++k) {
    out->push_back(Element(p, dtype_code_));
    p += element_size_;
  }
}

absl::StatusOr<std::unique_ptr<IndexedFileWriter>> IndexedFileWriter::Create(
    const std::string& prefix, bool uint16_tokens) {
  std::unique_ptr<IndexedFileWriter> w(new IndexedFileWriter());
  w->prefix_ = prefix;
  w->uint16_ = uint16_tokens;
  w->bin_.open(prefix + ".bin.tmp", std::ios::binary | std::ios::trunc);
  if (!w->bin_) return ErrnoToStatus(errno, absl::StrCat("open ", prefix, ".bin.tmp"));
  return w;
}

IndexedFileWriter::~IndexedFileWriter() {
  if (committed_) return;
  // Never committed: leave nothing half-written behind.
  bin_.close();
  std::error_code ignored;
  std::filesystem::remove(prefix_ + ".bin.tmp", ignored);
  std::filesystem::remove(prefix_ + ".idx.tmp", ignored);
}

absl::Status IndexedFileWriter::Append(std::span<const int64_t> tokens) {
  if (committed_)
    return absl::FailedPreconditionError(absl::StrCat(prefix_, ": already committed"));
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix_, ": a sequence of ", tokens.size(), " tokens is too long"));
  }
  const int64_t limit = uint16_ ? 65535 : std::numeric_limits<int32_t>::max();
  buffer_.clear();
  for (int64_t t : tokens) {
    if (t < 0 || t > limit) {
      return absl::InvalidArgumentError(absl::StrCat(prefix_, ": token id ", t,
                                                     " does not fit the indexed format's ",
                                                     uint16_ ? "uint16" : "int32", " tokens"));
    }
    if (uint16_) {
      const uint16_t v = static_cast<uint16_t>(t);
      buffer_.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      const int32_t v = static_cast<int32_t>(t);
      buffer_.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  bin_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  if (!bin_) return ErrnoToStatus(errno, absl::StrCat("write ", prefix_, ".bin.tmp"));
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(offset_);
  offset_ += static_cast<int64_t>(buffer_.size());
  tokens_ += tokens.size();
  return absl::OkStatus();
}

absl::Status IndexedFileWriter::Commit() {
  if (committed_)
    return absl::FailedPreconditionError(absl::StrCat(prefix_, ": already committed"));
  const std::string bin_tmp = prefix_ + ".bin.tmp";
  const std::string idx_tmp = prefix_ + ".idx.tmp";
  bin_.close();
  if (!bin_) return ErrnoToStatus(errno, absl::StrCat("write ", bin_tmp));
  {
    std::ofstream idx(idx_tmp, std::ios::binary | std::ios::trunc);
    if (!idx) return ErrnoToStatus(errno, absl::StrCat("open ", idx_tmp));
    const uint64_t version = 1;
    const uint8_t code = uint16_ ? 8 : 4;
    const uint64_t count = sizes_.size();
    const uint64_t documents = count + 1;  // one document per sequence
    idx.write(kMagic, 9);
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&count), 8);
    idx.write(reinterpret_cast<const char*>(&documents), 8);
    idx.write(reinterpret_cast<const char*>(sizes_.data()), 4 * sizes_.size());
    idx.write(reinterpret_cast<const char*>(pointers_.data()), 8 * pointers_.size());
    for (uint64_t d = 0; d <= count; ++d) {
      const int64_t v = static_cast<int64_t>(d);
      idx.write(reinterpret_cast<const char*>(&v), 8);
    }
    idx.close();
    if (!idx) return ErrnoToStatus(errno, absl::StrCat("write ", idx_tmp));
  }
  std::error_code error;
  std::filesystem::rename(bin_tmp, prefix_ + ".bin", error);
  if (!error) std::filesystem::rename(idx_tmp, prefix_ + ".idx", error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("rename into ", prefix_, ".{bin,idx}: ", error.message()));
  }
  committed_ = true;
  return absl::OkStatus();
}

absl::Status WriteIndexedFile(const std::string& prefix,
                              const std::vector<std::vector<int64_t>>& sequences,
                              int64_t vocab_size) {
  bool fits16 = vocab_size > 0 && vocab_size < 65500;
  for (const auto& s : sequences) {
    for (int64_t t : s) {
      if (t > 65535) fits16 = false;
    }
  }
  VP_ASSIGN_OR_RETURN(std::unique_ptr<IndexedFileWriter> writer,
                      IndexedFileWriter::Create(prefix, fits16));
  for (const auto& s : sequences) VP_RETURN_IF_ERROR(writer->Append(s));
  return writer->Commit();
}

absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> IndexedSampleDataset::Open(
    const std::string& input_prefix, const std::string& target_prefix, int64_t vocab_size) {
  VP_ASSIGN_OR_RETURN(std::unique_ptr<IndexedFile> inputs, IndexedFile::Open(input_prefix));
  std::unique_ptr<IndexedFile> targets;
  if (!target_prefix.empty()) {
    VP_ASSIGN_OR_RETURN(targets, IndexedFile::Open(target_prefix));
  }
  return FromFiles(std::move(inputs), std::move(targets), vocab_size);
}

absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> IndexedSampleDataset::FromFiles(
    std::unique_ptr<IndexedFile> inputs, std::unique_ptr<IndexedFile> targets, int64_t vocab_size) {
  if (targets != nullptr && targets->sequences() != inputs->sequences()) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs->prefix(), " has ", inputs->sequences(), " samples but ", targets->prefix(), " has ",
        targets->sequences(), ": inputs and targets must pair up"));
  }
  std::unique_ptr<IndexedSampleDataset> d(new IndexedSampleDataset());
  d->inputs_ = std::move(inputs);
  d->targets_ = std::move(targets);
  d->vocab_size_ = vocab_size;
  return d;
}

SampleLengths IndexedSampleDataset::Lengths(uint64_t index) const {
  return {inputs_->Length(index), targets_ ? targets_->Length(index) : 0};
}

absl::Status IndexedSampleDataset::ReadSample(uint64_t index, std::vector<int64_t>* input,
                                              std::vector<int64_t>* target) const {
  if (index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat(inputs_->prefix(), ": sample ", index, " is beyond its ", size(), " samples"));
  }
  input->clear();
  target->clear();
  inputs_->Read(index, input);
  if (targets_) targets_->Read(index, target);
  if (vocab_size_ > 0) {
    for (const auto* side : {input, target}) {
      for (int64_t t : *side) {
        if (t < 0 || t >= vocab_size_) {
          return absl::InvalidArgumentError(absl::StrCat(
              side == input ? inputs_->prefix() : targets_->prefix(), ": sample ", index,
              " has token id ", t, " outside the vocabulary [0, ", vocab_size_, ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status IndexedSampleDataset::CheckTokenIds(const TokenScanOptions& options) const {
  // OpenSampleDataset opens the inputs from data.path, the targets from
  // data.target_path: the errors name the field to change. Both files are
  // checked, so one message says all that is wrong.
  const absl::Status inputs =
      Annotate(CheckTokenRange(*inputs_, vocab_size_, options), "data.path");
  if (targets_ == nullptr || absl::IsCancelled(inputs)) return inputs;
  const absl::Status targets =
      Annotate(CheckTokenRange(*targets_, vocab_size_, options), "data.target_path");
  if (inputs.ok()) return targets;
  if (targets.ok()) return inputs;
  return absl::Status(inputs.code(), absl::StrCat(inputs.message(), "\n  ", targets.message()));
}

std::string IndexedSampleDataset::Describe() const {
  return absl::StrCat("indexed dataset ", inputs_->prefix(),
                      targets_ ? absl::StrCat(" + ", targets_->prefix()) : "", " (", size(),
                      " samples)");
}

}  // namespace varipipe
