#include "common/dataset/token_range.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/dataset/indexed_dataset.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace varipipe {
namespace {

constexpr char kCacheHeader[] = "varipipe token range 1";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Bytes between looks at the clock and the cancel flag.
constexpr uint64_t kCheckBytes = uint64_t{16} << 20;

// What identifies one version of a file for the cache.
struct FileKey {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;

  bool operator==(const FileKey&) const = default;
};

absl::StatusOr<FileKey> StatKey(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  return FileKey{.size = static_cast<uint64_t>(st.st_size),
                 .mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                             st.st_mtim.tv_nsec,
                 .inode = static_cast<uint64_t>(st.st_ino)};
}

// The .idx and .bin keys of `prefix`.
struct PairKey {
  FileKey idx;
  FileKey bin;

  bool operator==(const PairKey&) const = default;
};

absl::StatusOr<PairKey> StatPair(const std::string& prefix) {
  PairKey key;
  VP_ASSIGN_OR_RETURN(key.idx, StatKey(prefix + ".idx"));
  VP_ASSIGN_OR_RETURN(key.bin, StatKey(prefix + ".bin"));
  return key;
}

uint64_t Fnv1a(absl::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

std::string CacheBody(const PairKey& key, const TokenRange& range) {
  return absl::StrCat(kCacheHeader, "\nidx ", key.idx.size, " ", key.idx.mtime_ns, " ",
                      key.idx.inode, "\nbin ", key.bin.size, " ", key.bin.mtime_ns, " ",
                      key.bin.inode, "\ntokens ", range.tokens, "\nmin ", range.min_id, " ",
                      range.min_sequence, "\nmax ", range.max_id, " ", range.max_sequence, "\n");
}

std::string CacheText(const PairKey& key, const TokenRange& range) {
  const std::string body = CacheBody(key, range);
  return absl::StrCat(body, "check ", absl::Hex(Fnv1a(body), absl::kZeroPad16), "\n");
}

// Parses "NAME v1 v2 ..." into `values` (exactly values.size() numbers).
template <typename... T>
bool ParseLine(absl::string_view line, absl::string_view name, T*... values) {
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 1 + sizeof...(T) || parts[0] != name) return false;
  size_t i = 1;
  return (absl::SimpleAtoi(parts[i++], values) && ...);
}

// The range a cache file records for `key`, or why it cannot be used.
absl::StatusOr<TokenRange> ParseCache(absl::string_view text, const PairKey& key) {
  const size_t check_at = text.rfind("check ");
  if (check_at == absl::string_view::npos || text.empty() || text.back() != '\n') {
    return absl::DataLossError("no checksum line");
  }
  const absl::string_view body = text.substr(0, check_at);
  const absl::string_view check = text.substr(check_at + 6, text.size() - check_at - 7);
  if (check != absl::StrCat(absl::Hex(Fnv1a(body), absl::kZeroPad16))) {
    return absl::DataLossError("checksum mismatch");
  }
  const std::vector<absl::string_view> lines = absl::StrSplit(body, '\n');
  // Six lines and the empty string after the last newline.
  if (lines.size() != 7 || lines[0] != kCacheHeader || !lines[6].empty()) {
    return absl::DataLossError("unknown format");
  }
  PairKey cached;
  TokenRange range;
  if (!ParseLine(lines[1], "idx", &cached.idx.size, &cached.idx.mtime_ns, &cached.idx.inode) ||
      !ParseLine(lines[2], "bin", &cached.bin.size, &cached.bin.mtime_ns, &cached.bin.inode) ||
      !ParseLine(lines[3], "tokens", &range.tokens) ||
      !ParseLine(lines[4], "min", &range.min_id, &range.min_sequence) ||
      !ParseLine(lines[5], "max", &range.max_id, &range.max_sequence)) {
    return absl::DataLossError("unparsable line");
  }
  if (!(cached == key)) {
    return absl::FailedPreconditionError("made from another version of the files");
  }
  return range;
}

// Writes `text` to `path` through a temporary file of this process and a
// rename, so readers see the old cache or the new one, never a part.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  const std::string temp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoToStatus(errno, absl::StrCat("open ", temp));
    out << text;
    out.close();
    if (!out) {
      const int error = errno;
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      return ErrnoToStatus(error, absl::StrCat("write ", temp));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    return ErrnoToStatus(error, absl::StrCat("rename ", temp, " to ", path));
  }
  return absl::OkStatus();
}

