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
//
// With `storage.replicas` = R > 1 a block has R copies, on its shard and the next R - 1
// (mod shards), so a store process that dies takes no block with it while another copy's
// shard is up. A put or delete goes to every copy and succeeds when one copy does (the first
// copy's error otherwise); a get or has asks the copies in order until one has the block, so
// it costs one round trip while the block's first shard is up (a block no copy has is
// not_found, or false, when a copy's shard answered). A list names each block once;
// stats count every copy.
//
// Hinted repair: a put that fails on a copy's shard (down, or not answering in time) and is
// sent while others take it leaves the router a hint (the key, when, its ttl); the next time
// that shard answers a put, delete, get or has, the router copies the blocks it missed to it,
// one at a time,
// from another copy (with what is left of their ttl; expired ones are skipped), so the block
// has R copies again. A shard that fails again mid-way keeps the rest for its next answer; a
// block is tried at most 3 times. Hints live in the router's memory (at most 262,144 per
// shard, about 10 MiB): a router that restarts forgets them, and a delete a shard missed is
// not repeated (the block stays there until its ttl or eviction).
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

/// The shards holding the copies of `key` in a store of `shards` shards with `replicas` copies
/// (clamped to 1..shards): its shard, then the next ones (mod shards).
std::vector<std::uint32_t> store_copies_of(const runtime::store_key& key, std::uint32_t shards,
                                           std::uint32_t replicas);

/// The directory of shard `index` of a store of `shards` shards rooted at `root`: `root`
/// itself for one shard, else `root/shard-<index>-of-<shards>` (the count in the name: a store
/// re-sharded does not read blocks another count placed).
std::filesystem::path store_shard_directory(const std::filesystem::path& root,
                                            std::uint32_t index, std::uint32_t shards);

/// Spawns a router over `shards` (not empty; with one, that shard is returned) keeping
/// `replicas` copies of each block (clamped to 1..shards). The shards stop when the router
/// does; a shard that stops alone fails its own blocks only (with replicas: the blocks none
/// of whose copies' shards is up). `timeout` bounds the shards' answers to a list or stats,
/// and to each copy's answer when there are replicas.
/// With `metrics`, repairs are counted there (troupe_store_repairs_total{outcome},
/// troupe_store_repairs_pending).
runtime::store_port spawn_store_router(caf::actor_system& sys,
                                       std::vector<runtime::store_port> shards,
                                       std::uint32_t replicas = 1,
                                       std::chrono::seconds timeout = std::chrono::seconds(60),
                                       runtime::registry* metrics = nullptr);

/// A POSIX store of `shards` shards (at least 1) under `params.directory`
/// (store_shard_directory), each with `params.capacity / shards` bytes and its metrics under
/// its `shard` label (none for one shard), behind a router keeping `replicas` copies.
runtime::store_port spawn_sharded_posix_store(caf::actor_system& sys, posix_store_params params,
                                              std::uint32_t shards, std::uint32_t replicas = 1);

} // namespace troupe::ports
