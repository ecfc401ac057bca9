// fusebox/runtime/hash.hpp: the two hashes of the JIT cache.
//
//   sha256       FIPS 180-4 SHA-256, written from the standard (section 4.1.2 functions, 4.2.2
//                constants, 5.1.1 padding, 6.2.2 computation). It names disk cache entries and
//                checks their content before anything is loaded, so it must be a real
//                cryptographic hash, not a fast one.
//   hash64       a fast, non-cryptographic 64-bit hash for in-memory buckets. A bucket hit is
//                always confirmed by comparing the full key (STYLE.md: ArrayFire trusted a 64-bit
//                hash alone, and a collision returned the wrong kernel), so its only job is to
//                spread keys well and cheaply.
//
// Depends on: the C++20 standard library only.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace fusebox::jit {

/// Incremental SHA-256: update() any number of times, then finish() once.
class sha256 {
 public:
  using digest_type = std::array<std::uint8_t, 32>;

  sha256& update(const void* data, std::size_t size) noexcept {
    const auto* p = static_cast<const std::uint8_t*>(data);
    length_ += size;
    if (fill_ != 0) {  // complete a partial block first
      while (size != 0 && fill_ != 64) {
        block_[fill_++] = *p++;
        --size;
      }
      if (fill_ == 64) {
        compress(block_.data());
        fill_ = 0;
      }
    }
    for (; size >= 64; p += 64, size -= 64) compress(p);
    while (size != 0) {
      block_[fill_++] = *p++;
      --size;
    }
    return *this;
  }
  sha256& update(std::string_view text) noexcept { return update(text.data(), text.size()); }

  /// The digest. The object is spent afterwards (call reset() to reuse it).
  digest_type finish() noexcept {
    // 5.1.1: append bit '1', zeros up to 56 mod 64 bytes, then the length in bits, big-endian.
    const std::uint64_t bits = length_ * 8;
    block_[fill_++] = 0x80;
    if (fill_ > 56) {
      while (fill_ != 64) block_[fill_++] = 0;
      compress(block_.data());
      fill_ = 0;
    }
    while (fill_ != 56) block_[fill_++] = 0;
    for (int i = 7; i >= 0; --i) block_[fill_++] = static_cast<std::uint8_t>(bits >> (8 * i));
    compress(block_.data());
    digest_type out{};
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t b = 0; b < 4; ++b)
        out[4 * i + b] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * b));
    return out;
  }

  void reset() noexcept { *this = sha256{}; }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return std::rotr(x, n); }

  void compress(const std::uint8_t* block) noexcept {
    // 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    // 6.2.2 step 1: the message schedule.
    std::uint32_t w[64];
    for (std::size_t t = 0; t < 16; ++t)
      w[t] = std::uint32_t{block[4 * t]} << 24 | std::uint32_t{block[4 * t + 1]} << 16 |
             std::uint32_t{block[4 * t + 2]} << 8 | std::uint32_t{block[4 * t + 3]};
    for (std::size_t t = 16; t < 64; ++t) {
      const std::uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const std::uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    // Steps 2-4: 64 rounds over the working variables, then add into the hash value.
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3];
    std::uint32_t e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (std::size_t t = 0; t < 64; ++t) {
      const std::uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const std::uint32_t ch = (e & f) ^ (~e & g);
      const std::uint32_t t1 = h + big_s1 + ch + k[t] + w[t];
      const std::uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const std::uint32_t t2 = big_s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  // 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes.
  std::array<std::uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  std::size_t fill_ = 0;        // bytes waiting in block_
  std::uint64_t length_ = 0;    // message length in bytes so far
};

/// Lower-case hexadecimal of any byte sequence.
inline std::string hex(std::span<const std::uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const std::uint8_t b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

/// SHA-256 of `text` as 64 lower-case hex digits.
inline std::string sha256_hex(std::string_view text) {
  const auto digest = sha256{}.update(text).finish();
  return hex(digest);
}

namespace detail {
// Stafford's "mix13" 64-bit finaliser (the one splitmix64 uses): every input bit affects every
// output bit.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
}  // namespace detail

/// Fast 64-bit hash for in-memory lookups (not for anything an attacker can choose to collide
/// against a trust decision: confirm every hit by comparing the full key). Little-endian word
/// assembly keeps the result the same on every host and lets it run in constant evaluation.
constexpr std::uint64_t hash64(std::string_view data, std::uint64_t seed = 0) noexcept {
  constexpr std::uint64_t k1 = 0x9e3779b97f4a7c15ULL;
  constexpr std::uint64_t k2 = 0xc2b2ae3d27d4eb4fULL;
  std::uint64_t h = seed ^ (static_cast<std::uint64_t>(data.size()) * k1);
  std::size_t i = 0;
  const auto word = [&](std::size_t at, std::size_t n) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < n; ++b)
      w |= std::uint64_t{static_cast<unsigned char>(data[at + b])} << (8 * b);
    return w;
  };
  for (; i + 8 <= data.size(); i += 8) h = std::rotl(h ^ (word(i, 8) * k2), 31) * k1;
  if (i != data.size()) h = std::rotl(h ^ (word(i, data.size() - i) * k2), 31) * k1;
  return detail::mix64(h);
}

}  // namespace fusebox::jit
