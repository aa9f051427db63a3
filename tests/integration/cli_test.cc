// The binaries as users run them: --help, exit codes, and error messages that
// name the file and field.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/dataset/indexed_dataset.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "varipipe/v1/plan.pb.h"

namespace varipipe {
namespace {

using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::Config;
using ::varipipe::testing::RunCommand;

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class BinaryHelp : public ::testing::TestWithParam<std::string> {};

TEST_P(BinaryHelp, PrintsUsageAndExitsZero) {
  const CommandResult result = RunCommand(Bin(GetParam()) + " --help");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("Usage"), HasSubstr("--config"),
                                   HasSubstr("--log_level"), Not(HasSubstr("--flagfile"))));
}

TEST_P(BinaryHelp, VersionExitsZero) {
  const CommandResult result = RunCommand(Bin(GetParam()) + " --version");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr(GetParam()));
}

TEST_P(BinaryHelp, MissingConfigIsAUsageError) {
  const CommandResult result = RunCommand(Bin(GetParam()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("--config is required"));
}

TEST_P(BinaryHelp, UnknownFlagIsNamed) {
  const CommandResult result = RunCommand(Bin(GetParam()) + " --no_such_flag=1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.output, HasSubstr("no_such_flag"));
}

TEST_P(BinaryHelp, BadLogLevelIsNamed) {
  const CommandResult result = RunCommand(Bin(GetParam()) + " --log_level=loud");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("--log_level: unknown level 'loud'"));
}

INSTANTIATE_TEST_SUITE_P(Binaries, BinaryHelp,
                         ::testing::Values("varipipe-plan", "varipipe-planner", "varipipe-evaluate"
#ifdef VARIPIPE_HAVE_EXECUTOR
                                           ,
                                           "varipipe-executor", "varipipe-export-hf"
#endif
                                           ));

TEST(VaripipePlan, PlansTheQuickstartJob) {
  const CommandResult result = RunCommand(Bin("varipipe-plan") + " --config " +
                                          Config("quickstart-gpt.json") + " --iterations 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("job quickstart-gpt"), HasSubstr("summary: 2 mini-batches")));
}

TEST(VaripipePlan, SameIterationSamePlanFromAnyStart) {
  const CommandResult all = RunCommand(Bin("varipipe-plan") + " --config " +
                                       Config("quickstart-gpt.json") + " --iterations 3");
  const CommandResult third =
      RunCommand(Bin("varipipe-plan") + " --config " + Config("quickstart-gpt.json") +
                 " --iterations 1 --first_iteration 2");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  ASSERT_EQ(third.exit_code, 0) << third.output;
  // The row of iteration 2 is identical in both runs, but for its last column
  // (the planning time).
  const auto row_of = [](const std::string& output) {
    const size_t begin = output.find("\n2 ");
    if (begin == std::string::npos) return std::string();
    std::string row = output.substr(begin, output.find('\n', begin + 1) - begin);
    return row.substr(0, row.find_last_not_of(" 0123456789.") + 1);
  };
  EXPECT_FALSE(row_of(all.output).empty()) << all.output;
  EXPECT_EQ(row_of(all.output), row_of(third.output));
}

TEST(VaripipePlan, InvalidConfigNamesFileAndField) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / absl::StrCat("varipipe-cli-", getpid(), ".json");
  std::ofstream(path) << R"({"job_id": "x", "model": {"kind": "GPT", "num_layers": 2,
      "hidden_size": 64, "num_attention_heads": 3, "vocab_size": 10},
      "cluster": {"device_memory_limit_mib": 1024},
      "data": {"format": "SYNTHETIC", "tokens_per_global_batch": 4096,
               "max_sequence_length": 512},
      "training": {"iterations": 1}})";
  const CommandResult result = RunCommand(Bin("varipipe-plan") + " --config " + path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr(path.string()), HasSubstr("model.hidden_size: must be divisible")));
}

class VaripipePlanFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("varipipe-plan-cli-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(VaripipePlanFiles, LengthsJsonPlansAndTrace) {
  {
    std::ofstream csv(dir_ / "lengths.csv");
    csv << "input_len,target_len\n# comment\n";
    for (int i = 0; i < 200; ++i) csv << 20 + (i * 37) % 900 << "," << 1 + i % 30 << "\n";
  }
  const CommandResult result =
      RunCommand(Bin("varipipe-plan") + " --config " + Config("quickstart-gpt.json") +
                 " --lengths " + (dir_ / "lengths.csv").string() +
                 " --iterations 2 --json --emit-plans " + (dir_ / "plans").string() + " --trace " +
                 (dir_ / "trace.json").string() + " --log_level=warn");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // One JSON report per line.
  int reports = 0;
  for (absl::string_view line : absl::StrSplit(result.output, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct report;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(std::string(line), &report).ok())
        << line;
    EXPECT_TRUE(report.fields().contains("micro_batch_list"));
    ++reports;
  }
  EXPECT_EQ(reports, 2);
  // Four ranks' plans per iteration, readable as ExecutionPlan JSON.
  for (int iteration = 0; iteration < 2; ++iteration) {
    for (int rank = 0; rank < 4; ++rank) {
      const std::filesystem::path file = dir_ / "plans" /
                                         absl::StrFormat("iteration_%06d", iteration) /
                                         absl::StrFormat("rank_%05d.json", rank);
      std::ifstream in(file);
      ASSERT_TRUE(in) << file;
      std::stringstream text;
      text << in.rdbuf();
      v1::ExecutionPlan plan;
      ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &plan).ok()) << file;
      EXPECT_EQ(plan.rank(), rank);
      EXPECT_EQ(plan.iteration(), static_cast<uint64_t>(iteration));
      EXPECT_GT(plan.instructions_size(), 0);
    }
  }
  std::ifstream trace(dir_ / "trace.json");
  std::stringstream text;
  text << trace.rdbuf();
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &parsed).ok());
}

TEST_F(VaripipePlanFiles, MalformedLengthsNameFileAndLine) {
  std::ofstream(dir_ / "bad.csv") << "10,2\n20;3\n";
  const CommandResult result =
      RunCommand(Bin("varipipe-plan") + " --config " + Config("quickstart-gpt.json") +
                 " --lengths " + (dir_ / "bad.csv").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("bad.csv:2: expected 'input_len,target_len'"));
}

TEST_F(VaripipePlanFiles, ConvertJsonlToIndexed) {
  std::ofstream(dir_ / "d.jsonl") << R"({"input": [5, 6, 7], "target": [8]})"
                                  << "\n"
                                  << R"({"input": [9], "target": [10, 11]})"
                                  << "\n";
  const std::string prefix = (dir_ / "out").string();
  const CommandResult result =
      RunCommand(Bin("varipipe-convert-jsonl") + " --input " + (dir_ / "d.jsonl").string() +
                 " --output-prefix " + prefix + " --vocab-size 100");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("converted 2 samples"));
  absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> d =
      IndexedSampleDataset::Open(prefix + "_input", prefix + "_target", 100);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<int64_t> input, target;
  ASSERT_TRUE((*d)->ReadSample(1, &input, &target).ok());
  EXPECT_EQ(input, std::vector<int64_t>{9});
  EXPECT_EQ(target, (std::vector<int64_t>{10, 11}));
  // Bad input names the file and line.
  std::ofstream(dir_ / "bad.jsonl") << R"({"input": [5]})"
                                    << "\n"
                                    << R"({"input": [500]})"
                                    << "\n";
  const CommandResult bad =
      RunCommand(Bin("varipipe-convert-jsonl") + " --input " + (dir_ / "bad.jsonl").string() +
                 " --output-prefix " + prefix + " --vocab-size 100");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("bad.jsonl:2 (sample 1)"));
  EXPECT_EQ(RunCommand(Bin("varipipe-convert-jsonl") + " --help").exit_code, 0);
}

TEST(VaripipePlanner, CheckConfigPrintsDefaults) {
  const CommandResult result =
      RunCommand(Bin("varipipe-planner") + " --check_config --config " + Config("t5-11b-pp8.json"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("\"job_id\": \"t5-11b-flan\""), HasSubstr("\"plan_ahead\": 8")));
}

#ifdef VARIPIPE_HAVE_EXECUTOR
TEST(VaripipeExecutor, TorchrunEnvironmentGivesCoordinates) {
  const CommandResult result =
      RunCommand("RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 " + Bin("varipipe-executor") +
                 " --check_launch --config " + Config("quickstart-gpt.json"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("rank 3 of 4 (launcher torchrun, local rank 1) = dp 1 pp 1"),
                    HasSubstr("LibTorch")));
}

TEST(VaripipeExecutor, WrongWorldSizeIsExplained) {
  const CommandResult result =
      RunCommand("RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 " + Bin("varipipe-executor") +
                 " --check_launch --config " + Config("quickstart-gpt.json"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("started 3 process(es) but job quickstart-gpt needs"));
}
#endif

}  // namespace
}  // namespace varipipe

