// Topology files: the TOML description of a troupe cluster, loaded and validated.
//
// Everything troupe runs, simulated or real, starts from a topology: which model on which
// hardware, where KV blocks are persisted and for how long, which pools of prefill, decode
// and vision instances exist with their sizes and expert-parallel layout, how the autoscaler
// may move them, and (in the real world) which machines host them. A typo in such a file
// should never become a silently ignored key or a cluster that fails an hour into a run, so
// loading is strict: every unknown key is an error with a did-you-mean, every value is
// type- and range-checked, cross-section rules (quota versus pool sizes, EP sizes versus
// GPUs per instance) are verified, and all problems are reported at once, each as
// `file:line:col: key.path: what is wrong (hint)`. A file that loads is a plain `topology`
// struct with every default filled in; nothing downstream re-validates it.
//
// The keys, their types, defaults and constraints are documented in docs/topology.md.
#pragma once

#include "cluster/diagnostic.hpp"

#include <caf/timespan.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster {

/// What the instances of a pool do.
enum class pool_role { prefill, decode, vision };

/// Where persistent KV blocks live: a modelled store (simulation) or files on a POSIX mount.
enum class storage_backend { sim, posix };

/// The lowercase name of a role as written in topology files ("prefill", "decode", "vision").
std::string_view to_string(pool_role role) noexcept;

/// The lowercase name of a backend as written in topology files ("sim", "posix").
std::string_view to_string(storage_backend backend) noexcept;

/// The models a topology may name, in their canonical spelling.
const std::vector<std::string_view>& known_models();

/// The hardware names a topology may use, in their canonical spelling ("cpu" is the exact
/// CPU backend used for local runs and tests).
const std::vector<std::string_view>& known_hardware();

/// [cluster]: what is served, on what.
struct cluster_spec {
  std::string name;
  std::string model;    // one of known_models(), canonical spelling
  std::string hardware; // one of known_hardware(), canonical spelling
  /// The engine `troupe serve` and `troupe launch` run each GPU rank on: "cpu" (the exact CPU
  /// backend, one CPU device per rank) or "cuda" (the CUDA backend, one GPU per rank). Written
  /// `device = ...`; by default "cpu" for hardware "cpu", "cuda" for an NVIDIA part, none for
  /// Ascend950 (no backend: the topology is for the simulator only). The simulator ignores it.
  std::string device;
};

/// [storage]: the persistent KV block store.
struct storage_spec {
  storage_backend backend = storage_backend::sim;
  std::string path;                             // posix only; empty for sim
  std::uint64_t capacity_bytes = 0;             // > 0
  std::map<std::string, caf::timespan> ttl;     // traffic class → block time-to-live (> 0)
  /// Shards the blocks are spread over (a block lives on shard key.lo % shards); 0: not
  /// given (the simulator models `sim_params::kv_shards`, a real cluster one shard).
  std::uint32_t shards = 0;
  /// Copies of each block, on its shard and the next `replicas - 1` (mod shards); 0: not
  /// given (one copy). At most `shards`.
  std::uint32_t replicas = 0;

  /// Shards of a real cluster's store: one store process each under `troupe launch`.
  std::uint32_t real_shards() const noexcept { return shards == 0 ? 1 : shards; }
  /// Copies of each block.
  std::uint32_t real_replicas() const noexcept { return replicas == 0 ? 1 : replicas; }
};

/// Most shards a store may have.
inline constexpr std::uint32_t max_store_shards = 1024;
/// Most copies of a block.
inline constexpr std::uint32_t max_store_replicas = 8;

/// Instance counts of a pool: min ≤ initial ≤ max, max ≥ 1.
struct instance_bounds {
  std::uint32_t min = 0;
  std::uint32_t initial = 0;
  std::uint32_t max = 0;
};

/// [[pool]]: a set of identical instances with one role.
struct pool_spec {
  std::string name;
  pool_role role = pool_role::prefill;
  instance_bounds instances;
  std::uint32_t gpus_per_instance = 0; // ≥ 1
  std::uint32_t ep_size = 0;           // ≥ 1; divides or is a multiple of gpus_per_instance
  /// Prefill only: strictly increasing upper bounds (in uncached input tokens) of the routing
  /// buckets; n bounds make n + 1 buckets, the last unbounded. Empty for other roles.
  std::vector<std::uint64_t> buckets;
  /// Decode only: how long a draining instance keeps serving before it hands its requests
  /// (with their KV) to other instances. Zero for other roles.
  caf::timespan grace{0};
  /// The real world's step budgets (0: the command's default). Prefill only: prompt tokens per
  /// chunked-prefill step of an instance. Decode only: requests an instance decodes together.
  std::uint64_t chunk_tokens = 0;
  std::uint32_t max_batch = 0;
  /// The real world's processes of an instance: its ranks beyond the first ranks_per_process
  /// run in processes of their own, ranks_per_process each (ports/cpu_device.hpp). 0: every
  /// rank a thread of the instance's process. At most gpus_per_instance; the simulator ignores it.
  std::uint32_t ranks_per_process = 0;

