// fault_plan: what goes wrong in a simulated run, and when — loaded, validated, expanded.
//
// "Nothing lost" is only worth claiming for a cluster that was made to fail. A fault plan is a
// TOML file of `[[fault]]` entries, each a time (`at`, or a period `every` with a seeded
// `jitter`), a target (a GPU `pool/instance/rank`, an instance, a `[[node]]`, a whole pool, a
// KV store shard, or the link between two instances or pools) and a kind: fail, recover, slow,
// partition, drain, surge, store_fail, store_slow. A plan is checked against the topology it
// will run on — pools, instance indices, ranks and shards must exist, factors and durations
// must be in range — with the same `file:line:col: key.path: what is wrong (hint)`
// diagnostics as topology files, every problem at once. `expand` turns the periodic entries
// and `*` wildcards into concrete timed faults with a seeded rng: same plan, seed and
// horizon ⇒ same timeline.
//
// The format is documented in docs/faults.md. Injection into the actor graph is not here:
// fault_injection.cpp turns each kind into orders for actors/fault_injector; a kind and target
// it does not inject is listed in the report as not injected.
#pragma once

#include "cluster/diagnostic.hpp"
#include "cluster/topology.hpp"
#include "runtime/random.hpp"
#include "runtime/time.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster::sim {

/// What happens to the target.
enum class fault_kind {
  fail,       ///< gpu, instance, node or pool goes down (optionally for `duration`)
  recover,    ///< a failed gpu, instance, node, pool or store shard comes back
  slow,       ///< gpu, instance, node, pool or link runs `factor` times slower for `duration`
  partition,  ///< link, instance, node or pool is cut off for `duration`
  drain,      ///< a decode instance is told to leave (grace period, then hand-off)
  surge,      ///< the whole workload's arrival rate × `factor` for `duration` (no target)
  store_fail, ///< a KV store shard goes down (optionally for `duration`)
  store_slow, ///< a KV store shard answers `factor` times slower for `duration`
};

/// What a fault hits.
enum class target_kind { none, gpu, instance, node, pool, shard, link };

/// The lowercase name as written in plans ("store_fail", "gpu", ...).
std::string_view to_string(fault_kind kind) noexcept;
std::string_view to_string(target_kind kind) noexcept;

/// An index written as `*` in a plan: drawn by `expand` (instances among the pool's initial
/// ones, ranks among the instance's GPUs).
inline constexpr std::uint32_t any_index = std::numeric_limits<std::uint32_t>::max();

/// A place in a pool: the pool, or one instance of it, or one rank of that instance.
struct fault_place {
  std::string pool;
  std::optional<std::uint32_t> instance; // any_index: drawn at expansion
  std::optional<std::uint32_t> rank;     // any_index: drawn at expansion
  /// What a `*` draws from: the pool's initial instance count and its GPUs per instance
  /// (filled in by validation).
  std::uint32_t initial_instances = 0;
  std::uint32_t gpus_per_instance = 0;
};

/// The target of a fault. `place` holds gpu / instance / pool targets and a link's first end,
/// `peer` a link's second end.
struct fault_target {
  target_kind kind = target_kind::none;
  fault_place place;
  fault_place peer;
  std::string node;       // node targets: a [[node]] name
  std::uint32_t shard = 0; // shard targets: a KV store shard index

  /// True when an index is still `*`.
  bool has_wildcard() const noexcept;
};

/// "gpu decode/0/3", "instance decode/*", "pool prefill", "node node-3", "shard 2",
/// "link prefill/0 <-> decode", "all traffic".
std::string to_string(const fault_target& target);

/// One `[[fault]]` entry as written (validated, defaults filled in).
struct fault_entry {
  std::uint32_t line = 0; // of its [[fault]] header
  fault_kind kind = fault_kind::fail;
  fault_target target;
  /// One-shot: its time since the start. Periodic: its first occurrence (`start`, default
  /// `every`).
  runtime::duration at{0};
  std::optional<runtime::duration> every;  // periodic entries only
  runtime::duration jitter{0};             // each occurrence moves uniformly in ±jitter
  std::optional<runtime::duration> until;  // last possible occurrence (default: the horizon)
  double factor = 1;                       // slow, store_slow, surge: > 1
  std::optional<runtime::duration> duration; // required by slow, partition, surge, store_slow
  runtime::duration grace{0};              // drain: the pool's grace unless given
  std::string note;                        // free text for people
};

/// A validated plan.
struct fault_plan {
  std::string source; // the file name it was loaded from (as given)
  std::string name;   // optional `name` at the top of the file
  std::vector<fault_entry> entries; // in file order
};

/// What a plan is validated against besides the topology.
struct fault_limits {
  /// Shards of the KV store (sim_params::kv_shards).
  std::uint32_t store_shards = 8;
};

/// The outcome of loading a plan: the plan when valid, otherwise every problem in line order.
struct fault_plan_result {
  std::optional<fault_plan> value;
  std::vector<diagnostic> errors;

  bool ok() const noexcept { return value.has_value(); }
};

/// Parses and validates plan text against `topo`; `file_name` only labels the diagnostics.
/// Never throws: a TOML syntax error (the first; the parser stops there) and every validation
/// problem come back in `errors`.
fault_plan_result parse_fault_plan(std::string_view text, std::string_view file_name,
                                   const topology& topo, const fault_limits& limits = {});

/// Reads and validates a plan file. An unreadable file is a single diagnostic at 1:1.
fault_plan_result load_fault_plan(const std::filesystem::path& file, const topology& topo,
                                  const fault_limits& limits = {});

/// One concrete fault of the timeline: no period, no wildcard.
struct fault {
  runtime::duration at{0}; // since the start of the run
  fault_kind kind = fault_kind::fail;
  fault_target target;
  double factor = 1;
  std::optional<runtime::duration> duration;
  runtime::duration grace{0};
  std::size_t entry = 0;  // index of its entry in the plan
  std::uint32_t line = 0; // line of that entry
  std::string note;
};

/// The plan's concrete faults up to `horizon` (inclusive), ordered by time, then entry, then
/// occurrence. Entry i draws only from `random.split("fault", i)` (its jitter, then its
/// wildcards, occurrence by occurrence), so the timeline depends only on the plan, the
/// stream's key and the horizon — not on other entries. A jittered time below zero becomes
/// zero; one past the horizon or the entry's `until` is dropped.
std::vector<fault> expand(const fault_plan& plan, const runtime::rng& random,
                          runtime::duration horizon);

/// The timeline as JSON: one object per fault with `at_s`, `kind`, `target`, the `line` of its
/// entry, and `factor`, `duration_s`, `grace_s`, `note` where they apply.
nlohmann::json to_json(const std::vector<fault>& timeline);

} // namespace troupe::cluster::sim
