// Parameters an executor saved with --save_parameters PREFIX
// (PREFIX.rank_NNNNN.pt, a LibTorch archive keyed by parameter name), for
// tests that compare runs.
#ifndef VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_
#define VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

namespace varipipe::testing {

inline std::map<std::string, torch::Tensor> LoadParameters(const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  std::map<std::string, torch::Tensor> parameters;
  for (const std::string& key : archive.keys()) archive.read(key, parameters[key]);
  return parameters;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SAVED_PARAMETERS_H_
