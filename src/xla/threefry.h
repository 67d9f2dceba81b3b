// SPDX-License-Identifier: Apache-2.0
#pragma once
// The counter-based generator of random ops on xla devices, on the host: Threefry-2x32 with 20
// rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; Random123's
// threefry2x32_20, the generator JAX uses). rules/random.cpp writes the same function as
// StableHLO integer ops, so that a graph XLA runs and one the TorchScript interpreter runs
// (lazy_random.cpp's host kernels) draw the same bits, and tests compare XLA's bits with these.
//
// Words from a generator state (key, offset), both 64-bit: element i of a draw is block
// threefry(key, offset + i), the key split into (low, high) 32-bit words and the counter too.
// A draw of n elements advances the offset by n.

#include <cstdint>
#include <utility>

namespace fulgur::xla::random {

// The rotation distances of Threefry-2x32, as Random123 defines them.
inline constexpr int kRotations[8] = {13, 15, 26, 6, 17, 29, 16, 24};
// Threefry's key schedule parity constant.
inline constexpr uint32_t kParity = 0x1BD11BDA;

inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// threefry2x32_20(key, counter).
inline std::pair<uint32_t, uint32_t> threefry2x32(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1) {
  const uint32_t ks[3] = {k0, k1, kParity ^ k0 ^ k1};
  uint32_t x0 = c0 + ks[0], x1 = c1 + ks[1];
  for (int group = 0; group < 5; ++group) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotl(x1, kRotations[(group % 2) * 4 + r]);
      x1 ^= x0;
    }
    // Key injection after each group of four rounds.
    x0 += ks[(group + 1) % 3];
    x1 += ks[(group + 2) % 3] + static_cast<uint32_t>(group + 1);
  }
  return {x0, x1};
}

// The two words of element `i` of a draw from state (key, offset).
inline std::pair<uint32_t, uint32_t> words(uint64_t key, uint64_t offset, uint64_t i) {
  const uint64_t counter = offset + i;
  return threefry2x32(static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), static_cast<uint32_t>(counter),
                      static_cast<uint32_t>(counter >> 32));
}

// A uniform number in [0, 1) from a word: its top `digits` bits (at most 24: a float32's
// significand, so the value k * 2^-digits is exact in the type it is drawn for) times 2^-digits.
inline float uniform_from_word(uint32_t w, int digits) {
  return static_cast<float>(w >> (32 - digits)) * (1.0f / static_cast<float>(1u << digits));
}

// SplitMix64's finalizer (Steele et al., 2014): a generator key from a seed and a rank, so that
// nearby seeds and ranks give unrelated keys.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t key_of(uint64_t seed, int64_t rank) {
  return mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(rank));
}

}  // namespace fulgur::xla::random