// Progress lines and cancellation of one scan.
class ScanProgress {
 public:
  ScanProgress(const IndexedFile& file, const TokenScanOptions& options, uint64_t total_bytes)
      : path_(file.prefix() + ".bin"), options_(options), total_(total_bytes) {}

  // After `bytes` more bytes: CANCELLED when the scan should stop.
  absl::Status Advance(uint64_t bytes) {
    done_ += bytes;
    pending_ += bytes;
    if (pending_ < kCheckBytes) return absl::OkStatus();
    pending_ = 0;
    if (options_.cancelled && options_.cancelled()) {
      return absl::CancelledError(absl::StrCat("scanning the token ids of ", path_, " cancelled"));
    }
    const absl::Time now = absl::Now();
    if (now - last_ >= options_.progress_interval) {
      last_ = now;
      spdlog::info("{}: scanning token ids: {:.2f} of {:.2f} GiB ({:.0f}%), {:.0f} MiB/s", path_,
                   done_ / kGiB, total_ / kGiB, 100.0 * done_ / std::max<uint64_t>(total_, 1),
                   done_ / (1024.0 * 1024.0) /
                       std::max(1e-9, absl::ToDoubleSeconds(now - started_)));
    }
    return absl::OkStatus();
  }
  double seconds() const { return absl::ToDoubleSeconds(absl::Now() - started_); }

 private:
  const std::string path_;
  const TokenScanOptions& options_;
  const uint64_t total_;
  const absl::Time started_ = absl::Now();
  absl::Time last_ = started_;
  uint64_t done_ = 0;
  uint64_t pending_ = 0;
};

// The scan for tokens stored as T.
template <typename T>
absl::StatusOr<TokenRange> ScanAs(const IndexedFile& file, const TokenScanOptions& options) {
  uint64_t total = 0;
  for (uint64_t s = 0; s < file.sequences(); ++s) total += uint64_t{file.Length(s)} * sizeof(T);
  ScanProgress progress(file, options, total);
  TokenRange range;
  for (uint64_t s = 0; s < file.sequences(); ++s) {
    const uint32_t n = file.Length(s);
    if (n == 0) continue;
    const uint8_t* p = file.SequenceBytes(s);
    T lo = std::numeric_limits<T>::max();
    T hi = std::numeric_limits<T>::lowest();
    for (uint32_t k = 0; k < n; ++k) {
      T v;
      std::memcpy(&v, p + uint64_t{k} * sizeof(T), sizeof(T));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    // Strict comparisons keep the first sequence holding each extreme.
    if (range.tokens == 0 || lo < range.min_id) {
      range.min_id = lo;
      range.min_sequence = s;
    }
    if (range.tokens == 0 || hi > range.max_id) {
      range.max_id = hi;
      range.max_sequence = s;
    }
    range.tokens += n;
    VP_RETURN_IF_ERROR(progress.Advance(uint64_t{n} * sizeof(T)));
  }
  spdlog::info("{}.bin: token ids {} to {} over {} tokens (scanned in {:.2f} s)", file.prefix(),
               range.min_id, range.max_id, range.tokens, progress.seconds());
  return range;
}

// The first sequence before `end` holding an id outside [0, vocab_size).
uint64_t FirstSequenceOutside(const IndexedFile& file, int64_t vocab_size, uint64_t end) {
  std::vector<int64_t> tokens;
  for (uint64_t s = 0; s < end; ++s) {
    tokens.clear();
    file.Read(s, &tokens);
    for (const int64_t t : tokens) {
      if (t < 0 || t >= vocab_size) return s;
    }
  }
  return end;
}

}  // namespace

std::string TokenRangeCachePath(const std::string& prefix) { return prefix + ".token_range"; }

