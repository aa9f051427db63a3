// Seeds for randomized tests: VARIPIPE_TEST_SEED when set (to reproduce a
// failure), otherwise a fresh random one. The seed is printed so a failing
// run can be repeated:
//   VARIPIPE_TEST_SEED=1234 build/tests/dp_partition_test
#ifndef VARIPIPE_TESTS_TESTING_SEED_H_
#define VARIPIPE_TESTS_TESTING_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace varipipe::testing {

inline uint32_t TestSeed(const char* test_name) {
  uint32_t seed = 0;
  if (const char* text = std::getenv("VARIPIPE_TEST_SEED"); text != nullptr && *text != '\0') {
    seed = static_cast<uint32_t>(std::strtoul(text, nullptr, 10));
  } else {
    seed = std::random_device()();
  }
  std::printf("%s: seed %u (set VARIPIPE_TEST_SEED=%u to repeat)\n", test_name, seed, seed);
  return seed;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SEED_H_
