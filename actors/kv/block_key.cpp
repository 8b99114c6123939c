#include "actors/kv/block_key.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

namespace troupe::actors {

namespace {

/// Flag bit in the count word that marks the content-key form.
constexpr std::uint32_t content_key_flag = 0x8000'0000u;

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

block_key hash_bytes(const std::vector<std::uint8_t>& bytes) {
  auto h = XXH3_128bits(bytes.data(), bytes.size());
  return block_key{h.high64, h.low64};
}

} // namespace

std::string to_string(const block_key& k) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                static_cast<unsigned long long>(k.lo));
  return buf;
}

block_key chain_hash(const block_key& parent, std::span<const std::uint32_t> tokens) {
  std::vector<std::uint8_t> bytes;
  bytes.reserve(20 + 4 * tokens.size());
  put_u64(bytes, parent.hi);
  put_u64(bytes, parent.lo);
  put_u32(bytes, static_cast<std::uint32_t>(tokens.size()));
  for (auto t : tokens)
    put_u32(bytes, t);
  return hash_bytes(bytes);
}

block_key chain_hash(const block_key& parent, std::uint64_t content_key,
                     std::uint32_t token_count) {
  // The same layout as the token form's helpers write, in a fixed buffer (this runs once per
  // block of every simulated prompt).
  std::uint8_t bytes[28];
  auto put = [&bytes](std::size_t at, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i)
      bytes[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
  };
  put(0, parent.hi, 8);
  put(8, parent.lo, 8);
  put(16, token_count | content_key_flag, 4);
  put(20, content_key, 8);
  auto h = XXH3_128bits(bytes, sizeof bytes);
  return block_key{h.high64, h.low64};
}

std::vector<block_key> make_chain(std::span<const std::uint32_t> tokens,
                                  const block_key& parent) {
  std::vector<block_key> chain;
  auto full = tokens.size() / block_tokens;
  chain.reserve(full);
  auto prev = parent;
  for (std::size_t i = 0; i < full; ++i) {
    prev = chain_hash(prev, tokens.subspan(i * block_tokens, block_tokens));
    chain.push_back(prev);
  }
  return chain;
}

std::vector<block_key> make_chain(std::span<const std::uint64_t> content_keys,
                                  std::uint64_t prompt_tokens, const block_key& parent) {
  auto full = std::min<std::uint64_t>(content_keys.size(), prompt_tokens / block_tokens);
  std::vector<block_key> chain;
  chain.reserve(full);
  auto prev = parent;
  for (std::size_t i = 0; i < full; ++i) {
    prev = chain_hash(prev, content_keys[i], block_tokens);
    chain.push_back(prev);
  }
  return chain;
}

} // namespace troupe::actors
