// SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a bijective mix of 64 bits. The
// project's one source of hash-like spreading that must be the same on every
// machine and in every run: shuffles, synthetic data, initialization seeds.
#ifndef VARIPIPE_COMMON_MIX64_H_
#define VARIPIPE_COMMON_MIX64_H_

#include <cstdint>

namespace varipipe {

constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace varipipe

#endif  // VARIPIPE_COMMON_MIX64_H_
