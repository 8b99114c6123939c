// block_key: the 128-bit hash-chain key of a 128-token KV block, and the chain functions.
//
// The cluster KV cache shares prefixes between requests. A prompt is cut into 128-token
// blocks and block i is named by a key that depends on its own tokens *and* on every block
// before it: `h_i = H(h_{i-1}, block i)`, with `h_{-1}` the zero key. Two prompts therefore
// share block i's key exactly when they share blocks 0..i, so finding the longest cached
// prefix is a walk over keys, on metadata only. H is XXH3-128 (seed 0) over a fixed byte
// layout, so keys are stable across machines, builds and runs.
//
// Two forms name a block's content. In the real world a block is its token ids. In the
// simulated world traces give each block as a 64-bit *content key* (the trace loader's id of
// the block's tokens) plus its token count. The two forms never produce the same key for the
// same parent (the layouts differ in a flag bit), so a world must use one form throughout.
//
// Byte layout hashed by XXH3-128 (all integers little-endian):
//   token form:       parent.hi (u64) | parent.lo (u64) | n (u32)               | n × token (u32)
//   content-key form: parent.hi (u64) | parent.lo (u64) | n | 0x8000'0000 (u32) | content key (u64)
// where n is the block's token count (1..128). The result's high 64 bits become `hi`, the
// low 64 bits `lo`.
//
// Only full blocks are cacheable: a final partial block still changes as the sequence grows,
// so `make_chain` drops it. Extending a chain later (a decode instance persisting each block
// as it fills) continues from the last key with `parent`.
#pragma once

#include <caf/meta/type_name.hpp>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace troupe::actors {

/// Tokens in one KV block; only full blocks are keyed and cached.
inline constexpr std::uint32_t block_tokens = 128;

/// The 128-bit key of one block in a hash chain. The zero key is the parent of a chain's
/// first block (and is never produced by the chain functions in practice).
struct block_key {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  friend constexpr auto operator<=>(const block_key&, const block_key&) = default;
  friend constexpr bool operator==(const block_key&, const block_key&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_key& x) {
  return f(caf::meta::type_name("block_key"), x.hi, x.lo);
}

/// 32 lowercase hex digits, `hi` first.
std::string to_string(const block_key& k);

/// The shard (in 0..shards-1) that owns `k`: `k.lo % shards`. Requires shards > 0.
inline std::uint32_t shard_of(const block_key& k, std::uint32_t shards) {
  return static_cast<std::uint32_t>(k.lo % shards);
}

/// The key of a block of `tokens` (token form) following `parent`. `tokens` holds
/// 1..block_tokens ids (not checked here: make_chain only passes full blocks).
block_key chain_hash(const block_key& parent, std::span<const std::uint32_t> tokens);

/// The key of a block whose content is named by `content_key` and holds `token_count`
/// tokens (content-key form, for traces), following `parent`.
block_key chain_hash(const block_key& parent, std::uint64_t content_key,
                     std::uint32_t token_count);

/// The keys of every *full* block of `tokens` (floor(size / block_tokens) keys), the first
/// one following `parent`. A trailing partial block gets no key: it is not cacheable.
std::vector<block_key> make_chain(std::span<const std::uint32_t> tokens,
                                  const block_key& parent = {});

/// The keys of a trace prompt given as per-block content keys and its length in tokens:
/// min(content_keys.size(), prompt_tokens / block_tokens) keys, each of a full block,
/// the first one following `parent`. A last content key that covers a partial block (or any
/// key beyond the prompt's full blocks) gets no key.
std::vector<block_key> make_chain(std::span<const std::uint64_t> content_keys,
                                  std::uint64_t prompt_tokens, const block_key& parent = {});

} // namespace troupe::actors

template <>
struct std::hash<troupe::actors::block_key> {
  /// `hi`: already uniform, and independent of `lo`, which picks the shard.
  std::size_t operator()(const troupe::actors::block_key& k) const noexcept {
    return static_cast<std::size_t>(k.hi);
  }
};
