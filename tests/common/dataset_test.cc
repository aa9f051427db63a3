#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/jsonl_dataset.h"
#include "common/dataset/lengths_csv.h"
#include "common/dataset/minibatch_sampler.h"
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

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("varipipe-dataset-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<std::vector<int64_t>> Sequences(int n, int64_t max_id) {
  std::vector<std::vector<int64_t>> s;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> seq;
    for (int k = 0; k < 1 + (i * 7) % 13; ++k) seq.push_back((i * 31 + k * 17) % max_id);
    s.push_back(seq);
  }
  return s;
}

TEST_F(DatasetTest, IndexedRoundTripUint16AndInt32) {
  for (int64_t vocab : {int64_t{32000}, int64_t{200000}}) {
    const auto sequences = Sequences(50, vocab);
    const std::string prefix = Path(absl::StrCat("data", vocab));
    ASSERT_THAT(WriteIndexedFile(prefix, sequences, vocab), IsOk());
    absl::StatusOr<std::unique_ptr<IndexedFile>> f = IndexedFile::Open(prefix);
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ((*f)->element_size(), vocab < 65500 ? 2 : 4);
    ASSERT_EQ((*f)->sequences(), sequences.size());
    for (size_t i = 0; i < sequences.size(); ++i) {
      EXPECT_EQ((*f)->Length(i), sequences[i].size());
      std::vector<int64_t> tokens;
      (*f)->Read(i, &tokens);
      EXPECT_EQ(tokens, sequences[i]);
    }
  }
}

TEST_F(DatasetTest, IndexedPairServesSamples) {
  ASSERT_THAT(WriteIndexedFile(Path("in"), Sequences(20, 100), 100), IsOk());
  ASSERT_THAT(WriteIndexedFile(Path("tg"), Sequences(20, 50), 100), IsOk());
  absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> d =
      IndexedSampleDataset::Open(Path("in"), Path("tg"), 100);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ((*d)->size(), 20u);
  std::vector<int64_t> input, target;
  ASSERT_THAT((*d)->ReadSample(3, &input, &target), IsOk());
  EXPECT_EQ(input, Sequences(20, 100)[3]);
  EXPECT_EQ(target, Sequences(20, 50)[3]);
  EXPECT_EQ((*d)->Lengths(3), (SampleLengths{static_cast<uint32_t>(input.size()),
                                             static_cast<uint32_t>(target.size())}));
  EXPECT_THAT((*d)->ReadSample(20, &input, &target), StatusIs(absl::StatusCode::kOutOfRange));
}

TEST_F(DatasetTest, CorruptIndexesAreNamed) {
  ASSERT_THAT(WriteIndexedFile(Path("d"), Sequences(10, 100), 100), IsOk());
  std::string idx;
  {
    std::ifstream in(Path("d.idx"), std::ios::binary);
    idx.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto write_idx = [&](const std::string& bytes) {
    std::ofstream(Path("d.idx"), std::ios::binary | std::ios::trunc) << bytes;
  };
  write_idx("XXIDIDX" + idx.substr(7));
  EXPECT_THAT(IndexedFile::Open(Path("d")),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("d.idx"), HasSubstr("magic"))));
  write_idx(idx.substr(0, idx.size() - 20));
  EXPECT_THAT(
      IndexedFile::Open(Path("d")),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("d.idx"), HasSubstr("truncated"))));
  std::string bad_type = idx;
  bad_type[17] = 7;  // float32
  write_idx(bad_type);
  EXPECT_THAT(IndexedFile::Open(Path("d")),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not an integer token type")));
  write_idx(idx);
  fs::resize_file(Path("d.bin"), fs::file_size(Path("d.bin")) - 4);
  EXPECT_THAT(IndexedFile::Open(Path("d")),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("sequence 9"), HasSubstr("index and data do not match"))));
  fs::remove(Path("d.bin"));
  EXPECT_THAT(IndexedFile::Open(Path("d")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("d.bin")));
}

