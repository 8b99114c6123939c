// sim_command: `troupe sim`, the simulated cluster from the command line.
//
// Loads a topology and a workload (a trace file, or a seeded synthetic generator), runs the
// simulation with a progress bar on stderr, writes the report files, and prints the terminal
// summary (or report.json with --json). Kept out of main.cpp so that tests can call it.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace troupe::cluster::sim {

struct sim_command_options {
  std::string topology;
  /// A Mooncake .jsonl or Azure .csv trace; or, when empty, `workload`.
  std::string trace;
  /// chat | agent | mixed (used when no trace is given).
  std::string workload = "chat";
  double rate = 1.0;
  std::string duration = "10min";
  double speedup = 1.0;
  std::uint64_t seed = 0;
  std::string until;
  std::optional<std::size_t> limit;
  std::string report_dir;
  bool quiet = false;
  bool json = false;
  bool strict = false;
  /// A fault plan (TOML) to validate against the topology, inject (fault_injection.hpp) and
  /// list in the report's `faults` timeline.
  std::string faults;
  /// Print on stderr, after the run, its events by actor and message type (count, share,
  /// wall time): `--profile`.
  bool profile = false;
  /// Record the run's history and check it (history_checker.hpp): `--check-history`. A
  /// `--swarm-seed` replay always does, as the swarm did.
  bool check_history = false;
  /// Replays `troupe swarm`'s seed S: its drawn workload, fault plan, seed and liveness bound
  /// (cluster/sim/swarm.hpp) instead of --trace / --workload / --faults / --seed / --until.
  /// Requests still unfinished at the bound are a failure (exit 2), as in the swarm.
  std::optional<std::uint64_t> swarm_seed;
  /// Speculative decoding: off, fixedK (K = 1..5 drafts verified every step) or dspark.
  std::string spec = "off";
  /// Overlapped decode scheduling: on or off (sim_params::overlap).
  std::string overlap = "on";
  /// The routed experts' load skew and their placement (sim_params::expert_skew, eplb):
  /// `--expert-skew S`, `--eplb`.
  double expert_skew = 0.0;
  bool eplb = false;
  /// The share of requests under a structured-output constraint (sim_params::structured_share).
  double structured = 0.0;
  /// How a hit's window state is rebuilt: bounded or exact (sim_params::exact_rebuild).
  std::string swa_rebuild = "bounded";
  /// on: a prompt's blocks move to its decode instance while its prefill computes.
  bool kv_stream = false;
  /// The experts' load drift (one hot rank on per this duration; empty: none) and the expert
  /// balancer's interval (sim_params::expert_drift, eplb_interval).
  std::string expert_drift;
  std::string eplb_interval = "5min";
  /// TEST ONLY: sim_params::test_drop_on_reroute (hidden `--plant-bug`).
  bool plant_bug = false;
};

/// Runs the command; the summary (or JSON) goes to `out`, diagnostics and progress to `err`.
/// Returns the process exit status: 0 on success, 1 on a bad input (including an invalid
/// fault plan) or a failed run, 2 when the run broke an invariant (each violation is printed
/// to `err` as `request <id>: <what happened>`, after the report was written).
int run_sim_command(const sim_command_options& options, std::ostream& out, std::ostream& err);

} // namespace troupe::cluster::sim