namespace varipipe {
namespace {

// GPT-6.7B on pp = 4 with 8 rows per packed micro-batch (fixed by the
// config) and the explicit attention kernel does not fit 40 GiB at 2,048
// tokens: --compare prints the cell and why instead of leaving it out.
TEST(PlanCompare, PrintsInfeasibleCellsWithTheirReason) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("compare-", getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "lengths.csv");
    out << "input_len,target_len\n";
    for (int i = 0; i < 600; ++i) out << 200 + (i * 7919) % 1800 << "," << 10 + i % 30 << "\n";
  }
  {
    std::ifstream in(Config("gpt-6.7b-pp4.json"));
    std::stringstream text;
    text << in.rdbuf();
    std::string config = text.str();
    const size_t planner = config.find("\"planner\": {");
    ASSERT_NE(planner, std::string::npos);
    config.insert(planner + 12, " \"fixed_micro_batch_size\": 8,");
    const size_t fused = config.find("\"FUSED\"");
    ASSERT_NE(fused, std::string::npos);
    config.replace(fused, 7, "\"EXPLICIT\"");
    std::ofstream(dir / "job.json") << config;
  }
  const CommandResult r = RunCommand(
      absl::StrCat(Bin("varipipe-plan"), " --config ", (dir / "job.json").string(), " --lengths ",
                   (dir / "lengths.csv").string(), " --iterations 1 --compare"));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Padding rows of 8 do not fit (since the bf16 copy of the weights counts
  // in each device's static memory, not even one micro-batch under full
  // recomputation; with the longest samples alone under their own mode, the
  // pipeline's peak): the cell names the mode and what does not fit, with
  // its need and the limit.
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex(
                  "padding +zero_bubble_h1 +- +infeasible +iteration 0: full: "
                  "(micro-batching: micro-batch [0-9]+ \\(8 rows x [0-9]+ tokens\\) "
                  "needs [0-9.]+ MiB stored / [0-9.]+ MiB peak, limits [0-9.]+ / [0-9.]+ MiB|"
                  "memory: simulated peak [0-9.]+ MiB on rank [0-9]+ exceeds its [0-9.]+ MiB)"));
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex("dynamic_programming +adaptive +[0-9.]+% +[0-9]+"));
}

// --search_parallelism: Llama-2-70B on 32 GPUs in nodes of 8 (context
// degree 1 only: the cell below searches context degrees). Tensor groups
// beyond a node and layouts whose model state does not fit are refused with
// their reasons; every feasible layout keeps tensor parallelism within a
// node, and they are listed fastest first.
TEST(PlanSearchParallelism, KeepsTensorGroupsInANodeAndSaysWhyLayoutsAreRefused) {
  const CommandResult r = RunCommand(absl::StrCat(
      Bin("varipipe-plan"), " --config ", Config("llama-2-70b-64gpu.json"),
      " --search_parallelism --gpus 32 --context_degrees 1 --iterations 1 --log_level=error"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("layouts of 32 GPUs for llama-2-70b"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "16 +1 +2 +1 +its tensor groups of 16 span nodes of 8 GPUs"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "1 +1 +1 +32 +mini-batch 0: .*model state alone needs [0-9.]+ GiB"));
  // The feasible rows, between the header and "refused:": tensor at most 8,
  // tokens/s falling.
  const size_t header = r.output.find("real tokens/s");
  const size_t refused = r.output.find("refused:");
  ASSERT_NE(header, std::string::npos);
  ASSERT_NE(refused, std::string::npos);
  std::istringstream rows(
      r.output.substr(r.output.find('\n', header) + 1, refused - r.output.find('\n', header) - 1));
  double previous = 1e300;
  int feasible = 0;
  for (std::string line; std::getline(rows, line);) {
    std::istringstream fields(line);
    uint32_t tensor = 0, context = 0, pipeline = 0, data = 0;
    double tokens = 0;
    ASSERT_TRUE(fields >> tensor >> context >> pipeline >> data >> tokens) << line;
    EXPECT_LE(tensor, 8u) << line;
    EXPECT_EQ(context, 1u) << line;
    EXPECT_EQ(tensor * pipeline * data, 32u) << line;
    EXPECT_LE(tokens, previous) << line;
    previous = tokens;
    ++feasible;
  }
  EXPECT_GE(feasible, 3) << r.output;
}

// A small Llama job with context parallelism on long-tail data
// (docs/datasets.md): 4 layers, h = 256, 1 GiB per device, samples up to
// 16,384 tokens, a pipeline of 2 stages with a context group of `context`.
std::filesystem::path WriteContextJob(const std::string& name, uint32_t context,
                                      uint32_t data = 1) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / absl::StrCat(name, "-", getpid(), ".json");
  std::ofstream(path) << absl::StrFormat(
      R"({"job_id": "%s", "model": {"kind": "GPT", "architecture": "LLAMA", "num_layers": 4,
      "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
      "ffn_hidden_size": 512, "vocab_size": 1024, "dtype": "BFLOAT16",
      "attention_kernel": "FUSED"},
      "parallelism": {"pipeline": 2, "data": %u, "context": %u},
      "cluster": {"devices_per_node": 8, "device_memory_limit_mib": 1024,
                  "hardware": "h100-80gb"},
      "data": {"format": "SYNTHETIC", "synthetic_mixture": "LONG_TAIL", "seed": 3,
               "synthetic_num_samples": 4000, "tokens_per_global_batch": 65536,
               "max_sequence_length": 16384},
      "training": {"iterations": 1}})",
      name, data, context);
  return path;
}

