// The range of token ids a Megatron-LM indexed file holds, found by one
// streaming pass over its memory-mapped .bin file and cached beside its
// index, so that data tokenized for another vocabulary is refused when a
// planner daemon starts (or by `varipipe-executor --check_launch`) instead
// of hours into a run, when a sample holding such an id is read.
//
// The cache, PREFIX.token_range, is a few lines of text: the size, mtime
// and inode of PREFIX.idx and PREFIX.bin when they were scanned, the range
// found and a checksum of those lines. It is written through a temporary
// file and a rename; one that does not parse, fails its checksum or names
// other file versions is ignored (the files are scanned again and the cache
// rewritten), so a cache is never trusted for data it was not made from.
// A directory that cannot hold it only costs a scan per start.
#ifndef VARIPIPE_COMMON_DATASET_TOKEN_RANGE_H_
#define VARIPIPE_COMMON_DATASET_TOKEN_RANGE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varipipe {

class IndexedFile;

// The smallest and largest id of a file and the first sequence holding
// each. Meaningless when tokens == 0.
struct TokenRange {
  uint64_t tokens = 0;
  int64_t min_id = 0;
  uint64_t min_sequence = 0;
  int64_t max_id = 0;
  uint64_t max_sequence = 0;

  bool operator==(const TokenRange&) const = default;
};

struct TokenScanOptions {
  // A progress line (GiB scanned, share, MiB/s) at most this often while a
  // scan runs; the first comes one interval after the scan started.
  absl::Duration progress_interval = absl::Seconds(5);
  // Polled during a scan; returning true ends it with CANCELLED.
  std::function<bool()> cancelled;
  // Reads and writes PREFIX.token_range.
  bool use_cache = true;
};

// A file's range and whether it came from the cache (no scan).
struct TokenRangeResult {
  TokenRange range;
  bool from_cache = false;
};

// PREFIX.token_range, the cache of the file PREFIX.idx/PREFIX.bin.
std::string TokenRangeCachePath(const std::string& prefix);

// One pass over every sequence of `file`, in index order.
absl::StatusOr<TokenRange> ScanTokenRange(const IndexedFile& file,
                                          const TokenScanOptions& options);

// The cached range when the cache matches the files, else a scan (whose
// result is cached when the files did not change while it ran).
absl::StatusOr<TokenRangeResult> ReadOrScanTokenRange(const IndexedFile& file,
                                                      const TokenScanOptions& options);

// INVALID_ARGUMENT when an id of `file` is negative or at least
// `vocab_size`, naming the .bin file, the extreme id and the first sample
// holding it, the first sample outside the vocabulary and
// model.vocab_size. vocab_size <= 0 checks nothing.
absl::Status CheckTokenRange(const IndexedFile& file, int64_t vocab_size,
                             const TokenScanOptions& options);

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_DATASET_TOKEN_RANGE_H_
