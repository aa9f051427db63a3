// The token-id scan of indexed files (common/dataset/token_range.h): the
// range it finds, its cache beside the index (reused, invalidated by a
// changed file, recomputed when corrupt or unwritable) and the start-up
// check's message (file, id, samples, model.vocab_size), for inputs and
// targets.
#include "common/dataset/token_range.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config/job_config.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/sample_dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::StatusIs;

class TokenRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("varipipe-token-range-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // The range of `prefix` through its cache, from a fresh open.
  TokenRangeResult Range(const std::string& prefix) {
    absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
    EXPECT_THAT(file, IsOk());
    if (!file.ok()) return {};
    absl::StatusOr<TokenRangeResult> result = ReadOrScanTokenRange(**file, {});
    EXPECT_THAT(result, IsOk());
    return result.ok() ? *result : TokenRangeResult{};
  }

  fs::path dir_;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Sequences with known extremes: max 90 first in sequence 3 (again in 6),
// min 2 first in sequence 1, an empty sequence 4.
std::vector<std::vector<int64_t>> KnownSequences() {
  return {{10, 20}, {2, 30}, {40}, {5, 90, 7}, {}, {2, 11}, {90}};
}

TEST_F(TokenRangeTest, ScanFindsTheExtremesAndTheFirstSequenceHoldingEach) {
  for (const int64_t vocab : {int64_t{100}, int64_t{200000}}) {  // uint16, int32 tokens
    SCOPED_TRACE(vocab);
    const std::string prefix = Path(absl::StrCat("d", vocab));
    ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), vocab), IsOk());
    absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
    ASSERT_THAT(file, IsOk());
    absl::StatusOr<TokenRange> range = ScanTokenRange(**file, {});
    ASSERT_THAT(range, IsOk());
    EXPECT_EQ(range->tokens, 11u);
    EXPECT_EQ(range->min_id, 2);
    EXPECT_EQ(range->min_sequence, 1u);
    EXPECT_EQ(range->max_id, 90);
    EXPECT_EQ(range->max_sequence, 3u);
  }
}

// Random files of both token widths: the scan agrees with reading every
// sample.
TEST_F(TokenRangeTest, ScanMatchesReadingEverySample) {
  std::mt19937_64 rng(testing::TestSeed("TokenRangeTest.ScanMatchesReadingEverySample"));
  for (int round = 0; round < 6; ++round) {
    const int64_t vocab = round % 2 == 0 ? 50000 : 150000;
    std::vector<std::vector<int64_t>> sequences(1 + rng() % 300);
    TokenRange expected;
    for (uint64_t s = 0; s < sequences.size(); ++s) {
      sequences[s].resize(rng() % 40);
      for (int64_t& t : sequences[s]) {
        t = static_cast<int64_t>(rng() % vocab);
        if (expected.tokens == 0 || t < expected.min_id) {
          expected.min_id = t;
          expected.min_sequence = s;
        }
        if (expected.tokens == 0 || t > expected.max_id) {
          expected.max_id = t;
          expected.max_sequence = s;
        }
        ++expected.tokens;
      }
    }
    const std::string prefix = Path(absl::StrCat("r", round));
    ASSERT_THAT(WriteIndexedFile(prefix, sequences, vocab), IsOk());
    absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
    ASSERT_THAT(file, IsOk());
    absl::StatusOr<TokenRange> range = ScanTokenRange(**file, {});
    ASSERT_THAT(range, IsOk());
    if (expected.tokens == 0) {
      EXPECT_EQ(range->tokens, 0u);
    } else {
      EXPECT_EQ(*range, expected) << "round " << round;
    }
  }
}

TEST_F(TokenRangeTest, CacheBesideTheIndexIsReusedByTheNextOpen) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  const TokenRangeResult first = Range(prefix);
  EXPECT_FALSE(first.from_cache);
  EXPECT_EQ(first.range.max_id, 90);
  ASSERT_TRUE(fs::exists(TokenRangeCachePath(prefix)));
  EXPECT_EQ(TokenRangeCachePath(prefix), prefix + ".token_range");
  const TokenRangeResult second = Range(prefix);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.range, first.range);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(files, 3);  // .idx, .bin, .token_range
}