// --compare on a job with parallelism.context 2: static context
// parallelism (every micro-batch split), never splitting and the
// per-micro-batch choice, side by side, with their split counts.
TEST(PlanCompare, ContextPoliciesSideBySide) {
  const std::filesystem::path job = WriteContextJob("cp-compare", 2);
  const CommandResult r = RunCommand(absl::StrCat(Bin("varipipe-plan"), " --config ", job.string(),
                                                  " --iterations 2 --compare --log_level=error"));
  std::filesystem::remove(job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cp=2 (per-micro-batch)"));
  const size_t table = r.output.find("\ncontext parallelism (c=2");
  ASSERT_NE(table, std::string::npos) << r.output;
  const std::string rows = r.output.substr(table);
  // Static: every micro-batch split; never: none; the per-micro-batch
  // choice never behind static (its search includes splitting every one).
  const auto row = [&](const char* pattern, double* tokens, int* split, int* all) {
    std::smatch m;
    if (!std::regex_search(rows, m, std::regex(pattern))) return false;
    *tokens = std::stod(m[1].str());
    *split = std::stoi(m[2].str());
    *all = std::stoi(m[3].str());
    return true;
  };
  double tokens_always = 0, tokens_chosen = 0;
  int split_always = 0, all_always = 0, split_chosen = 0, all_chosen = 0;
  ASSERT_TRUE(row("always \\(static\\) +[0-9.]+ +([0-9]+) +([0-9]+)/([0-9]+)", &tokens_always,
                  &split_always, &all_always))
      << rows;
  EXPECT_EQ(split_always, all_always) << rows;
  ASSERT_TRUE(row("per-micro-batch +[0-9.]+ +([0-9]+) +([0-9]+)/([0-9]+)", &tokens_chosen,
                  &split_chosen, &all_chosen))
      << rows;
  EXPECT_GT(tokens_always, 0) << rows;
  EXPECT_GE(tokens_chosen, tokens_always) << rows;
  EXPECT_LE(split_chosen, all_chosen) << rows;
  EXPECT_THAT(rows, ::testing::ContainsRegex("never +([0-9.]+ +[0-9]+ +0/[0-9]+|- +infeasible)"));
  EXPECT_THAT(rows, ::testing::ContainsRegex("per-micro-batch / always: [0-9.]+x"));
}

// --ideal_context_split prices split micro-batches ideally (1/c of their
// time on one device, nothing transferred): with every micro-batch split,
// each iteration predicts faster than with the real split costs; a job
// without context parallelism is refused, naming the flag.
TEST(PlanIdealContextSplit, BoundsTheRealSplitsAndNeedsAContextGroup) {
  // Every micro-batch split: the job with context_split ALWAYS.
  const std::filesystem::path job = WriteContextJob("cp-ideal", 2);
  std::string text;
  {
    std::ifstream in(job);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(job) << std::regex_replace(text, std::regex("\"context\": 2"),
                                           "\"context\": 2, \"context_split\": \"ALWAYS\"");
  const auto predicted_ms = [&](const std::string& flags) {
    const CommandResult r =
        RunCommand(absl::StrCat(Bin("varipipe-plan"), " --config ", job.string(),
                                " --iterations 2 --json --log_level=error", flags));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::regex predicted("\"predicted_iteration_ms\": *([0-9.eE+-]+)");
    std::vector<double> ms;
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), predicted), end; it != end;
         ++it) {
      ms.push_back(std::stod((*it)[1].str()));
    }
    EXPECT_EQ(ms.size(), 2u) << r.output;
    return ms;
  };
  const std::vector<double> real = predicted_ms("");
  const std::vector<double> ideal = predicted_ms(" --ideal_context_split");
  std::filesystem::remove(job);
  ASSERT_EQ(real.size(), 2u);
  ASSERT_EQ(ideal.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_LT(ideal[i], real[i]) << "iteration " << i;

  const std::filesystem::path single = WriteContextJob("cp-ideal-1", 1);
  const CommandResult refused = RunCommand(absl::StrCat(
      Bin("varipipe-plan"), " --config ", single.string(), " --ideal_context_split 2>&1"));
  std::filesystem::remove(single);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, AllOf(HasSubstr("--ideal_context_split"),
                                    HasSubstr("parallelism.context of at least 2 (it is 1)")));
}

