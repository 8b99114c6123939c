// le_bytes: fixed-width little-endian integers in byte buffers, for the ports' wire formats.
//
// The block store's file header and the fabric link's request and reply headers are read by
// other processes and other machines, so their integers have one byte order whatever the
// host's. These are the readers and writers both use.
#pragma once

#include <cstdint>

namespace troupe::ports {

/// Writes `v` little-endian at `p` (4 or 8 bytes).
inline void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// Reads a little-endian integer at `p`.
inline std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

} // namespace troupe::ports
