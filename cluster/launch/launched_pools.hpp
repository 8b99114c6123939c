// launched_pools: the prefill and decode pools of a launched cluster, as the autoscaler sees a
// pool supervisor.
//
// Under `troupe serve` the autoscaler (actors/autoscaler) acts on the pools' supervisors: it
// lists their instances, starts one with `start_child`, drains a decode engine and then
// `stop_child`s its instance. Under `troupe launch` an instance is an OS process that the
// launcher starts, restarts and stops, so the control process runs the same autoscaler on
// stand-ins that speak the supervisor protocol and turn it into orders to the launcher:
//
//   - the root (spawn_launched_pools) lists the two pools by name, once a launcher has
//     registered (launcher_atom); before, and after the launcher went away, it answers with an
//     error, and the autoscaler makes no decision;
//   - a pool lists the instance processes of its role the launcher reports (instances_atom,
//     pushed at registration and on every change), each as "<pool>/<index>" with a handle while
//     its process runs or moves to another host (the autoscaler counts it as starting, not as
//     down: it does not replace it) and none while it is down (restarting after a crash,
//     killed by a fault);
//     `start_child` orders the process (scale_start_atom) and answers once the launcher lists
//     it, `stop_child` orders its stop (scale_stop_atom: SIGTERM, the process drains and is not
//     restarted) and answers once the launcher no longer lists it;
//   - an instance answers `which_children` with one "engine" child, itself, once the process's
//     engine has announced itself (the balancer relay the process registered with the root
//     knows it), passes `engine_stats_atom` on to that engine, and takes `drain_atom` as its
//     process's stop: the process drains itself as on SIGTERM (a decode engine serves for the
//     pool's grace, then forwards what it holds with its KV and stays until the next instances
//     pulled it), and the answer is what the process reported forwarding before it exited.
//
// An instance process finds the root in the control directory (control_directory::scaler),
// registers its balancer relay there ((caf::put_atom, name, relay)) and, draining, reports what
// it forwarded (left_atom) before it exits.
#pragma once

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster {

/// An instance process of a launched cluster, as the launcher reports it.
struct launched_instance {
  /// "prefill" or "decode".
  std::string role;
  std::uint32_t index = 0;
  /// The launcher's state of the process: "running", "restarting", "down", "stopped" (a
  /// SIGSTOP fault), "lost" (its host is gone), "exited", "moving" (its host left the hosts
  /// file: from its drain there until it runs on another); "failed" once when it could not be
  /// started.
  std::string state;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, launched_instance& x) {
  return f(caf::meta::type_name("launched_instance"), x.role, x.index, x.state);
}

/// (launcher_atom, launcher) -> ok: the launcher registers with the root; it then receives the
/// orders below.
using launcher_atom = caf::atom_constant<caf::atom("launcher")>;
/// (instances_atom, std::vector<launched_instance>): the launcher's list of instance processes.
using instances_atom = caf::atom_constant<caf::atom("instances")>;
/// (scale_start_atom, role, index): start instance process "<role>/<index>" (and, for a
/// prefill instance, its block fetcher when the cluster runs them).
using scale_start_atom = caf::atom_constant<caf::atom("scalestart")>;
/// (scale_stop_atom, role, index): stop it with SIGTERM and do not restart it; a process that
/// is not running is dropped at once.
using scale_stop_atom = caf::atom_constant<caf::atom("scalestop")>;
/// (left_atom, name, forwarded) -> ok: instance process `name` ("decode/2") drained and is
/// leaving, having forwarded `forwarded` requests; the root keeps the count for the drain's
/// answer.
using left_atom = caf::atom_constant<caf::atom("left")>;

/// Spawns the root of the pool stand-ins (see the file comment) for the topology's pools named
/// `prefill_pool` and `decode_pool`; the pools and instances are its linked children.
caf::actor spawn_launched_pools(caf::actor_system& sys, std::string prefill_pool,
                                std::string decode_pool);

} // namespace troupe::cluster