// Found by the indexed_dataset fuzz target: an index whose sizes and
// pointers are empty copied zero bytes into an empty vector's null storage
// (undefined behaviour).
TEST_F(DatasetTest, IndexedWithNoSequencesOpensEmpty) {
  ASSERT_THAT(WriteIndexedFile(Path("empty"), {}, 100), IsOk());
  absl::StatusOr<std::unique_ptr<IndexedFile>> f = IndexedFile::Open(Path("empty"));
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ((*f)->sequences(), 0u);
  EXPECT_EQ((*f)->documents(), 0u);
}

// Found while fuzzing: a pointer near 2^63 overflowed the sum in the check
// that the sequence lies inside the .bin file (signed overflow: undefined
// behaviour, reported by UBSan in the fuzz and debug builds).
TEST_F(DatasetTest, IndexedPointerNearInt64MaxIsOutsideTheData) {
  ASSERT_THAT(WriteIndexedFile(Path("d"), Sequences(3, 100), 100), IsOk());
  std::string idx;
  {
    std::ifstream in(Path("d.idx"), std::ios::binary);
    idx.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Header (9 + 8 + 1 + 8 + 8 bytes), 3 int32 sizes, then the pointers.
  const size_t pointer_1 = 34 + 3 * 4 + 8;
  const int64_t huge = std::numeric_limits<int64_t>::max() - 1;
  idx.replace(pointer_1, 8, reinterpret_cast<const char*>(&huge), 8);
  std::ofstream(Path("d.idx"), std::ios::binary | std::ios::trunc) << idx;
  EXPECT_THAT(IndexedFile::Open(Path("d")),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("sequence 1"), HasSubstr("index and data do not match"))));
}

TEST_F(DatasetTest, MismatchedPairsAndBadTokensAreNamed) {
  ASSERT_THAT(WriteIndexedFile(Path("in"), Sequences(20, 100), 100), IsOk());
  ASSERT_THAT(WriteIndexedFile(Path("tg"), Sequences(19, 100), 100), IsOk());
  EXPECT_THAT(IndexedSampleDataset::Open(Path("in"), Path("tg"), 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("has 20 samples"), HasSubstr("has 19"))));
  absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> small =
      IndexedSampleDataset::Open(Path("in"), "", 10);
  ASSERT_THAT(small, IsOk());
  std::vector<int64_t> input, target;
  EXPECT_THAT((*small)->ReadSample(5, &input, &target),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("sample 5"), HasSubstr("outside the vocabulary [0, 10)"))));
}

TEST_F(DatasetTest, JsonlReadsAndNamesBadLines) {
  std::ofstream(Path("ok.jsonl")) << R"({"input": [1, 2, 3], "target": [4]})"
                                  << "\n\n"
                                  << R"({"input": [5]})"
                                  << "\n";
  absl::StatusOr<std::unique_ptr<JsonlSampleDataset>> d =
      JsonlSampleDataset::Open(Path("ok.jsonl"), 10);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ((*d)->size(), 2u);
  EXPECT_EQ((*d)->Lengths(0), (SampleLengths{3, 1}));
  EXPECT_EQ((*d)->Lengths(1), (SampleLengths{1, 0}));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"input": [1, 2)", "ok.jsonl:2 (sample 1): not a JSON object"},
      {R"({"target": [1]})", "no \"input\" array"},
      {R"({"input": [1, -2]})", "non-negative integer"},
      {R"({"input": [1.5]})", "non-negative integer"},
      {R"({"input": [12]})", "token id 12 outside the vocabulary [0, 10)"},
      {R"({"input": "abc"})", "must be an array"},
  };
  for (const auto& [line, expected] : bad) {
    std::ofstream(Path("ok.jsonl"), std::ios::trunc) << R"({"input": [1]})"
                                                     << "\n"
                                                     << line << "\n";
    EXPECT_THAT(JsonlSampleDataset::Open(Path("ok.jsonl"), 10),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(expected)))
        << line;
  }
}

TEST(LengthsCsv, ReadsSamplesSkippingHeaderCommentsAndBlankLines) {
  absl::StatusOr<std::vector<SampleLengths>> lengths =
      ParseLengthsCsv("input_len,target_len\r\n# two samples\n\n 120 , 8\n7,0", "l.csv");
  ASSERT_THAT(lengths, IsOk());
  EXPECT_EQ(*lengths, (std::vector<SampleLengths>{{120, 8}, {7, 0}}));
}

