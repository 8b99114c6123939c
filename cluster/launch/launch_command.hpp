// launch_command: `troupe launch`, a topology as OS processes under one supervisor.
//
// `troupe serve` runs the whole serving graph in one process. A cluster runs it as processes:
// one control process (KV CHECK role, balancers, HTTP entrypoint) and one process per engine
// instance of the prefill and decode pools, each a `troupe node` (node_command.hpp) joined to
// the control process by CAF's middleman. `troupe launch` starts them and is their root
// supervisor, as a supervisor actor is in the simulator: a process that exits abnormally (a
// signal, or a non-zero status) is restarted after a delay, unless more than the restart
// intensity's restarts happened within its period — then the launcher stops the cluster and
// fails. A process's death reaches the actors that monitored its actors (balancers, request
// actors) as a down message, so requests are rerouted as after a simulated instance failure.
//
// The launcher writes the cluster's state (each process's name, role, pid, restarts and
// state, and the control's addresses) as JSON to `--state FILE` whenever it changes, and
// `--dry-run` prints the placement: every process with its command line. SIGTERM or SIGINT
// stops the cluster: instances first (each drains), then the control process. `--faults`
// executes a simulator fault plan on the processes (real_faults.hpp), and `--events` keeps a
// JSON-lines log of what happened to each process. With `--slurm` the same command line
// becomes a heterogeneous Slurm job instead, submitted and followed (slurm_launch.hpp).
#pragma once

#include "cluster/launch/slurm_job.hpp"
#include "cluster/sim/result.hpp"
#include "cluster/serve_command.hpp"
#include "runtime/transport.hpp"

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

struct launch_options {
  /// What every process serves: the topology, model, tokenizer, store, threads, API keys...;
  /// `serve.listen` is the HTTP address of the control process.
  serve_options serve;
  /// HOST:PORT of the control process's directory (port 0: a free port chosen at launch).
  std::string control = "127.0.0.1:0";
  /// Print the placement and exit.
  bool dry_run = false;
  /// Write the cluster's state here (JSON) whenever it changes; empty: nowhere.
  std::string state_file;
  /// The troupe executable the processes run (empty: this one).
  std::string executable;
  /// Restart intensity: more than `max_restarts` restarts within `restart_period` stops the
  /// cluster. A process is restarted `restart_delay` after it died.
  std::uint32_t max_restarts = 10;
  std::chrono::seconds restart_period{60};
  std::chrono::milliseconds restart_delay{1000};
  /// A fault plan of the simulator's format, executed on the processes (real_faults.hpp),
  /// its times counted from the moment the cluster serves; empty: none.
  std::string faults_file;
  /// The seed of the plan's expansion (jitter, `*` indices), as `troupe sim --seed`.
  std::uint64_t seed = 1;
  /// Periodic faults are expanded up to this long after serving starts.
  std::chrono::seconds fault_horizon{3600};
  /// Mutual TLS between the launcher, the agents and every process (runtime/transport.hpp);
  /// the same CA, certificate and key files are given to every process (a shared filesystem).
  runtime::tls_options tls;
  /// The TLS files of the processes the launcher starts, when they are not the launcher's own
  /// (`tls`): with the agents and the launcher under a CA of their own, and the processes
  /// under the cluster's, a process cannot reach an agent (docs/tls.md). Needs `tls`.
  runtime::tls_options node_tls;
  /// The libfabric provider instances move KV between processes by ("tcp", "shm", "none").
  std::string fabric = "tcp";
  /// Passed to every process: a prompt's blocks cross while its prefill computes (on), or in
  /// one transfer after it (off; node_options::kv_stream).
  bool kv_stream = true;
  /// A block fetcher process beside each prefill instance (`fetcher/<i>`, on its host) reads
  /// the cached blocks its engine asks for (block_fetcher.hpp), when the cluster has a store.
  bool block_fetchers = true;
  /// A hosts file (launch_host below): the processes are placed on its hosts and started by
  /// each host's `troupe agent`; empty: every process on this host (an agent in-process).
  std::string hosts_file;
  /// Append one JSON line per event here (process started / exited / restarted, fault action
  /// carried out), with `t` in seconds since the launch; empty: nowhere.
  std::string events_file;
  /// Submit the cluster to Slurm as one heterogeneous job and follow it (slurm_launch.hpp)
  /// instead of starting its processes here.
  bool slurm = false;
  /// With `slurm`: the job's placement (partition, account, time limit, machine sizes, output
  /// file...); its topology, troupe command, model, ports and node arguments are filled in
  /// from the options above.
  slurm_options slurm_job;
};

/// A host of a hosts file: `[[host]]` with `name`, `agent = "HOST:PORT"` (where its `troupe
/// agent` listens; its HOST is also the address the host's processes are reached at),
/// `roles` (any of "control", "store", "prefill", "decode": what may run there; the store
/// process runs where the control process may when no host lists "store") and, optionally,
/// `devices`: how many engine devices (GPUs; CPU engines for device = "cpu") the host has.
/// Each prefill or decode instance process takes one; a host without `devices` takes any
/// number.
struct launch_host {
  std::string name;
  std::string agent;
  std::vector<std::string> roles;
  std::optional<std::uint32_t> devices;
};

/// Whether a process of `role` takes one of its host's devices (a prefill or decode instance).
bool takes_device(const std::string& role);

/// Reads and checks a hosts file: names unique, agents HOST:PORT, roles known, devices >= 1, a
/// host for each of control, prefill and decode. Nothing after the problems were written to
/// `err`.
std::optional<std::vector<launch_host>> load_hosts(const std::string& file, std::ostream& err);

/// One process of a launched cluster.
struct launch_process {
  /// "control", "store", "prefill/0", "decode/1"...
  std::string name;
  /// The host it runs on ("local" without a hosts file).
  std::string host;
  std::string role;
  std::uint32_t index = 0;
  std::vector<std::string> argv;
};

/// The processes of the topology of `o` (its checked inputs), with their hosts and command
/// lines, the control process first, then the `store_shards` store processes (none: the
/// cluster has no block store; store_process_name), then the instances (each prefill instance
/// followed by its block fetcher when the cluster has a store and `o.block_fetchers`, on the
/// same host), each pool's instances and the store's shards round-robin
/// over the hosts that take its role (all on "local" when `hosts` is empty), an instance
/// skipping the hosts whose `devices` are all taken. `control` is the resolved control
/// address. Fails when an instance finds no host with a free device.
sim::result<std::vector<launch_process>> plan_launch(const launch_options& o, std::uint32_t prefill,
                                        std::uint32_t decode, std::uint32_t store_shards,
                                        const std::string& control,
                                        const std::string& ready_file,
                                        const std::vector<launch_host>& hosts);

/// Runs `troupe launch`: the placement with `dry_run` (on `out`), else the cluster until
/// SIGTERM / SIGINT. Returns the exit status: 0 after a clean stop, 1 on bad input, a failed
/// start or exceeded restart intensity.
int run_launch_command(const launch_options& o, std::ostream& out, std::ostream& err);

} // namespace troupe::cluster
