// Text in: SentencePieceTokenizer against Debian's spm_encode (another
// process, the same library) on models spm_train trains here, the BOS/EOS
// rules of each family through varipipe-convert-jsonl, and the refusals
// (tokenizers SentencePiece cannot read, bad lines, a short vocabulary),
// each with the message it prints.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dataset/indexed_dataset.h"
#include "common/dataset/loss_tokens.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"
#include "common/tokenizer/text_sample_encoder.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/executor_ranks.h"
#include "tests/testing/seed.h"
#include "tests/testing/status_matchers.h"

namespace varipipe {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;
using ::varipipe::testing::Bin;
using ::varipipe::testing::CommandResult;
using ::varipipe::testing::FreshDirectory;
using ::varipipe::testing::IsOk;
using ::varipipe::testing::RunCommand;
using ::varipipe::testing::StatusIs;

const std::vector<std::string> kWords = {
    "the",       "quick",    "brown",  "fox",       "jumps",    "over",   "lazy",  "dog",
    "translate", "english",  "german", "summarize", "question", "answer", "river", "bank",
    "money",     "schnelle", "Fuchs",  "über",      "naïve",    "café",   "42",    "3.14"};

std::string RandomSentence(std::mt19937& rng) {
  std::uniform_int_distribution<size_t> word(0, kWords.size() - 1);
  std::uniform_int_distribution<int> count(1, 12);
  std::vector<std::string> words;
  for (int n = count(rng); n > 0; --n) words.push_back(kWords[word(rng)]);
  return absl::StrJoin(words, " ");
}

std::string Quoted(const std::string& text) {
  google::protobuf::Value v;
  v.set_string_value(text);
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(v, &json).ok());
  return json;
}

// Two tiny models trained once: Llama 2's special ids (unk 0, bos 1,
// eos 2, no pad; BPE) and T5's (pad 0, eos 1, unk 2, no bos; unigram).
class TextTokenization : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(FreshDirectory("text-tokenization"));
    setenv("VARIPIPE_SENTENCEPIECE_MODULE",
           absl::StrCat(VARIPIPE_BINARY_DIR, "/bin/libvaripipe_sentencepiece.so").c_str(), 1);
    std::mt19937 rng(7);
    {
      std::ofstream corpus(*dir_ / "corpus.txt");
      for (int i = 0; i < 500; ++i) corpus << RandomSentence(rng) << "\n";
    }
    for (const auto& [name, flags] :
         {std::pair<std::string, std::string>{
              "llama",
              "--model_type=bpe --vocab_size=120 --unk_id=0 --bos_id=1 --eos_id=2 "
              "--pad_id=-1"},
          {"t5",
           "--model_type=unigram --vocab_size=48 --pad_id=0 --eos_id=1 --unk_id=2 "
           "--bos_id=-1"}}) {
      const CommandResult trained = RunCommand(absl::StrCat(
          "cd '", dir_->string(), "' && spm_train --input=corpus.txt --model_prefix=", name, " ",
          flags, " --character_coverage=1.0"));
      ASSERT_EQ(trained.exit_code, 0) << "spm_train (Debian's sentencepiece package, "
                                         "deploy/install-deps.sh) failed:\n"
                                      << trained.output;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static std::string Model(const std::string& name) { return (*dir_ / (name + ".model")).string(); }

  // spm_encode's ids for each line of `lines` (one process, one line each).
  static std::vector<std::vector<int64_t>> SpmEncode(const std::string& model,
                                                     const std::vector<std::string>& lines) {
    {
      std::ofstream text(*dir_ / "lines.txt");
      for (const std::string& line : lines) text << line << "\n";
    }
    const CommandResult encoded =
        RunCommand(absl::StrCat("spm_encode --model='", model, "' --output_format=id < '",
                                (*dir_ / "lines.txt").string(), "'"));
    EXPECT_EQ(encoded.exit_code, 0) << encoded.output;
    std::vector<std::vector<int64_t>> out;
    for (absl::string_view line : absl::StrSplit(encoded.output, '\n', absl::SkipEmpty())) {
      std::vector<int64_t> ids;
      for (absl::string_view id : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        int64_t v = 0;
        EXPECT_TRUE(absl::SimpleAtoi(id, &v)) << line;
        ids.push_back(v);
      }
      out.push_back(std::move(ids));
    }
    return out;
  }

  static CommandResult Convert(const std::string& jsonl, const std::string& flags) {
    { std::ofstream(*dir_ / "data.jsonl") << jsonl; }
    return RunCommand(absl::StrCat(Bin("varipipe-convert-jsonl"), " --input '",
                                   (*dir_ / "data.jsonl").string(), "' --output_prefix '",
                                   (*dir_ / "out" / "data").string(), "' ", flags));
  }

  static std::unique_ptr<IndexedSampleDataset> Output() {
    absl::StatusOr<std::unique_ptr<IndexedSampleDataset>> d = IndexedSampleDataset::Open(
        (*dir_ / "out" / "data_input").string(), (*dir_ / "out" / "data_target").string(), 0);
    EXPECT_THAT(d, IsOk());
    return d.ok() ? std::move(*d) : nullptr;
  }

  static std::filesystem::path* dir_;
};

