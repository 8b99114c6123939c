#include "actors/kv/kv_store.hpp"

#include "runtime/check.hpp"
#include "runtime/ports/delayed_reply.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace troupe::actors {

namespace {

// -- the store: one index per shard, in one actor ------------------------------------------

using store_actor = kv_check_actor::extend<caf::reacts_to<kv_touch>>;

/// One shard: the index of the blocks whose first copy it holds, whether a fault has failed
/// it, and the slowdowns in force.
struct shard {
  std::optional<kv_index> index;
  /// Failed by a fault (kv_shard_fault_atom) until it comes back.
  bool down = false;
  /// The factors of the slowdowns in force (kv_shard_slow_atom); the largest applies.
  std::multiset<double> slow;
};

struct store_state {
  kv_index_params params;
  std::vector<shard> shards;
  /// Matches go by probe and touch (sharded) rather than by kv_index::match (one shard).
  bool sharded = false;
  /// Copies of each block: on its shard and the next replicas - 1 (mod shards).
  std::uint32_t replicas = 1;
  /// Match accounting of a sharded store (lookups, hits, misses); the indexes hold the rest.
  kv_stats matches;
  static inline const char* name = "kv_store";
};

using store_ptr = store_actor::stateful_pointer<store_state>;

/// Records `act` on `blocks` at `now` in the run's history, if it keeps one.
void record(store_ptr self, std::span<const block_key> blocks, kv_act act, traffic_class cls,
            runtime::time_point now) {
  auto& h = self->state.params.history;
  if (!h)
    return;
  std::vector<kv_fact> facts;
  facts.reserve(blocks.size());
  for (const auto& k : blocks)
    facts.push_back(kv_fact{now, k, act, cls});
  h->add(facts);
}

/// The blocks a put placed or refreshed: all but the rejected tail.
std::span<const block_key> placed(const std::vector<block_key>& blocks,
                                  const kv_insert_result& r) {
  return std::span<const block_key>{blocks}.first(blocks.size() - r.rejected);
}

/// The shard that answers for the blocks whose first copy is on shard `i`: the first of their
/// copies' shards that is up, or null when every one of them is down.
const shard* holder(store_ptr self, std::size_t i) {
  auto& st = self->state;
  for (std::uint32_t c = 0; c < st.replicas; ++c) {
    const auto& s = st.shards[(i + c) % st.shards.size()];
    if (!s.down)
      return &s;
  }
  return nullptr;
}

/// How long the blocks of shard `i` take to answer: the operation latency times the largest
/// slowdown of the shard answering for them (of shard `i` itself when none is up).
runtime::duration latency_of(store_ptr self, std::size_t i) {
  const auto* s = holder(self, i);
  if (s == nullptr)
    s = &self->state.shards[i];
  auto latency = self->state.params.op_latency;
  if (!s->slow.empty())
    latency = runtime::from_seconds(runtime::to_seconds(latency) * *s->slow.rbegin());
  return latency;
}

/// `r`, answered `latency` from now: at once when that is zero.
template <class T>
caf::result<T> answer(store_ptr self, runtime::duration latency, T r) {
  if (latency.count() <= 0)
    return r;
  runtime::detail::reply_at(self, self->clock().now() + latency, std::move(r));
  return caf::delegated<T>{};
}

/// One chain split by shard: each shard's blocks and their positions in the chain, in order.
struct split_chain {
  std::vector<std::vector<block_key>> blocks;
  std::vector<std::vector<std::uint32_t>> positions;
};

split_chain split(const std::vector<block_key>& chain, std::size_t shards) {
  split_chain out;
  out.blocks.resize(shards);
  out.positions.resize(shards);
  for (std::uint32_t i = 0; i < chain.size(); ++i) {
    auto s = shard_of(chain[i], static_cast<std::uint32_t>(shards));
    out.blocks[s].push_back(chain[i]);
    out.positions[s].push_back(i);
  }
  return out;
}

/// Refreshes the hit blocks of a sharded match, each in its shard (skipped when no copy of it
/// is up).
void touch(store_ptr self, const kv_touch& m) {
  auto& st = self->state;
  auto parts = split(m.blocks, st.shards.size());
  auto now = self->clock().now();
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    auto& sh = st.shards[i];
    if (parts.blocks[i].empty() || holder(self, i) == nullptr)
      continue;
    sh.index->touch(parts.blocks[i], m.traffic, now);
    record(self, parts.blocks[i], kv_act::refresh, m.traffic, now);
  }
}