// --search_parallelism includes the context degree: layouts with c > 1
// planned per micro-batch, static context parallelism reported beside
// them, and context groups that would span a node refused.
TEST(PlanSearchParallelism, SearchesContextDegreesWithTheStaticAlternative) {
  const std::filesystem::path job = WriteContextJob("cp-search", 2);
  const CommandResult r = RunCommand(absl::StrCat(
      Bin("varipipe-plan"), " --config ", job.string(),
      " --search_parallelism --gpus 8 --gpus_per_node 4 --iterations 1 --log_level=error"));
  std::filesystem::remove(job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Header: tensor, context, pipeline, data.
  EXPECT_THAT(r.output, ::testing::ContainsRegex("tensor +context +pipeline +data +real tokens/s"));
  // A context group of 8 spans nodes of 4.
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "1 +8 +1 +1 +its context groups of 8 x 1 GPUs span nodes of 4"));
  // Some feasible layout with context 2 or 4 names its split micro-batches
  // and the static alternative.
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "\n +[0-9]+ +[24] +[0-9]+ +[0-9]+ +[0-9]+ .*[0-9]+ of [0-9]+ "
                            "micro-batches split; static \\(every one split\\): "));
}

// With the default search, the quickstart job's plan is the best row of its
// own comparison: no method and schedule, however tuned, is predicted
// faster on the same mini-batches.
TEST(PlanCompare, QuickstartPlanIsTheBestRow) {
  const CommandResult r =
      RunCommand(absl::StrCat(Bin("varipipe-plan"), " --config ", Config("quickstart-gpt.json"),
                              " --iterations 3 --compare --log_level=warn"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t table = r.output.find("\ncomparison");
  ASSERT_NE(table, std::string::npos) << r.output;
  double plan = -1;
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(r.output.substr(table), '\n')) {
    const std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double tokens_per_s = 0;
    if (words.empty() || !absl::SimpleAtod(words.back(), &tokens_per_s)) continue;
    if (absl::StrContains(line, "the plan (chosen per mini-batch)")) {
      plan = tokens_per_s;
      continue;
    }
    ASSERT_GT(plan, 0) << "the plan's row comes first:\n" << r.output;
    EXPECT_LE(tokens_per_s, plan) << line;
    ++rows;
  }
  // Five methods x six schedules, and packing with each attention kernel
  // alone x six schedules.
  EXPECT_EQ(rows, 42) << r.output;
  // Each iteration names every method's best candidate, the plan's marked.
  EXPECT_THAT(r.output, ::testing::ContainsRegex("\\* [a-z_]+( [a-z]+=[0-9]+)? +fastest"));
  EXPECT_THAT(r.output, HasSubstr("padding rows="));
}

// varipipe-evaluate: tuned baselines, one chosen row per method, and named
// errors.
TEST(Evaluate, TunesEveryBaselineAndMarksOneChosenSettingPerMethod) {
  const CommandResult r =
      RunCommand(absl::StrCat(Bin("varipipe-evaluate"), " --config ", Config("gpt-6.7b-pp4.json"),
                              " --max_lengths 1024 --mini_batches 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* method : {"dp", "packing", "token-based", "fixed-size", "padding"}) {
    EXPECT_THAT(r.output, ::testing::ContainsRegex(
                              absl::StrCat(",1024,40960,", method, ",[^,]+,[a-z-]+,1,1,[0-9.]+,")))
        << method;
  }
  EXPECT_THAT(r.output, HasSubstr("packing,rows=64,none,0,0,"));
  const CommandResult bad = RunCommand(absl::StrCat(
      Bin("varipipe-evaluate"), " --config ", Config("gpt-6.7b-pp4.json"), " --mixture books"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--mixture: 'books'"));
}

}  // namespace
}  // namespace varipipe
