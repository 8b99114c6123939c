// Deterministic test bytes for the fabric link tests, and hex for addresses on a pipe.
//
// Both the test process and the peer process (tests/ports/fabric_peer) must produce the same
// bytes from a size and a seed, and every byte position must matter (a shifted, truncated or
// reordered chunk must not compare equal): an xorshift stream does that.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::test {

/// `size` bytes of an xorshift64 stream started from `seed`.
inline std::string fabric_pattern(std::uint64_t size, std::uint64_t seed) {
  std::string out(size, '\0');
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x >> 56);
  }
  return out;
}

inline std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

inline std::string from_hex(const std::string& hex) {
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(value(hex[i]) * 16 + value(hex[i + 1])));
  return out;
}

} // namespace troupe::test
