// posix_store: the real store port, KV blocks as checksummed files in a POSIX directory.
//
// The cluster KV cache must outlive processes: a block persisted by one decode instance is
// read by every prefill instance, and a store restarted after a crash must find its blocks
// and never serve a torn or flipped one. This store keeps one file per object on a POSIX
// mount (local SSD, 3FS FUSE, NFS) and implements `store_port` with the same contract as the
// simulated store (runtime/ports/store.hpp; one test suite checks both):
//
// - **Layout**: `<directory>/<2 hex>/<32 hex key>.blk`, fanned out by the key's first byte.
//   A file is a 64-byte header (magic, format version, key, payload size, expiry, XXH3-64 of
//   the payload, XXH3-64 of the header) followed by the payload (docs/kv-store.md).
// - **Crash-safe writes**: a put writes a temporary file in the same directory, fsyncs it,
//   renames it over the final name and fsyncs the directory; a crash leaves the old object
//   or the new one, never a torn one. Temporary files left by a crash are deleted at start.
// - **Verified reads**: a get checks the header, its key, the file size and the payload
//   checksum; on a mismatch it answers errc::store_corrupt, counts it and deletes the file.
// - **TTL** on the injected wall clock (the expiry is stored in the header), **LRU eviction**
//   to stay within `capacity` (header bytes included), and a **restart** scan that reads
//   every header, drops expired and malformed files, and indexes the rest.
//
// Threading: the store is a `caf::detached` event-based actor. It has a thread of its own
// and does its file IO there, blocking only itself, never one of CAF's scheduler threads;
// requests are served one at a time in arrival order. The directory belongs to one store:
// two stores on one directory, or files changed behind its back, are not supported (a file
// removed or damaged behind its back is found by the next get: not_found or store_corrupt).
#pragma once

#include "runtime/metrics.hpp"
#include "runtime/ports/store.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace troupe::ports {

/// The wall clock a POSIX store reads for TTLs.
using wall_clock_fn = std::function<std::chrono::system_clock::time_point()>;

struct posix_store_params {
  /// The store's directory; created (with its parents) if missing.
  std::filesystem::path directory;
  /// Bytes the store may hold: payloads plus one `posix_store_header_bytes` per object.
  std::uint64_t capacity = 0;
  /// The wall clock for expiries (stored in the files, so they survive restarts). Empty:
  /// std::chrono::system_clock::now. Tests inject a fake clock to test TTL without sleeping.
  wall_clock_fn clock;
  /// Where the store reports its occupancy and counters (troupe_store_*; docs/serve.md,
  /// "Metrics") after every request; null: nowhere. Must outlive the store.
  runtime::registry* metrics = nullptr;
  /// The `shard` label of those metrics (one shard of a sharded store, ports/store_router.hpp);
  /// empty: none.
  std::string metrics_shard = {};
};

/// The size of a block file's header, charged against the capacity with each object.
inline constexpr std::uint64_t posix_store_header_bytes = 64;

/// Spawns a POSIX store on `params.directory` (detached: its own thread). Before it answers
/// any request it deletes leftover temporary files and indexes the blocks already there:
/// expired and malformed ones are deleted (counted as expired / corrupt), the rest are
/// served, least recently modified first in the LRU order; if they exceed the capacity, the
/// least recent are evicted. Every reply follows the contract of `store_port`; in addition:
/// a put needs its payload (`payload.size() == size`, else errc::invalid_argument); a disk
/// that is full answers errc::store_full and any other IO failure errc::unavailable, with
/// the path and the system's message, the old object (if any) left in place. When the
/// directory cannot be created or read, the actor exits at once with errc::unavailable as
/// its exit reason (a monitor or supervisor sees it; requests fail with
/// caf::sec::request_receiver_down). The actor stops on an exit message or when it becomes
/// unreachable; every put it answered is durable by then.
runtime::store_port spawn_posix_store(caf::actor_system& sys, posix_store_params params);

} // namespace troupe::ports
