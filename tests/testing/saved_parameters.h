// Parameters an executor saved with --save_parameters PREFIX
// (PREFIX.rank_NNNNN.pt, a LibTorch archive keyed by parameter name), for
// tests that compare runs.
#ifndef VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_
#define VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace varipipe::testing {

inline std::map<std::string, torch::Tensor> LoadParameters(const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  std::map<std::string, torch::Tensor> parameters;
  for (const std::string& key : archive.keys()) archive.read(key, parameters[key]);
  return parameters;
}

// Expects PREFIX `params` of ranks 0..ranks-1 in `dir` to equal, bit for
// bit and name for name, the same files in `reference`. Returns how many
// tensors were compared.
inline int ExpectSameSavedParameters(const std::filesystem::path& dir,
                                     const std::filesystem::path& reference, int ranks) {
  int compared = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::string file = absl::StrFormat("params.rank_%05d.pt", r);
    const auto resumed = LoadParameters(dir / file);
    const auto straight = LoadParameters(reference / file);
    EXPECT_EQ(resumed.size(), straight.size()) << "rank " << r;
    for (const auto& [name, tensor] : straight) {
      const auto it = resumed.find(name);
      if (it == resumed.end()) {
        ADD_FAILURE() << "rank " << r << " saved no " << name;
        continue;
      }
      EXPECT_TRUE(torch::equal(it->second, tensor))
          << "rank " << r << " " << name << ": max difference "
          << (it->second - tensor).abs().max().item<double>();
      ++compared;
    }
  }
  return compared;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_
