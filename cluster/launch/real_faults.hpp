// real_faults: a simulator fault plan turned into actions on a launched cluster's processes.
//
// `troupe sim --faults plan.toml` injects a plan's faults into the simulated graph; `troupe
// launch --faults plan.toml` executes the same plan (same format, same seeded expansion) on
// real processes, so that what the swarm proves in virtual time can be tried on a real
// cluster. This file is the translation, a pure function so that it can be tested without
// processes; the launcher (launch_command.cpp) carries the actions out at their times,
// counted from the moment the cluster serves.
//
// | plan fault | on the target's processes |
// |---|---|
// | fail (gpu, instance, pool, node) | SIGKILL; with a `duration`, down until it ends; without, a gpu or node stays down until a `recover`, an instance or pool is restarted by the launcher at once |
// | fail (gpu of an instance of several) | the GPU is marked failed and the process killed; it restarts at once on the GPUs left when they form an EP group (the EP resize rule), else stays down until enough recover; `duration` or a `recover` marks the GPU healthy again |
// | recover | restarted at once (if held down by a fail) |
// | partition (instance, pool, node) | SIGSTOP for the duration, then SIGCONT: alive but unreachable |
// | partition (link A <-> B), with --hosts | the network between the hosts of A's and B's processes is cut for the duration: B's host drops every packet to and from A's host (its agent adds blackhole routing rules, and removes them itself when the duration ends) |
// | slow by factor f | SIGSTOP/SIGCONT duty cycle of 200 ms periods, stopped 1 − 1/f of each |
// | drain (decode) | SIGTERM: the process drains with its --grace (the plan's grace is not used) |
// | store_fail (shard) | SIGKILL of the store process; with a `duration`, down until it ends, without, until a `recover` of the shard |
// | store_slow (shard) by factor f | the store process's duty cycle, as `slow` |
//
// A gpu target is its instance's process (its ranks are threads of that process). Every [[node]] is this
// host, so a node target is every instance process of the pools whose role the node lists.
// A shard target is the store process, which holds every shard's blocks (with
// `store_process`: the cluster has one). A link partition or slowdown needs hosts of their own (`hosts`:
// `troupe launch --hosts`): the processes of one host share its loopback, so there neither
// is executed; they and surges (traffic comes from a real cluster's clients) are returned as
// not executed, with the reason.
#pragma once

#include "cluster/sim/fault_plan.hpp"
#include "cluster/topology.hpp"
#include "runtime/time.hpp"

#include <string>
#include <vector>

namespace troupe::cluster {

enum class process_action_kind {
  kill,     ///< SIGKILL, and hold the process down (no restart) until a `release`
  release,  ///< restart the process if it is held down
  stop,     ///< SIGSTOP
  resume,   ///< SIGCONT
  term,     ///< SIGTERM (the process drains and exits)
  cut,      ///< cut the network between the hosts of `process` and `peer` for `length`
  slow,     ///< slow the network between the hosts of `process` and `peer` by `factor` for `length`
  /// GPU `gpu` of the process's instance (an EP group of several) failed: SIGKILL, and the
  /// process restarts at once on its healthy GPUs when they form an EP group, else it is held
  /// down until enough recover; when the GPU's rank runs in a rank process of the instance
  /// (`ranks_per_process`), SIGKILL of that process instead, and the instance re-forms by
  /// itself on the ranks left
  fail_gpu,
  /// GPU `gpu` is healthy again: a process held down for want of GPUs restarts once they form
  /// a group; a running one regains it at its next restart
  heal_gpu,
};

std::string to_string(process_action_kind k);

struct process_action {
  runtime::duration at{0};  ///< since the cluster started serving
  process_action_kind kind = process_action_kind::kill;
  std::string process;      ///< "decode/0", "prefill/1"...
  std::size_t fault = 0;    ///< index of the fault in the timeline
  /// A cut or slowdown: the process at the link's other end, and how long it lasts.
  std::string peer;
  runtime::duration length{0};
  /// A slowdown: by how much.
  double factor = 1;
  /// fail_gpu, heal_gpu, and stop / resume of a GPU target: the GPU (rank) of the instance,
  /// and the instance's configured GPUs (its pool's gpus_per_instance; 0: the target is not a
  /// GPU of an instance of several). A GPU whose rank runs in a rank process of the instance
  /// stops and resumes alone (a straggler the group waits for).
  std::uint32_t gpu = 0;
  std::uint32_t configured = 0;
  /// ...and the ranks its process runs itself (its pool's ranks_per_process; 0: all of them).
  std::uint32_t ranks_per_process = 0;
};

struct real_fault_plan {
  /// Ordered by time, then fault, then process (stable).
  std::vector<process_action> actions;
  /// "<at> <kind> <target>: <why>" for each fault with no real counterpart.
  std::vector<std::string> not_executed;
};

/// The process of shard `index` of a store of `shards` shards under `troupe launch`: "store"
/// for one shard, else "store/<index>".
std::string store_process_name(std::uint32_t index, std::uint32_t shards);

/// The actions that carry out `timeline` (sim::expand's) on the processes of `topo` as
/// `troupe launch` runs it (pool "prefill" instance i is process "prefill/i"; the block store,
/// with `store_process`, is one process per shard of `storage.shards`, and a fault on shard k
/// acts on the process of shard k modulo that count: a plan written for the simulator's 8
/// shards kills the one store process of an unsharded cluster). With `hosts` the processes run
/// on the hosts of a hosts file, so a link partition cuts the network between hosts.
real_fault_plan plan_real_faults(const std::vector<sim::fault>& timeline, const topology& topo,
                                 bool store_process = false, bool hosts = false);

} // namespace troupe::cluster