std::filesystem::path* TextTokenization::dir_ = nullptr;

TEST_F(TextTokenization, EncodesLikeSpmEncodeWithTheModelsSpecialIds) {
  std::mt19937 rng(::varipipe::testing::TestSeed("EncodesLikeSpmEncode"));
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) lines.push_back(RandomSentence(rng));
  lines.push_back("words the corpus never had: zebra ∑ 日本");
  for (const std::string name : {"llama", "t5"}) {
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tokenizer =
        SentencePieceTokenizer::Open(Model(name));
    ASSERT_THAT(tokenizer, IsOk());
    const std::vector<std::vector<int64_t>> expected = SpmEncode(Model(name), lines);
    ASSERT_EQ(expected.size(), lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      std::vector<int64_t> ids;
      ASSERT_THAT((*tokenizer)->Encode(lines[i], &ids), IsOk());
      EXPECT_THAT(ids, ElementsAreArray(expected[i])) << name << ": " << lines[i];
    }
    // The process's own protobuf keeps working beside the module's copy.
    google::protobuf::Struct parsed;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(R"({"a": [1, "b"]})", &parsed).ok());
    EXPECT_EQ(parsed.fields().at("a").list_value().values(1).string_value(), "b");
  }
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> llama =
      SentencePieceTokenizer::Open(Model("llama"));
  ASSERT_THAT(llama, IsOk());
  EXPECT_EQ((*llama)->piece_size(), 120);
  EXPECT_EQ((*llama)->unk_id(), 0);
  EXPECT_EQ((*llama)->bos_id(), 1);
  EXPECT_EQ((*llama)->eos_id(), 2);
  EXPECT_EQ((*llama)->pad_id(), -1);
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t5 =
      SentencePieceTokenizer::Open(Model("t5"));
  ASSERT_THAT(t5, IsOk());
  EXPECT_EQ((*t5)->pad_id(), 0);
  EXPECT_EQ((*t5)->eos_id(), 1);
  EXPECT_EQ((*t5)->unk_id(), 2);
  EXPECT_EQ((*t5)->bos_id(), -1);
  // "auto" picks the family from the BOS token.
  EXPECT_EQ(*ParseTextFamily("auto", **llama), TextFamily::kLlama);
  EXPECT_EQ(*ParseTextFamily("auto", **t5), TextFamily::kT5);
  EXPECT_THAT(ParseTextFamily("gpt2", **t5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"gpt2\"")));
  EXPECT_THAT(TextSampleEncoder::Create(t5->get(), TextFamily::kLlama, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has no BOS token")));
}

TEST_F(TextTokenization, LlamaRulesBosBeforeThePromptEosAfterTheResponse) {
  std::mt19937 rng(::varipipe::testing::TestSeed("LlamaRules"));
  std::vector<std::string> prompts, responses;
  std::string jsonl;
  for (int i = 0; i < 20; ++i) {
    prompts.push_back(RandomSentence(rng));
    responses.push_back(RandomSentence(rng));
    absl::StrAppend(&jsonl, "{\"prompt\": ", Quoted(prompts.back()),
                    ", \"response\": ", Quoted(responses.back()), "}\n");
    if (i == 10) jsonl += "\n";  // blank lines are skipped
  }
  const std::string document = "the quick brown fox jumps over the lazy dog";
  absl::StrAppend(&jsonl, "{\"text\": ", Quoted(document), ", \"source\": \"web\"}\n");
  const CommandResult result =
      Convert(jsonl, absl::StrCat("--tokenizer '", Model("llama"), "' --progress_interval_s 0"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("llama rules (chosen by --family auto: "));
  EXPECT_THAT(result.output, HasSubstr("tokenized 21 samples"));  // progress after every line
  EXPECT_THAT(result.output, HasSubstr("converted 21 samples"));
  EXPECT_THAT(result.output, HasSubstr("\"vocab_size\": 120 or more"));

  const std::vector<std::vector<int64_t>> prompt_ids = SpmEncode(Model("llama"), prompts);
  const std::vector<std::vector<int64_t>> response_ids = SpmEncode(Model("llama"), responses);
  const std::vector<std::vector<int64_t>> document_ids = SpmEncode(Model("llama"), {document});
  std::unique_ptr<IndexedSampleDataset> out = Output();
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->size(), 21u);
  for (size_t i = 0; i < 20; ++i) {
    std::vector<int64_t> input, target;
    ASSERT_THAT(out->ReadSample(i, &input, &target), IsOk());
    std::vector<int64_t> want_input = {1};
    want_input.insert(want_input.end(), prompt_ids[i].begin(), prompt_ids[i].end());
    std::vector<int64_t> want_target = response_ids[i];
    want_target.push_back(2);
    EXPECT_EQ(input, want_input) << "sample " << i;
    EXPECT_EQ(target, want_target) << "sample " << i;
    // The loss covers the response and its EOS, none of the prompt.
    const LossSpan span = LossTokenSpan(out->Lengths(i), /*encoder_decoder=*/false);
    EXPECT_EQ(span.begin, input.size());
    EXPECT_EQ(span.size(), target.size());
  }
  std::vector<int64_t> input, target;
  ASSERT_THAT(out->ReadSample(20, &input, &target), IsOk());
  std::vector<int64_t> want = {1};
  want.insert(want.end(), document_ids[0].begin(), document_ids[0].end());
  want.push_back(2);
  EXPECT_EQ(input, want);
  EXPECT_TRUE(target.empty());
  // A document's loss covers every next token.
  EXPECT_EQ(LossTokens(out->Lengths(20), false), input.size() - 1);
}

TEST_F(TextTokenization, T5RulesEosAfterBothAndNoDocuments) {
  const std::string prompt = "translate english german: the quick fox";
  const std::string response = "der schnelle Fuchs";
  const std::string field_prompt = "the dog\nover two lines";  // JSON escapes survive
  const CommandResult result =
      Convert(absl::StrCat("{\"question\": ", Quoted(prompt), ", \"answer\": ", Quoted(response),
                           "}\n{\"question\": ", Quoted(field_prompt), ", \"answer\": \"\"}\n"),
              absl::StrCat("--tokenizer '", Model("t5"),
                           "' --prompt_field question --response_field answer"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("t5 rules"));
  const std::vector<std::vector<int64_t>> ids = SpmEncode(Model("t5"), {prompt, response});
  std::unique_ptr<IndexedSampleDataset> out = Output();
  ASSERT_NE(out, nullptr);
  std::vector<int64_t> input, target;
  ASSERT_THAT(out->ReadSample(0, &input, &target), IsOk());
  std::vector<int64_t> want_input = ids[0], want_target = ids[1];
  want_input.push_back(1);
  want_target.push_back(1);
  EXPECT_EQ(input, want_input);
  EXPECT_EQ(target, want_target);
  EXPECT_EQ(LossTokens(out->Lengths(0), /*encoder_decoder=*/true), target.size());
  // An empty response still teaches the model to stop.
  ASSERT_THAT(out->ReadSample(1, &input, &target), IsOk());
  EXPECT_EQ(target, std::vector<int64_t>{1});
  EXPECT_EQ(input.back(), 1);

  // Documents have no target, which an encoder-decoder trains on; nothing
  // is left behind by the failed run.
  std::filesystem::remove_all(*dir_ / "out");
  const CommandResult refused =
      Convert("{\"prompt\": \"a\", \"response\": \"b\"}\n{\"text\": \"the dog\"}\n",
              absl::StrCat("--tokenizer '", Model("t5"), "'"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("data.jsonl:2 (sample 1): a \"text\" line has no target"));
  EXPECT_TRUE(std::filesystem::is_empty(*dir_ / "out"));
}

TEST_F(TextTokenization, RefusesTokenizersSentencePieceCannotRead) {
  const std::filesystem::path tiktoken = *dir_ / "llama3-tokenizer.model";
  std::ofstream(tiktoken) << "IQ== 0\nIg== 1\nIw== 2\n";
  const std::filesystem::path json = *dir_ / "tokenizer.json";
  std::ofstream(json) << "\n  {\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n";
  const std::filesystem::path garbage = *dir_ / "garbage.model";
  std::ofstream(garbage) << std::string("\x0a\xff\xff\xff\x0f garbage", 13);
  const std::string line = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  for (const auto& [file, message] :
       {std::pair<std::filesystem::path, std::string>{
            tiktoken, "llama3-tokenizer.model is a tiktoken BPE vocabulary"},
        {json, "tokenizer.json is a Hugging Face tokenizers JSON file"},
        {garbage, "garbage.model: not a SentencePiece model"},
        {*dir_ / "missing.model", "missing.model: No such file"}}) {
    const CommandResult result = Convert(line, absl::StrCat("--tokenizer '", file.string(), "'"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_THAT(result.output, HasSubstr(message));
  }
  EXPECT_THAT(
      SentencePieceTokenizer::Open(tiktoken.string()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("which SentencePiece cannot read")));
}

TEST_F(TextTokenization, BadLinesNameTheFileLineAndField) {
  const std::string tokenizer = absl::StrCat("--tokenizer '", Model("llama"), "'");
  const std::string good = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"not json\n", "data.jsonl:2 (sample 1): not a JSON object"},
           {"[1, 2]\n", "data.jsonl:2 (sample 1): not a JSON object"},
           {"{\"prompt\": 5, \"response\": \"b\"}\n", "\"prompt\" must be a string, not number"},
           {"{\"prompt\": \"a\"}\n", "\"prompt\" without \"response\""},
           {"{\"response\": \"a\"}\n", "\"response\" without \"prompt\""},
           {"{\"prompt\": \"a\", \"response\": \"b\", \"text\": \"c\"}\n", "choose one"},
           {"{\"input\": [1, 2]}\n", "token-id lines are converted without --tokenizer"},
           {"{}\n", "no \"prompt\"/\"response\" pair and no \"text\" field"}}) {
    const CommandResult result = Convert(good + bad, tokenizer);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_THAT(result.output, HasSubstr(message)) << bad;
    EXPECT_THAT(result.output, HasSubstr("data.jsonl:2")) << bad;
  }
  const CommandResult empty = Convert("\n\n", tokenizer);
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.output, HasSubstr("data.jsonl: no samples"));
}

TEST_F(TextTokenization, VocabularySizeChoosesTheTokenWidthAndMustHoldEveryPiece) {
  const std::string line = "{\"prompt\": \"the fox\", \"response\": \"the dog\"}\n";
  const CommandResult small =
      Convert(line, absl::StrCat("--tokenizer '", Model("llama"), "' --vocab_size 100"));
  EXPECT_EQ(small.exit_code, 2);
  EXPECT_THAT(small.output, HasSubstr("--vocab_size 100 is below the 120 pieces of"));
  const CommandResult large =
      Convert(line, absl::StrCat("--tokenizer '", Model("llama"), "' --vocab_size 128256"));
  ASSERT_EQ(large.exit_code, 0) << large.output;
  EXPECT_THAT(large.output, HasSubstr("(int32 tokens)"));
  absl::StatusOr<std::unique_ptr<IndexedFile>> file =
      IndexedFile::Open((*dir_ / "out" / "data_input").string());
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ((*file)->element_size(), 4);
  const CommandResult fits = Convert(line, absl::StrCat("--tokenizer '", Model("llama"), "'"));
  ASSERT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_THAT(fits.output, HasSubstr("(uint16 tokens)"));
}

// --family auto switching to T5's rules says why, on one line, and how to
// get the other family; an explicit --family names itself.
TEST_F(TextTokenization, FamilyAutoSaysWhyInOneLine) {
  const std::string line = "{\"prompt\": \"the fox\", \"response\": \"the dog\"}\n";
  const CommandResult t5 = Convert(line, absl::StrCat("--tokenizer '", Model("t5"), "'"));
  ASSERT_EQ(t5.exit_code, 0) << t5.output;
  const std::string why = absl::StrCat("t5 rules (chosen by --family auto: ", Model("t5"),
                                       " has no BOS token");
  const size_t at = t5.output.find(why);
  ASSERT_NE(at, std::string::npos) << t5.output;
  const std::string said = t5.output.substr(at, t5.output.find('\n', at) - at);
  EXPECT_THAT(said, HasSubstr("spm_train --bos_id=-1")) << said;
  EXPECT_THAT(said, HasSubstr("--family llama for a decoder-only model")) << said;
  EXPECT_THAT(t5.output, HasSubstr("[warning]")) << t5.output;
  const CommandResult llama = Convert(line, absl::StrCat("--tokenizer '", Model("llama"), "'"));
  ASSERT_EQ(llama.exit_code, 0) << llama.output;
  EXPECT_THAT(llama.output, HasSubstr(absl::StrCat("llama rules (chosen by --family auto: ",
                                                   Model("llama"), " has a BOS token, id 1)")));
  const CommandResult chosen =
      Convert(line, absl::StrCat("--tokenizer '", Model("t5"), "' --family t5"));
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_THAT(chosen.output, HasSubstr("t5 rules (--family t5): no BOS"));
  EXPECT_THAT(chosen.output, Not(HasSubstr("chosen by --family auto")));
}

}  // namespace
}  // namespace varipipe