absl::StatusOr<TokenRange> ScanTokenRange(const IndexedFile& file,
                                          const TokenScanOptions& options) {
  if (options.cancelled && options.cancelled()) {
    return absl::CancelledError(
        absl::StrCat("scanning the token ids of ", file.prefix(), ".bin cancelled"));
  }
  switch (file.dtype_code()) {
    case 1:
      return ScanAs<uint8_t>(file, options);
    case 2:
      return ScanAs<int8_t>(file, options);
    case 3:
      return ScanAs<int16_t>(file, options);
    case 4:
      return ScanAs<int32_t>(file, options);
    case 5:
      return ScanAs<int64_t>(file, options);
    case 8:
      return ScanAs<uint16_t>(file, options);
    default:
      return absl::InternalError(absl::StrCat(file.prefix(), ".idx: dtype code ",
                                              file.dtype_code(), " has no scan"));
  }
}

absl::StatusOr<TokenRangeResult> ReadOrScanTokenRange(const IndexedFile& file,
                                                      const TokenScanOptions& options) {
  if (!options.use_cache) {
    VP_ASSIGN_OR_RETURN(const TokenRange range, ScanTokenRange(file, options));
    return TokenRangeResult{.range = range, .from_cache = false};
  }
  const std::string cache = TokenRangeCachePath(file.prefix());
  VP_ASSIGN_OR_RETURN(const PairKey before, StatPair(file.prefix()));
  std::error_code missing;
  if (std::filesystem::exists(cache, missing)) {
    absl::StatusOr<std::string> text = ReadFileToString(cache);
    absl::StatusOr<TokenRange> cached =
        text.ok() ? ParseCache(*text, before) : absl::StatusOr<TokenRange>(text.status());
    if (cached.ok()) {
      spdlog::info("{}.bin: token ids {} to {} over {} tokens (from {})", file.prefix(),
                   cached->min_id, cached->max_id, cached->tokens, cache);
      return TokenRangeResult{.range = *cached, .from_cache = true};
    }
    spdlog::info("{}: not used ({}); scanning the token ids again", cache,
                 std::string(cached.status().message()));
  }
  VP_ASSIGN_OR_RETURN(const TokenRange range, ScanTokenRange(file, options));
  // Cached only when the files stayed as they were for the whole scan.
  absl::StatusOr<PairKey> after = StatPair(file.prefix());
  if (after.ok() && *after == before) {
    if (const absl::Status written = WriteAtomically(cache, CacheText(before, range));
        !written.ok()) {
      spdlog::warn("token ids not cached ({}): the next start scans {}.bin again",
                   std::string(written.message()), file.prefix());
    }
  }
  return TokenRangeResult{.range = range, .from_cache = false};
}

absl::Status CheckTokenRange(const IndexedFile& file, int64_t vocab_size,
                             const TokenScanOptions& options) {
  if (vocab_size <= 0) return absl::OkStatus();
  VP_ASSIGN_OR_RETURN(const TokenRangeResult result, ReadOrScanTokenRange(file, options));
  const TokenRange& range = result.range;
  if (range.tokens == 0) return absl::OkStatus();
  const bool too_large = range.max_id >= vocab_size;
  if (!too_large && range.min_id >= 0) return absl::OkStatus();
  // The extreme's sequence holds an id outside, so the first one is no later.
  const uint64_t extreme = too_large ? range.max_sequence : range.min_sequence;
  const uint64_t first = FirstSequenceOutside(file, vocab_size, extreme + 1);
  const std::string what =
      too_large ? absl::StrCat("largest token id ", range.max_id, " (first in sample ", extreme,
                               ") is not below model.vocab_size ", vocab_size)
                : absl::StrCat("token id ", range.min_id, " (first in sample ", extreme,
                               ") is negative");
  const std::string fix =
      too_large ? absl::StrCat("the data was tokenized for a larger vocabulary: set "
                               "model.vocab_size to the tokenizer's size (at least ",
                               range.max_id + 1, ") or tokenize the data again")
                : "the file is corrupt or was not written with token ids";
  return absl::InvalidArgumentError(absl::StrCat(file.prefix(), ".bin: ", what,
                                                 "; the first sample with an id outside [0, ",
                                                 vocab_size, ") is sample ", first, ": ", fix));
}

}  // namespace varipipe
