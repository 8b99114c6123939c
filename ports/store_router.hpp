// store_router: one block store over several shards.
//
// A topology's `storage.shards` spreads the cluster's blocks over that many stores, each with
// its own directory, capacity (the topology's divided by the shard count), LRU order and TTL
// sweep: a store per SSD, or per store process of `troupe launch` (one per host of a store
// cluster). A block lives on shard `key.lo % shards`, as in the KV CHECK role
// (actors/kv/block_key.hpp, `shard_of`). The router is a store port over the shards' ports:
// put, get, has and delete go to the block's shard (its answer, errors included, is the
// router's: a shard that is down fails only its own blocks); list merges every shard's list
// in key order and stats add up, and both fail when a shard fails to answer (a partial list
// or sum would pass for the whole store).
#pragma once

#include "ports/posix_store.hpp"
#include "runtime/ports/store.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <vector>

namespace troupe::ports {

/// The shard of `key` in a store of `shards` shards (at least 1).
std::uint32_t store_shard_of(const runtime::store_key& key, std::uint32_t shards) noexcept;

/// The directory of shard `index` of a store of `shards` shards rooted at `root`: `root`
/// itself for one shard, else `root/shard-<index>-of-<shards>` (the count in the name: a store
/// re-sharded does not read blocks another count placed).
std::filesystem::path store_shard_directory(const std::filesystem::path& root,
                                            std::uint32_t index, std::uint32_t shards);

/// Spawns a router over `shards` (not empty; with one, that shard is returned). The shards
/// stop when the router does; a shard that stops alone fails its own blocks only. `timeout`
/// bounds the shards' answers to a list or stats.
runtime::store_port spawn_store_router(caf::actor_system& sys,
                                       std::vector<runtime::store_port> shards,
                                       std::chrono::seconds timeout = std::chrono::seconds(60));

/// A POSIX store of `shards` shards (at least 1) under `params.directory`
/// (store_shard_directory), each with `params.capacity / shards` bytes and its metrics under
/// its `shard` label (none for one shard), behind a router.
runtime::store_port spawn_sharded_posix_store(caf::actor_system& sys, posix_store_params params,
                                              std::uint32_t shards);

} // namespace troupe::ports
