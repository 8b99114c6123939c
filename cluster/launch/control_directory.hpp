// control_directory: how an instance process of `troupe launch` finds the control process.
//
// A launched cluster's control process (the KV CHECK role, the balancers, the HTTP
// entrypoint) and its instance processes are joined by CAF's middleman. The control process
// publishes one actor, the directory, on its control address; an instance process connects
// to it, asks for the handles it needs (the CHECK role its block writers commit to, the
// balancer its engine announces itself to, and the registry of the cluster's block store,
// where a store process registers its store), and monitors it: when the control process goes
// away, so does the connection, and the instance process exits for the launcher to restart.
// An orderly stop of the control process is told apart from a loss: each instance process
// joins the directory with a watcher, and the control process, before it stops, has the
// directory tell every watcher (stopping_atom) and waits for their answers. An orchestrator
// that signals every process at once (scancel) may reach an instance after the control
// process has gone; the instance then still knows the cluster was stopped, not lost.
#pragma once

#include "actors/wire_type_ids.hpp"
#include "cluster/launch/block_fetcher.hpp"
#include "cluster/launch/kv_bridge.hpp"
#include "cluster/launch/launched_pools.hpp"
#include "cluster/launch/store_bridge.hpp"
#include "cluster/real_graph.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include <chrono>

namespace troupe::cluster {

/// The control process's handles, as an instance process needs them.
struct control_directory {
  caf::actor kv;
  caf::actor prefill_lb;
  caf::actor decode_lb;
  /// The registry of the cluster's block store (store_bridge.hpp); invalid: the cluster has
  /// no store.
  caf::actor store_registry;
  /// The shards that registry has (one per store process; one for a store of the control
  /// process, whatever its own sharding).
  std::uint32_t store_shards = 1;
  /// Copies of each block over those shards (storage.replicas).
  std::uint32_t store_replicas = 1;
  /// The registry of the cluster's block fetcher processes (block_fetcher.hpp).
  caf::actor fetchers;
  /// The autoscaler's stand-ins for the pools (launched_pools.hpp), where the launcher
  /// registers and an instance process registers its balancer relay; invalid: the topology's
  /// pools are not autoscaled.
  caf::actor scaler;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_directory& x) {
  return f(caf::meta::type_name("control_directory"), x.kv, x.prefill_lb, x.decode_lb,
           x.store_registry, x.store_shards, x.store_replicas, x.fetchers, x.scaler);
}

using directory_atom = caf::atom_constant<caf::atom("directory")>;
using stopping_atom = caf::atom_constant<caf::atom("stopping")>;
/// Asks a joined process's watcher for its metrics (std::vector<runtime::metric_samples>);
/// the directory's own timer to ask them all.
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using mirror_tick_atom = caf::atom_constant<caf::atom("mirrortick")>;
/// (reformed_atom, name, pid, ranks): instance process `name` ("decode/0", process `pid`) lost
/// EP rank processes and re-formed on `ranks` ranks. An instance process tells the directory;
/// the directory tells the launcher registered with it ((launcher_atom, launcher) -> ok), and
/// on registration every report it has.
using reformed_atom = caf::atom_constant<caf::atom("reformed")>;

/// Spawns the directory of `control` (with the store registry, fetcher registry and pool
/// stand-ins given, each as control_directory names it): it answers (directory_atom) with a
/// control_directory;
/// (caf::join_atom, watcher) adds an instance process's watcher; (launcher_atom, launcher)
/// registers the launcher, which then gets the reformed_atom reports; (stopping_atom) sends
/// (stopping_atom) to every watcher and answers (caf::ok_atom) once each has answered or
/// `watcher_timeout` has passed. With `metrics`, every second it asks each watcher for its
/// process's metrics (metrics_atom) and mirrors them there (runtime::metrics_mirror): the
/// control process's /metrics shows the instance processes' devices; a process that goes away
/// leaves its counters counted and its gauges out.
caf::actor spawn_control_directory(caf::actor_system& sys, const control_graph& control,
                                   caf::actor store_registry, std::uint32_t store_shards,
                                   std::uint32_t store_replicas, caf::actor fetchers,
                                   caf::actor scaler,
                                   std::chrono::milliseconds watcher_timeout,
                                   runtime::registry* metrics = nullptr);

/// A stand-in balancer for one instance process: it forwards the instance's announcements
/// (add_instance_atom, drain_instance_atom) to the real balancer `lb` in the control process
/// and keeps the engine handle of the latest announcement, which it answers (get_atom) with
/// (an invalid handle before the first). The engine's process needs that handle to drain it.
/// The balancer is told of a bridge in front of the engine (kv_bridge.hpp), which moves KV
/// over `bridge.link` (if valid) and rebuilds structured-output constraints in this process.
/// The engines' reports of the window states their devices keep (prefill_kept) go to `kept_to`,
/// the prefill balancer; a decode engine's report names the bridge in front of it instead of
/// the engine, so that other processes' jobs ask the bridge for the state.
caf::actor spawn_balancer_relay(caf::actor_system& sys, caf::actor lb, caf::actor kept_to,
                                kv_bridge_params bridge);

/// Registers the message types of cluster/launch (the block below and node_agent.hpp's).
void register_launch_types(caf::actor_system_config& cfg);

} // namespace troupe::cluster

CAF_BEGIN_TYPE_ID_BLOCK(troupe_launch, troupe::actors::actors_wire_type_ids_end)
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::control_directory))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::store_fetch))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::store_fetched))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::store_deposit))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::store_binding))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::fetcher_join))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::fetcher_segment))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::fetch_block))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::fetched_block))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::runtime::metric_samples))
CAF_ADD_TYPE_ID(troupe_launch, (std::vector<troupe::runtime::metric_samples>))
CAF_ADD_TYPE_ID(troupe_launch, (troupe::cluster::launched_instance))
CAF_ADD_TYPE_ID(troupe_launch, (std::vector<troupe::cluster::launched_instance>))
CAF_END_TYPE_ID_BLOCK(troupe_launch)