TEST_F(TokenRangeTest, UseCacheFalseNeitherReadsNorWrites) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
  ASSERT_THAT(file, IsOk());
  TokenScanOptions options;
  options.use_cache = false;
  absl::StatusOr<TokenRangeResult> result = ReadOrScanTokenRange(**file, options);
  ASSERT_THAT(result, IsOk());
  EXPECT_FALSE(result->from_cache);
  EXPECT_FALSE(fs::exists(TokenRangeCachePath(prefix)));
}

// A data file rewritten (new contents, same size) or only touched makes the
// cache stale: the files are scanned again and the cache rewritten.
TEST_F(TokenRangeTest, ChangedFilesInvalidateTheCache) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  EXPECT_FALSE(Range(prefix).from_cache);
  ASSERT_TRUE(Range(prefix).from_cache);

  std::vector<std::vector<int64_t>> changed = KnownSequences();
  changed[5][1] = 99;  // same sizes, new largest id
  ASSERT_THAT(WriteIndexedFile(prefix, changed, 100), IsOk());
  const TokenRangeResult rescanned = Range(prefix);
  EXPECT_FALSE(rescanned.from_cache);
  EXPECT_EQ(rescanned.range.max_id, 99);
  EXPECT_EQ(rescanned.range.max_sequence, 5u);
  EXPECT_TRUE(Range(prefix).from_cache);

  for (const char* ext : {".bin", ".idx"}) {
    SCOPED_TRACE(ext);
    const fs::path path = prefix + ext;
    fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(7));
    const TokenRangeResult touched = Range(prefix);
    EXPECT_FALSE(touched.from_cache);
    EXPECT_EQ(touched.range.max_id, 99);
    EXPECT_TRUE(Range(prefix).from_cache);
  }
}

// A cache that is truncated, garbage, empty, edited (a lower max without
// its checksum) or not a file is never trusted: the range is scanned again
// and, where the path allows, the cache rewritten.
TEST_F(TokenRangeTest, CorruptCacheIsRecomputedNeverTrusted) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  ASSERT_FALSE(Range(prefix).from_cache);
  const std::string cache = TokenRangeCachePath(prefix);
  const std::string good = ReadText(cache);
  ASSERT_THAT(good, HasSubstr("\nmax 90 3\n"));
  const std::vector<std::pair<std::string, std::string>> corruptions = {
      {"truncated", good.substr(0, good.size() / 2)},
      {"garbage", "\x01\x02 not a cache at all"},
      {"empty", ""},
      {"edited", absl::StrReplaceAll(good, {{"\nmax 90 3\n", "\nmax 50 3\n"}})},
      {"no final newline", good.substr(0, good.size() - 1)},
  };
  for (const auto& [name, text] : corruptions) {
    SCOPED_TRACE(name);
    std::ofstream(cache, std::ios::binary | std::ios::trunc) << text;
    const TokenRangeResult result = Range(prefix);
    EXPECT_FALSE(result.from_cache);
    EXPECT_EQ(result.range.max_id, 90);
    EXPECT_EQ(ReadText(cache), good);  // rewritten
    EXPECT_TRUE(Range(prefix).from_cache);
  }
  // A directory where the cache belongs: read fails, write fails, the scan
  // still answers.
  fs::remove(cache);
  fs::create_directory(cache);
  for (int i = 0; i < 2; ++i) {
    const TokenRangeResult result = Range(prefix);
    EXPECT_FALSE(result.from_cache);
    EXPECT_EQ(result.range.max_id, 90);
  }
}

TEST_F(TokenRangeTest, CancelledScanStops) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
  ASSERT_THAT(file, IsOk());
  TokenScanOptions options;
  options.cancelled = [] { return true; };
  EXPECT_THAT(CheckTokenRange(**file, 100, options),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr(prefix + ".bin")));
  EXPECT_FALSE(fs::exists(TokenRangeCachePath(prefix)));
}