/// A sharded match. Every shard that owns blocks of the chain finds the leading run of hits
/// among its own blocks when the match arrives; the chain's leading run ends at the earliest
/// first miss over all of them. The answer comes when the slowest of those shards would have
/// answered, and only then are the run's blocks refreshed, so a block after a miss is
/// neither counted nor refreshed.
caf::result<kv_match_result> sharded_match(store_ptr self, const kv_match& m) {
  auto& st = self->state;
  auto now = self->clock().now();
  auto parts = split(m.chain, st.shards.size());
  std::size_t hits = m.chain.size();
  runtime::duration latency{0};
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    const auto& blocks = parts.blocks[i];
    if (blocks.empty())
      continue;
    auto& sh = st.shards[i];
    latency = std::max(latency, latency_of(self, i));
    std::size_t lead = 0;
    if (holder(self, i) != nullptr) {
      lead = sh.index->probe(blocks, now);
      record(self, std::span<const block_key>{blocks}.first(lead), kv_act::hit,
             traffic_class::chatbot, now);
    }
    const auto& pos = parts.positions[i];
    hits = std::min<std::size_t>(hits, lead < pos.size() ? pos[lead] : m.chain.size());
  }
  account_match(st.matches, static_cast<std::uint32_t>(hits), m.chain.size(), m.prompt_tokens);
  kv_match_result r{static_cast<std::uint32_t>(hits),
                    static_cast<std::uint64_t>(hits) * block_tokens};
  kv_touch refresh{{m.chain.begin(), m.chain.begin() + static_cast<std::ptrdiff_t>(hits)},
                   m.traffic};
  if (latency.count() <= 0) {
    touch(self, refresh);
    return r;
  }
  if (hits > 0)
    self->delayed_send(self, latency, std::move(refresh));
  return answer(self, latency, r);
}

/// Puts `blocks` into their shards with `put` (insert or reserve); a failed shard rejects its
/// part. Answered when the slowest shard would have answered, unless `at_once`.
template <class Put>
caf::result<kv_insert_result> scatter(store_ptr self, const std::vector<block_key>& blocks,
                                      traffic_class cls, kv_act act, bool at_once, Put put) {
  auto& st = self->state;
  auto now = self->clock().now();
  auto parts = split(blocks, st.shards.size());
  kv_insert_result sum;
  runtime::duration latency{0};
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    const auto& part = parts.blocks[i];
    if (part.empty())
      continue;
    auto& sh = st.shards[i];
    latency = std::max(latency, latency_of(self, i));
    if (holder(self, i) == nullptr) {
      sum.rejected += static_cast<std::uint32_t>(part.size());
      continue;
    }
    auto r = put(*sh.index, part, now);
    record(self, placed(part, r), act, cls, now);
    sum.inserted += r.inserted;
    sum.refreshed += r.refreshed;
    sum.rejected += r.rejected;
  }
  if (at_once)
    return sum;
  return answer(self, latency, sum);
}

void add_stats(kv_stats& acc, const kv_stats& s) {
  acc.entries += s.entries;
  acc.pending += s.pending;
  acc.bytes += s.bytes;
  acc.capacity_bytes += s.capacity_bytes;
  acc.lookups += s.lookups;
  acc.hit_blocks += s.hit_blocks;
  acc.miss_blocks += s.miss_blocks;
  acc.hit_tokens += s.hit_tokens;
  acc.miss_tokens += s.miss_tokens;
  acc.inserted += s.inserted;
  acc.refreshed += s.refreshed;
  acc.rejected += s.rejected;
  acc.committed += s.committed;
  acc.evictions += s.evictions;
  acc.expirations += s.expirations;
  acc.served_expired += s.served_expired;
}