  /// GPUs of `count` instances of this pool.
  std::uint64_t gpus(std::uint32_t count) const noexcept {
    return std::uint64_t{count} * gpus_per_instance;
  }
};

/// [autoscaler]: how pools may grow and shrink.
struct autoscaler_spec {
  bool enabled = false;                    // sim and serve run the autoscaler only when set
  caf::timespan interval{0};               // > 0
  std::uint32_t max_step_up = 0;           // instances per pool per interval, ≥ 1
  std::uint32_t max_step_down = 0;         // instances per pool per interval, ≥ 1
  double over_provision = 0;               // fraction above computed need, in [0, 1]
  std::uint32_t ready_inventory = 0;       // ready-but-unassigned instances kept for bursts
  std::uint64_t quota = 0;                 // GPUs the cluster may hold at once
  double scale_down_occupancy_limit = 0.8; // no scale-down while occupancy exceeds it, (0, 1]
  caf::timespan inventory_join{0};         // a ready instance starts serving after this, > 0
  caf::timespan inventory_refill{0};       // an instance from the quota is ready after this, > 0
  caf::timespan scale_down_after{0};       // desired below current this long before shrinking, ≥ 0
};

/// [[node]]: one machine of a real deployment.
struct node_spec {
  std::string name;
  std::string host;
  std::uint16_t port = 0;        // 1..65535
  std::uint32_t gpus = 0;        // devices on the machine, ≥ 1
  std::vector<pool_role> roles;  // non-empty, no duplicates
};

/// A validated topology with every default filled in.
struct topology {
  std::string source; // the file name it was loaded from (as given)
  cluster_spec cluster;
  storage_spec storage;
  std::vector<pool_spec> pools; // in file order; names unique
  autoscaler_spec autoscaler;
  std::vector<node_spec> nodes; // empty: the simulated world places the pools itself
};

/// The outcome of loading a topology: the topology when the file is valid, otherwise every
/// problem found, in file order (line, then column).
struct load_result {
  std::optional<topology> value;
  std::vector<diagnostic> errors;

  /// True when the topology is valid (and `value` is set).
  bool ok() const noexcept { return value.has_value(); }
};

/// Parses and validates topology text; `file_name` only labels the diagnostics.
/// Never throws: TOML syntax errors (first one only, as the parser stops there) and every
/// validation problem come back in `errors`.
load_result parse_topology(std::string_view text, std::string_view file_name);

/// Reads and validates a topology file. An unreadable file is a single diagnostic at 1:1.
load_result load_topology(const std::filesystem::path& file);

/// The first pool of `role` in `topo`, or nullptr.
const pool_spec* find_pool(const topology& topo, pool_role role);

/// GPU counts of one pool at its instance bounds.
struct pool_gpus {
  std::string name;
  pool_role role = pool_role::prefill;
  std::uint32_t ep_size = 0;
  std::uint64_t min = 0;
  std::uint64_t initial = 0;
  std::uint64_t max = 0;
};

/// The numbers a person checks first: GPUs per pool and in total at min/initial/max, the
/// quota and the quota occupancy at initial size.
struct topology_summary {
  std::vector<pool_gpus> pools; // in file order
  std::uint64_t min_gpus = 0;
  std::uint64_t initial_gpus = 0;
  std::uint64_t max_gpus = 0;
  std::uint64_t quota = 0;
  double initial_occupancy = 0; // initial_gpus / quota
};

/// Computes the summary of a valid topology.
topology_summary summarize(const topology& t);

/// The normalized, human-readable view printed by `troupe topology show`: cluster, storage
/// (human sizes and TTLs), pools (role, instances, GPUs per instance, EP size, buckets or
/// grace, GPUs), totals, autoscaler settings with quota occupancy, and nodes. Ends with a
/// newline.
std::string describe(const topology& t);

} // namespace troupe::cluster
