// Seeds for randomized tests. The same commit always gives the same result:
// without VARIPIPE_TEST_SEED a test uses a fixed seed derived from its name
// (FNV-1a), so statistical assertions never flake. The seed is printed so a
// run can be repeated or varied:
//   VARIPIPE_TEST_SEED=1234 build/tests/dp_partition_test    (that seed)
//   VARIPIPE_TEST_SEED=random build/tests/dp_partition_test  (a fresh one)
// docs/development.md states the rule: no test may depend on an unseeded draw.
#ifndef VARIPIPE_TESTS_TESTING_SEED_H_
#define VARIPIPE_TESTS_TESTING_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace varipipe::testing {

// The fixed seed of `test_name`: 32-bit FNV-1a of the name.
inline uint32_t DefaultSeed(const char* test_name) {
  uint32_t hash = 2166136261u;
  for (const char* c = test_name; *c != '\0'; ++c) {
    hash = (hash ^ static_cast<unsigned char>(*c)) * 16777619u;
  }
  return hash;
}

inline uint32_t TestSeed(const char* test_name) {
  uint32_t seed = DefaultSeed(test_name);
  const char* how = "fixed";
  if (const char* text = std::getenv("VARIPIPE_TEST_SEED"); text != nullptr && *text != '\0') {
    if (std::strcmp(text, "random") == 0) {
      seed = std::random_device()();
      how = "random";
    } else {
      seed = static_cast<uint32_t>(std::strtoul(text, nullptr, 10));
      how = "from VARIPIPE_TEST_SEED";
    }
  }
  std::printf("%s: seed %u (%s; set VARIPIPE_TEST_SEED=%u to repeat)\n", test_name, seed, how,
              seed);
  return seed;
}

}  // namespace varipipe::testing

#endif  // VARIPIPE_TESTS_TESTING_SEED_H_
