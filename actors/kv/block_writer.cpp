#include "actors/kv/block_writer.hpp"

#include <algorithm>
#include <memory>

#include <caf/actor_system.hpp>
#include <caf/local_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <xxhash.h>

#include <array>
#include <map>

namespace troupe::actors {

std::uint64_t decode_content_key(std::uint64_t request, std::uint64_t block_index) {
  // Little-endian bytes of (request, block_index), seeded apart from other uses of XXH3.
  std::array<unsigned char, 16> bytes{};
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<unsigned char>(request >> (8 * i));
    bytes[8 + i] = static_cast<unsigned char>(block_index >> (8 * i));
  }
  constexpr XXH64_hash_t seed = 0x646563'6f6465'6b76; // "decodekv"
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

std::vector<block_key> decode_chain(const block_key& parent, std::uint64_t parent_blocks,
                                    std::uint64_t request, std::uint64_t first_block,
                                    std::uint64_t count) {
  std::vector<block_key> keys;
  keys.reserve(count);
  auto key = parent;
  for (auto i = parent_blocks; i < first_block + count; ++i) {
    key = chain_hash(key, decode_content_key(request, i), block_tokens);
    if (i >= first_block)
      keys.push_back(key);
  }
  return keys;
}

namespace {

/// The key of a request's last block keyed so far, and its index.
struct chain_tip {
  std::uint64_t index = 0;
  block_key key;
};

struct block_writer_state {
  block_writer_params params;
  std::map<std::uint64_t, chain_tip> tips;
  block_writer_stats stats;
  static inline const char* name = "block_writer";
};

using writer_ptr = block_writer_actor::stateful_pointer<block_writer_state>;

/// The keys of `f`'s blocks, continuing from the request's tip when it is the block before.
std::vector<block_key> keys_of(block_writer_state& st, const filled_blocks& f) {
  std::vector<block_key> keys;
  if (f.count > 0) {
    auto tip = st.tips.find(f.request);
    if (tip != st.tips.end() && tip->second.index + 1 == f.first_block)
      keys = decode_chain(tip->second.key, f.first_block, f.request, f.first_block, f.count);
    else
      keys = decode_chain(f.parent, f.parent_blocks, f.request, f.first_block, f.count);
  }
  if (f.last)
    st.tips.erase(f.request);
  else if (!keys.empty())
    st.tips[f.request] = chain_tip{f.first_block + f.count - 1, keys.back()};
  return keys;
}

/// Makes reserved blocks visible (kv_commit), counting the outcome.
void commit(writer_ptr self, std::vector<block_key> keys) {
  if (keys.empty())
    return;
  auto n = keys.size();
  self->request(self->state.params.kv, caf::infinite, kv_commit{std::move(keys)})
    .then(
      [self](const kv_commit_result& c) {
        auto& st = self->state;
        st.stats.committed += c.committed;
        st.stats.missing += c.missing;
        if (st.params.on_persisted)
          st.params.on_persisted(c.committed);
      },
      [self, n](const caf::error&) { self->state.stats.failed += n; });
}

void count_reserve(block_writer_stats& s, const kv_insert_result& r) {
  s.reserved += r.inserted;
  s.refreshed += r.refreshed;
  s.rejected += r.rejected;
}

void write(writer_ptr self, std::vector<block_key> keys, traffic_class traffic) {
  auto n = keys.size();
  self->request(self->state.params.kv, caf::infinite, kv_reserve{keys, traffic})
    .then(
      [self, keys](const kv_insert_result& r) mutable {
        count_reserve(self->state.stats, r);
        // The simulated world carries no bytes: the blocks are visible at once.
        commit(self, std::move(keys));
      },
      [self, n](const caf::error&) { self->state.stats.failed += n; });
}

/// Writes the placed blocks of `msg` the store lacks, then commits those it holds.
void store(writer_ptr self, store_blocks msg, std::size_t placed) {
  struct pending {
    std::vector<bool> stored;
    std::size_t left = 0;
  };
  auto p = std::make_shared<pending>();
  p->stored.assign(placed, false);
  p->left = placed;
  auto keys = std::make_shared<const std::vector<block_key>>(std::move(msg.keys));
  auto done = [self, p, keys](std::size_t i, bool stored) {
    p->stored[i] = stored;
    if (--p->left > 0)
      return;
    std::vector<block_key> in_store;
    for (std::size_t k = 0; k < p->stored.size(); ++k)
      if (p->stored[k])
        in_store.push_back((*keys)[k]);
    commit(self, std::move(in_store));
  };
  auto& st = self->state;
  const auto ttl = st.params.ttl.of(msg.traffic);
  for (std::size_t i = 0; i < placed; ++i) {
    const auto key = runtime::store_key{(*keys)[i].hi, (*keys)[i].lo};
    auto kv = msg.kv;
    const auto block = msg.first + i;
    self->request(st.params.store, caf::infinite, runtime::store_has{key})
      .then(
        [self, done, i, key, kv, block, ttl](bool has) {
          if (has) {
            done(i, true);
            return;
          }
          const auto& bytes = kv->blocks[block].bytes;
          runtime::store_put put{key, bytes.size(),
                                 std::vector<std::uint8_t>(bytes.begin(), bytes.end()), ttl};
          self->request(self->state.params.store, caf::infinite, std::move(put))
            .then(
              [self, done, i](const runtime::store_stats&) {
                ++self->state.stats.written;
                done(i, true);
              },
              [self, done, i](const caf::error&) {
                ++self->state.stats.write_failures;
                done(i, false);
              });
        },
        [self, done, i](const caf::error&) {
          ++self->state.stats.write_failures;
          done(i, false);
        });
  }
}

block_writer_actor::behavior_type block_writer_fn(writer_ptr self, block_writer_params params) {
  self->state.params = std::move(params);
  self->state.stats.instance = self->state.params.instance;
  return {
    [self](const persist_blocks& msg) {
      auto& st = self->state;
      std::map<traffic_class, std::vector<block_key>> by_class;
      for (auto& f : msg.filled) {
        auto keys = keys_of(st, f);
        st.stats.blocks += keys.size();
        auto& out = by_class[f.traffic];
        out.insert(out.end(), keys.begin(), keys.end());
      }
      for (auto& [traffic, keys] : by_class)
        if (!keys.empty())
          write(self, std::move(keys), traffic);
    },
    [self](store_blocks& msg) {
      auto& st = self->state;
      const auto n = msg.keys.size();
      if (n == 0 || !st.params.store || !msg.kv || msg.first + n > msg.kv->blocks.size())
        return;
      st.stats.blocks += n;
      auto keys = msg.keys;
      self->request(st.params.kv, caf::infinite, kv_reserve{std::move(keys), msg.traffic})
        .then(
          [self, msg = std::move(msg)](const kv_insert_result& r) mutable {
            count_reserve(self->state.stats, r);
            // The rejected blocks are the last ones (no room from the first on).
            const auto placed = msg.keys.size() - std::min<std::size_t>(r.rejected,
                                                                         msg.keys.size());
            if (placed > 0)
              store(self, std::move(msg), placed);
          },
          [self, n](const caf::error&) { self->state.stats.failed += n; });
    },
    [self](block_writer_stats_atom) { return self->state.stats; },
  };
}

} // namespace

block_writer_actor spawn_block_writer(caf::local_actor* parent, block_writer_params params) {
  return parent->spawn(block_writer_fn, std::move(params));
}

} // namespace troupe::actors