TEST_F(TokenRangeTest, CheckAcceptsTheVocabularyBoundaryAndRefusesBelowIt) {
  const std::string prefix = Path("d");
  ASSERT_THAT(WriteIndexedFile(prefix, KnownSequences(), 100), IsOk());
  absl::StatusOr<std::unique_ptr<IndexedFile>> file = IndexedFile::Open(prefix);
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT(CheckTokenRange(**file, 91, {}), IsOk());
  EXPECT_THAT(CheckTokenRange(**file, 0, {}), IsOk());  // no vocabulary: no check
  // From the cache now, with the same message as from a scan.
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(
        CheckTokenRange(**file, 90, {}),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(prefix + ".bin: largest token id 90 (first in sample 3) is "
                                 "not below model.vocab_size 90"),
                       HasSubstr("the first sample with an id outside [0, 90) is sample 3"),
                       HasSubstr("at least 91"))));
  }
  // The first sample outside a smaller vocabulary comes before the largest
  // id's.
  EXPECT_THAT(CheckTokenRange(**file, 25, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("largest token id 90 (first in sample 3)"),
                             HasSubstr("outside [0, 25) is sample 1"))));
}

// A small GPT job over indexed inputs and targets, vocabulary `vocab`.
absl::StatusOr<v1::JobConfig> IndexedJob(const std::string& inputs, const std::string& targets,
                                         int64_t vocab) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfigJson(
      absl::StrCat(R"({"job_id": "x", "model": {"kind": "GPT", "num_layers": 2, "hidden_size": 64,
          "num_attention_heads": 2, "vocab_size": )",
                   vocab, R"(}, "cluster": {"device_memory_limit_mib": 1024},
          "data": {"format": "MEGATRON_INDEXED", "path": ")",
                   inputs, R"(", "target_path": ")", targets,
                   R"(", "tokens_per_global_batch": 4096, "max_sequence_length": 512},
          "training": {"iterations": 1}})"),
      "t");
  if (config.ok()) ApplyJobConfigDefaults(*config);
  return config;
}

// Through the dataset a job opens: the targets file (T5-style data) is
// checked too, and the error names its config field.
TEST_F(TokenRangeTest, DatasetOfAJobChecksInputsAndTargets) {
  ASSERT_THAT(WriteIndexedFile(Path("in"), KnownSequences(), 100), IsOk());
  std::vector<std::vector<int64_t>> targets(7, std::vector<int64_t>{1});
  targets[2] = {120};
  targets[5] = {3, 130, 4};
  ASSERT_THAT(WriteIndexedFile(Path("tg"), targets, 1000), IsOk());
  for (const auto& [vocab, error] :
       std::vector<std::pair<int64_t, std::string>>{
           {131, ""},
           {100, absl::StrCat("data.target_path: ", Path("tg"),
                              ".bin: largest token id 130 (first in sample 5) is not below "
                              "model.vocab_size 100; the first sample with an id outside [0, "
                              "100) is sample 2")},
           {64, absl::StrCat("data.path: ", Path("in"),
                             ".bin: largest token id 90 (first in sample 3) is not below "
                             "model.vocab_size 64")},
           // Both files in one message.
           {64, absl::StrCat("\n  data.target_path: ", Path("tg"),
                             ".bin: largest token id 130 (first in sample 5) is not below "
                             "model.vocab_size 64")}}) {
    SCOPED_TRACE(vocab);
    absl::StatusOr<v1::JobConfig> config = IndexedJob(Path("in"), Path("tg"), vocab);
    ASSERT_THAT(config, IsOk());
    absl::StatusOr<std::unique_ptr<SampleDataset>> dataset = OpenSampleDataset(*config);
    ASSERT_THAT(dataset, IsOk());
    const absl::Status checked = (*dataset)->CheckTokenIds({});
    if (error.empty()) {
      EXPECT_THAT(checked, IsOk());
    } else {
      EXPECT_THAT(checked, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(error)));
    }
  }
  // Both files' caches sit beside their indexes.
  EXPECT_TRUE(fs::exists(Path("in.token_range")));
  EXPECT_TRUE(fs::exists(Path("tg.token_range")));
}

}  // namespace
}  // namespace varipipe