store_actor::behavior_type store_fn(store_ptr self, kv_index_params params,
                                    std::uint32_t shards, std::uint32_t replicas, bool sharded) {
  auto& st = self->state;
  st.params = params;
  st.sharded = sharded;
  st.replicas = std::clamp<std::uint32_t>(replicas, 1, shards);
  st.shards.resize(shards);
  for (auto& sh : st.shards)
    sh.index.emplace(params);
  // One shard takes any shard number; a sharded store ignores numbers it does not have.
  auto shard_at = [self](std::uint32_t i) -> std::optional<std::size_t> {
    auto& v = self->state.shards;
    if (v.size() == 1 && !self->state.sharded)
      return 0;
    if (i < v.size())
      return i;
    return std::nullopt;
  };
  auto now = [self] { return self->clock().now(); };
  return {
    [self, shard_at](kv_shard_fault_atom, std::uint32_t i, bool down) {
      auto at = shard_at(i);
      if (!at)
        return;
      auto& st = self->state;
      st.shards[*at].down = down;
      if (!down)
        return; // It comes back with what its copies kept, or empty (below).
      // The blocks whose every copy's shard is now down are lost: those shards' metadata goes
      // with them (one copy: the shard's own blocks).
      const auto n = st.shards.size();
      for (std::uint32_t c = 0; c < st.replicas; ++c) {
        auto first = (*at + n - c) % n;
        if (holder(self, first) == nullptr)
          st.shards[first].index.emplace(st.params);
      }
    },
    [self, shard_at](kv_shard_slow_atom, std::uint32_t i, double factor, bool on) {
      auto at = shard_at(i);
      if (!at)
        return;
      auto* sh = &self->state.shards[*at];
      if (on)
        sh->slow.insert(factor);
      else if (auto f = sh->slow.find(factor); f != sh->slow.end())
        sh->slow.erase(f);
    },
    [self, now](const kv_match& m) -> caf::result<kv_match_result> {
      auto& st = self->state;
      if (st.sharded)
        return sharded_match(self, m);
      auto& sh = st.shards.front();
      auto latency = latency_of(self, 0);
      if (sh.down)
        return answer(self, latency, kv_match_result{});
      auto r = sh.index->match(m.chain, m.traffic, now(), m.prompt_tokens);
      auto served = std::span<const block_key>{m.chain}.first(r.hit_blocks);
      record(self, served, kv_act::hit, m.traffic, now());
      record(self, served, kv_act::refresh, m.traffic, now());
      return answer(self, latency, r);
    },
    [self](const kv_touch& m) { touch(self, m); },
    [self](const kv_insert& m) {
      return scatter(self, m.blocks, m.traffic, kv_act::write, false,
                     [&](kv_index& idx, const std::vector<block_key>& part,
                         runtime::time_point t) { return idx.insert(part, m.traffic, t); });
    },
    // Reserve and commit answer at once: the simulated writer's pair is one step (it carries
    // no bytes), and a delay between them would leave a reservation behind whenever the
    // writer's instance stops in between (no reservation lease yet: kv-store.md).
    [self](const kv_reserve& m) {
      return scatter(self, m.blocks, m.traffic, kv_act::reserve, true,
                     [&](kv_index& idx, const std::vector<block_key>& part,
                         runtime::time_point t) { return idx.reserve(part, m.traffic, t); });
    },
    [self, now](const kv_commit& m) {
      auto& st = self->state;
      auto parts = split(m.blocks, st.shards.size());
      kv_commit_result sum;
      for (std::size_t i = 0; i < st.shards.size(); ++i) {
        const auto& part = parts.blocks[i];
        if (part.empty())
          continue;
        auto& sh = st.shards[i];
        if (holder(self, i) == nullptr) {
          sum.missing += static_cast<std::uint32_t>(part.size());
          continue;
        }
        record(self, part, kv_act::commit, traffic_class::chatbot, now());
        auto r = sh.index->commit(part, now());
        sum.committed += r.committed;
        sum.missing += r.missing;
      }
      return sum;
    },
    [self](kv_stats_atom) {
      auto& st = self->state;
      kv_stats acc = st.matches;
      for (const auto& sh : st.shards)
        add_stats(acc, sh.index->stats());
      return acc;
    },
  };
}

} // namespace

kv_check_actor spawn_kv_store(caf::actor_system& sys, kv_index_params params) {
  TROUPE_CHECK(params.block_bytes > 0, "kv_store: block_bytes must be > 0");
  return sys.spawn(store_fn, params, std::uint32_t{1}, std::uint32_t{1}, false);
}

kv_check_actor spawn_sharded_kv_store(caf::actor_system& sys, kv_index_params per_shard,
                                      std::uint32_t shards, std::uint32_t replicas) {
  TROUPE_CHECK(per_shard.block_bytes > 0, "kv_store: block_bytes must be > 0");
  TROUPE_CHECK(shards > 0, "kv_store: needs at least one shard");
  return sys.spawn(store_fn, per_shard, shards, replicas, true);
}

} // namespace troupe::actors
