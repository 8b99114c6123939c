// kv_store: the CHECK role of the cluster KV cache as an actor (one shard, or several).
//
// Every request asks "how much of my prompt is cached?" before it is routed, so the answer
// sits on the critical path: it must be a metadata-only round trip. Decode instances persist
// each full 128-token block as it fills and tell the CHECK role, so later requests (and a
// rerouted one) hit it. A cluster's cache is too large for one index, so it is sharded by
// block key: the same protocol, the same answers as a single index of the summed capacity (as
// long as no shard is full; each shard evicts on its own).
//
// Sharding: each block lives on shard `shard_of(key, S)` (its key's low 64 bits mod S), not
// on the shard of its chain's first block: chains share prefixes (a system prompt's first
// blocks start most conversations), so routing by first block would put most traffic on a
// few shards. A sharded store keeps one index per shard, each with its own capacity, eviction
// order, faults and slowdowns, in one actor: a match asks every shard that owns some block of
// the chain for the leading run of hits among *its* blocks; the chain's leading run ends at
// the earliest first miss over all shards, and the answer comes when the slowest of those
// shards would have answered (they work in parallel). Only then are the hit blocks refreshed,
// so a block after a miss is neither counted nor refreshed. A failed shard counts as a miss
// from its first block: the cache is an optimization, and a match never fails.
//
// The shards share one actor rather than one each because a match then costs one message and
// its answer instead of a probe, an answer and a refresh per shard: in the simulator the
// CHECK role's messages were a third of all events.
//
// All time comes from the actor clock; nothing here blocks.
#pragma once

#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_index.hpp"
#include "runtime/time.hpp"

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace troupe::actors {

/// Asks for the longest cached prefix of a prompt. `chain` holds the keys of the prompt's
/// full blocks (make_chain); `prompt_tokens` its full length (for the by-token miss count;
/// 0 counts the chain's tokens only). Hits are refreshed with the TTL of `traffic`.
/// Reply: kv_match_result.
struct kv_match {
  std::vector<block_key> chain;
  traffic_class traffic = traffic_class::chatbot;
  std::uint64_t prompt_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_match& x) {
  return f(caf::meta::type_name("kv_match"), x.chain, x.traffic, x.prompt_tokens);
}

/// Records blocks as cached and visible at once (their bytes are already in the store, or
/// the world carries none). Reply: kv_insert_result (kv_index::insert).
struct kv_insert {
  std::vector<block_key> blocks;
  traffic_class traffic = traffic_class::chatbot;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_insert& x) {
  return f(caf::meta::type_name("kv_insert"), x.blocks, x.traffic);
}

/// Reserves room for blocks about to be written; they are no hits until a kv_commit.
/// Reply: kv_insert_result (kv_index::reserve): `inserted` blocks should be written.
struct kv_reserve {
  std::vector<block_key> blocks;
  traffic_class traffic = traffic_class::chatbot;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_reserve& x) {
  return f(caf::meta::type_name("kv_reserve"), x.blocks, x.traffic);
}

/// Makes reserved blocks visible once their bytes are in the store. Reply: kv_commit_result
/// (`missing` blocks were evicted or expired meanwhile; their bytes may be deleted).
struct kv_commit {
  std::vector<block_key> blocks;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_commit& x) {
  return f(caf::meta::type_name("kv_commit"), x.blocks);
}

/// Internal to a sharded store, the second phase of a match: refresh these hit blocks (the
/// chain's leading run, each in its shard) with the TTL of `traffic`. No reply.
struct kv_touch {
  std::vector<block_key> blocks;
  traffic_class traffic = traffic_class::chatbot;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_touch& x) {
  return f(caf::meta::type_name("kv_touch"), x.blocks, x.traffic);
}

/// Asks for kv_stats (a sharded store sums its shards' and adds its own match accounting).
using kv_stats_atom = caf::atom_constant<caf::atom("kvstats")>;

/// Fault injection (simulated world): (kv_shard_fault_atom, shard, down). `down`: the shard
/// fails — it loses its metadata (its index is emptied) and, until it comes back, counts as
/// failed (every probe a miss, every insert or reserve rejected, every commit missing); not
/// `down`: it comes back, empty. With replicas, a failed shard's blocks are answered by the
/// next of their copies' shards that is up, and only the blocks none of whose copies' shards
/// is up are lost. A single shard ignores the shard number; a sharded store
/// applies it to shard `shard` (none if it has no such shard). No reply. The cache is an optimisation: results do not change,
/// only hits are lost (docs/faults.md).
using kv_shard_fault_atom = caf::atom_constant<caf::atom("kvshfault")>;

/// Fault injection (simulated world): (kv_shard_slow_atom, shard, factor, on). While on, the
/// shard answers `factor` times its `op_latency` after a request arrives (overlapping
/// slowdowns: the largest factor); `on` false ends the slowdown of that factor. Shard numbers
/// as for kv_shard_fault_atom. No reply.
using kv_shard_slow_atom = caf::atom_constant<caf::atom("kvshslow")>;

/// The CHECK role as its clients see it: one shard or a sharded store.
using kv_check_actor = caf::typed_actor<
  caf::reacts_to<kv_shard_fault_atom, std::uint32_t, bool>,
  caf::reacts_to<kv_shard_slow_atom, std::uint32_t, double, bool>,
  caf::replies_to<kv_match>::with<kv_match_result>,
  caf::replies_to<kv_insert>::with<kv_insert_result>,
  caf::replies_to<kv_reserve>::with<kv_insert_result>,
  caf::replies_to<kv_commit>::with<kv_commit_result>,
  caf::replies_to<kv_stats_atom>::with<kv_stats>>;

/// Spawns one shard holding a kv_index with `params` (params.block_bytes > 0). It reads time
/// from its actor clock. Each match and insert is decided when it arrives and answered
/// `params.op_latency` (times a store_slow factor) later; reserve and commit at once. It
/// stops like any actor (no state survives: the index is rebuilt from writes after a restart,
/// and a restarted store just misses until then).
kv_check_actor spawn_kv_store(caf::actor_system& sys, kv_index_params params);

/// Spawns a store of `shards` shards (blocks go to shard_of(key, shards)), each an index
/// with `per_shard` (its own capacity), in one actor; answers as spawn_kv_store's do, a
/// match or insert when its slowest shard would have. With `replicas` > 1 (at most
/// `shards`) each block is also copied on the next replicas - 1 shards: a failed shard's
/// blocks stay hits while one of their copies' shards is up, and are lost (its index emptied)
/// when none is.
kv_check_actor spawn_sharded_kv_store(caf::actor_system& sys, kv_index_params per_shard,
                                      std::uint32_t shards, std::uint32_t replicas = 1);

} // namespace troupe::actors
