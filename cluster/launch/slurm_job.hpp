// A Slurm batch script for a topology: a heterogeneous job with one component per role.
//
// On an HPC cluster run by Slurm, troupe does not place processes itself: the topology becomes
// one heterogeneous job (`sbatch` hetjob components) whose component 0 is the control process
// (KV CHECK role, load balancers, HTTP entrypoint) and, when the cluster has a block store, the
// store process (cluster/launch/store_bridge.hpp), and whose further components are the pools,
// each sized for its initial instances (whole machines for instances that span machines, shared
// machines for small ones, see deploy_layout.hpp). The script then starts one `srun` job step
// per process group: the control (and the store) in component 0, and per pool and instance
// index one step in the pool's component running `troupe node ... --role R --index N
// --control ADDR`, where ADDR
// is the NodeAddr of the control component's first machine. An instance spanning P machines is
// one step of P tasks (one per machine, SLURM_PROCID its rank). With a block store, a prefill
// instance on one machine has its block fetcher in its step (block_fetcher.hpp): the step's
// shell starts it under `troupe_respawn` (a function the script exports, which restarts it
// when it dies), then becomes the prefill process. Because every step is a child of the
// job, `scancel` (or the time limit) signals them all: SIGTERM starts the decode drain.
#pragma once

#include "cluster/sim/result.hpp"
#include "cluster/topology.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster {

/// What the batch script is built from besides the topology.
struct slurm_options {
  std::string topology_path;         // the topology file as the job's machines see it; required
  std::string troupe = "troupe";     // the troupe command on the machines
  std::string job_name;              // empty: "troupe-<cluster name>"
  std::string output;                // --output of the batch step; empty: "troupe-%j.out"
  std::string partition;             // empty: the site's default partition
  std::string account;               // empty: the user's default account
  std::string time_limit;            // --time, Slurm's syntax ("2-00:00:00"); empty: default
  std::uint32_t gpus_per_node = 0;   // GPUs per machine; 0: the hardware profile's
  std::uint16_t http_port = 8000;    // the control's HTTP API
  std::uint16_t control_port = 4242; // the control's port instance processes join
  std::uint32_t control_cpus = 4;    // CPUs of the control step
  std::uint32_t cpus_per_gpu = 8;    // CPUs per GPU (per CPU device on hardware cpu) of a step
  std::string model_dir;             // --model of every process (needed); empty: not passed
  std::string store_dir;             // --kv-dir of the store process; empty: the topology's
  std::string bind = "0.0.0.0";      // the address the control publishes and serves HTTP on
  std::vector<std::string> node_args; // more arguments of every `troupe node` (e.g. --threads 4)
  bool block_fetchers = true;         // a block fetcher beside each one-machine prefill instance
                                      // (when the cluster has a block store)
};

/// One component of the heterogeneous job, as the script requests it.
struct slurm_component {
  std::string name;                  // "control" or the pool's name
  std::string role;                  // "control", "prefill", "decode" or "vision"
  std::uint32_t instances = 0;       // instances started in it (1 for the control)
  std::uint32_t nodes = 0;           // machines requested
  std::uint32_t tasks = 0;           // processes in all (the control's: 1 + one per store shard)
  std::uint32_t tasks_per_instance = 0;
  std::uint32_t gpus_per_node = 0;   // GRES gpu per machine requested (0: none)
  std::uint32_t gpus_per_task = 0;   // GPUs of one process
  std::uint32_t cpus_per_task = 0;
  bool fetchers = false;             // each prefill instance's step also runs its block fetcher
};

/// The batch script and the components it requests (component i is --het-group=i).
struct slurm_job {
  std::string script;
  std::vector<slurm_component> components;
};

/// The heterogeneous job for `topo`: component 0 is the control, then one component per pool
/// of at least one initial instance, in file order. The script is deterministic (same
/// topology and options, same bytes), starts with a bash shebang and #SBATCH lines, starts
/// every process with srun in the background and waits for them all; its exit status is
/// non-zero when any step failed. Fails with one message for a missing topology path, equal
/// or zero ports, or an instance that does not fit the machines.
sim::result<slurm_job> make_slurm_job(const topology& topo, const slurm_options& opts);

} // namespace troupe::cluster