TEST(LengthsCsv, ErrorsNameTheSourceAndLine) {
  EXPECT_THAT(ParseLengthsCsv("10,2\n20;3\n", "bad.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad.csv:2: expected 'input_len,target_len'")));
  // A header only before the first sample; lengths must fit 32 bits.
  EXPECT_THAT(ParseLengthsCsv("10,2\ninput,target\n", "l.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("l.csv:2:")));
  EXPECT_THAT(ParseLengthsCsv("4294967296,1\n", "l.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("l.csv:1:")));
  EXPECT_THAT(ParseLengthsCsv("-1,1\n", "l.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("l.csv:1:")));
  EXPECT_THAT(ParseLengthsCsv("# nothing\n", "l.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("l.csv: no samples")));
  EXPECT_THAT(ReadLengthsCsv("/nonexistent/lengths.csv"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/lengths.csv")));
}

TEST(SyntheticDataset, TokensAreDeterministicAndInVocabulary) {
  const SyntheticSampleDataset a(9, 1000, 500);
  const SyntheticSampleDataset b(9, 1000, 500);
  for (uint64_t i = 0; i < 50; ++i) {
    std::vector<int64_t> ai, at, bi, bt;
    ASSERT_THAT(a.ReadSample(i, &ai, &at), IsOk());
    ASSERT_THAT(b.ReadSample(i, &bi, &bt), IsOk());
    EXPECT_EQ(ai, bi);
    EXPECT_EQ(at, bt);
    EXPECT_EQ(ai.size(), a.Lengths(i).input);
    for (int64_t t : ai) EXPECT_TRUE(t >= 1 && t < 500);
  }
}

TEST(Sampler, MiniBatchesAreDeterministicMaximalAndWithinBudget) {
  std::mt19937 rng(
      varipipe::testing::TestSeed("Sampler.MiniBatchesAreDeterministicMaximalAndWithinBudget"));
  std::vector<SampleLengths> lengths(3000);
  for (auto& l : lengths)
    l = {static_cast<uint32_t>(1 + rng() % 3000), static_cast<uint32_t>(rng() % 200)};
  const SamplerOptions options{.seed = 11,
                               .tokens_per_global_batch = 16384,
                               .encoder_decoder = false,
                               .max_input_len = 2048};
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> s = MiniBatchSampler::Create(lengths, options);
  ASSERT_THAT(s, IsOk());
  const uint64_t per_epoch = (*s)->MiniBatchesInEpoch(0);
  ASSERT_GT(per_epoch, 10u);
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < per_epoch; ++i) {
    const SampledMiniBatch mb = (*s)->Get(i);
    EXPECT_EQ(mb.epoch, 0u);
    uint64_t tokens = 0;
    for (size_t k = 0; k < mb.sample_ids.size(); ++k) {
      EXPECT_TRUE(seen.insert(mb.sample_ids[k]).second) << "sample twice in one epoch";
      EXPECT_EQ(mb.lengths[k], (*s)->Truncate(lengths[mb.sample_ids[k]]));
      EXPECT_LE(mb.lengths[k].input + mb.lengths[k].target, 2048u);
      tokens += mb.lengths[k].input + mb.lengths[k].target;
    }
    EXPECT_LE(tokens, 16384u);
    // Maximal: the first sample of the next mini-batch would not have fit.
    if (i + 1 < per_epoch) {
      const SampledMiniBatch next = (*s)->Get(i + 1);
      EXPECT_GT(tokens + next.lengths[0].input + next.lengths[0].target, 16384u);
    }
  }
  // The next iteration starts epoch 1 with another order; a fresh sampler
  // computes any iteration on its own.
  const SampledMiniBatch first_of_epoch1 = (*s)->Get(per_epoch);
  EXPECT_EQ(first_of_epoch1.epoch, 1u);
  EXPECT_NE(first_of_epoch1.sample_ids, (*s)->Get(0).sample_ids);
  absl::StatusOr<std::unique_ptr<MiniBatchSampler>> fresh =
      MiniBatchSampler::Create(lengths, options);
  ASSERT_THAT(fresh, IsOk());
  for (uint64_t i : {per_epoch + 3, uint64_t{5}, 3 * per_epoch}) {
    EXPECT_EQ((*fresh)->Get(i).sample_ids, (*s)->Get(i).sample_ids) << "iteration " << i;
  }
}

TEST(Sampler, RejectsDatasetsThatFillNoMiniBatch) {
  EXPECT_THAT(MiniBatchSampler::Create({}, {.tokens_per_global_batch = 10, .max_input_len = 5}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no samples")));
  EXPECT_THAT(
      MiniBatchSampler::Create({{2, 0}}, {.tokens_per_global_batch = 10, .max_input_len = 5}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("do not fill one mini-batch")));
}

// A small GPT job whose `data` section holds `data` and its batch fields.
absl::StatusOr<v1::JobConfig> ConfigWithData(const std::string& data) {
  return ParseJobConfigJson(
      absl::StrCat(R"({"job_id": "x", "model": {"kind": "GPT", "num_layers": 2, "hidden_size": 64,
          "num_attention_heads": 2, "vocab_size": 1000},
          "cluster": {"device_memory_limit_mib": 1024},
          "data": {)",
                   data, R"(, "tokens_per_global_batch": 4096, "max_sequence_length": 512},
          "training": {"iterations": 1}})"),
      "t");
}

TEST_F(DatasetTest, OpensEveryFormatFromAConfig) {
  ASSERT_THAT(WriteIndexedFile(Path("in"), Sequences(20, 100), 1000), IsOk());
  std::ofstream(Path("d.jsonl")) << R"({"input": [1, 2], "target": [3]})"
                                 << "\n";
  for (const std::string& data :
       {std::string(R"("format": "SYNTHETIC")"),
        absl::StrCat(R"("format": "JSONL", "path": ")", Path("d.jsonl"), "\""),
        absl::StrCat(R"("format": "MEGATRON_INDEXED", "path": ")", Path("in"), "\"")}) {
    absl::StatusOr<v1::JobConfig> config = ConfigWithData(data);
    ASSERT_THAT(config, IsOk());
    ApplyJobConfigDefaults(*config);
    absl::StatusOr<std::unique_ptr<SampleDataset>> d = OpenSampleDataset(*config);
    ASSERT_THAT(d, IsOk()) << data;
    EXPECT_GT((*d)->size(), 0u);
  }
}

// A config whose files are missing fails naming the field and the path it
// looked at (LoadJobConfigFile makes it absolute).
TEST_F(DatasetTest, MissingFilesAreNamedWithTheirField) {
  ASSERT_THAT(WriteIndexedFile(Path("in"), Sequences(20, 100), 1000), IsOk());
  ASSERT_THAT(WriteIndexedFile(Path("short"), Sequences(19, 100), 1000), IsOk());
  const auto open = [](const std::string& data) {
    absl::StatusOr<v1::JobConfig> config = ConfigWithData(data);
    EXPECT_THAT(config, IsOk());
    ApplyJobConfigDefaults(*config);
    return OpenSampleDataset(*config).status();
  };
  EXPECT_THAT(open(absl::StrCat(R"("format": "JSONL", "path": ")", Path("missing.jsonl"), "\"")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("data.path: open ", Path("missing.jsonl")))));
  EXPECT_THAT(
      open(absl::StrCat(R"("format": "MEGATRON_INDEXED", "path": ")", Path("missing"), "\"")),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr(absl::StrCat("data.path: open ", Path("missing.idx")))));
  EXPECT_THAT(open(absl::StrCat(R"("format": "MEGATRON_INDEXED", "path": ")", Path("in"),
                                R"(", "target_path": ")", Path("missing"), "\"")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("data.target_path: open ", Path("missing.idx")))));
  EXPECT_THAT(open(absl::StrCat(R"("format": "MEGATRON_INDEXED", "path": ")", Path("in"),
                                R"(", "target_path": ")", Path("short"), "\"")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("data.target_path: "), HasSubstr("has 19"))));
}

}  // namespace
}  // namespace varipipe
