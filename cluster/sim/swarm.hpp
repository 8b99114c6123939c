// swarm: many seeded simulated runs, each with a fault plan drawn from its seed.
//
// A hand-written fault plan tests the failures somebody thought of. The swarm, in the spirit
// of FoundationDB's BUGGIFY and TigerBeetle's VOPR, lets the seed choose: which fault kinds are
// switched on for this seed, how many faults, when, and what they hit, plus a short seeded
// synthetic workload (chat and agent sessions) — then runs the simulation and checks the
// invariants. Everything is drawn from `rng(seed).split("swarm")`, so a seed is a complete,
// replayable test case: `troupe sim TOPOLOGY --swarm-seed S` rebuilds the same workload and
// plan and runs them again, byte for byte. Some seeds also draw short block TTLs and tight
// decode limits, and every seed records its run's history and checks it
// (history_checker.hpp); docs/faults.md, "Swarm", lists the draws.
#pragma once

#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/trace.hpp"
#include "cluster/topology.hpp"

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// One seed's test case: its workload, its fault timeline and the options to run them with.
struct swarm_case {
  std::uint64_t seed = 0;
  std::vector<request_record> records;
  /// seed, faults and `until` (the liveness bound) filled in.
  sim_options options;
  /// What the draw chose, for people: rate, duration, agent share, enabled kinds.
  nlohmann::json drawn;
};

/// Draws seed `seed`'s case on `topo` (which must have a prefill and a decode pool). Depends
/// only on the topology and the seed. `plant_bug` sets the test-only
/// sim_params::test_drop_on_reroute (docs/faults.md, "Swarm").
swarm_case draw_swarm_case(const topology& topo, std::uint64_t seed, bool plant_bug = false);

/// What is wrong with a swarm run, one line each: an error of the run, every invariant
/// violation, and requests still unfinished at the liveness bound. Empty: the seed passed.
std::vector<std::string> swarm_problems(const result<sim_outcome>& outcome);

/// The paths a run took, by name, with how often (only those taken): the requests a drain
/// forwarded (`forwards`), rerouted (`reroutes`) and failed (`failed requests`), the decode
/// balancer's spills, KV blocks expired or evicted, and each kind of timeline event (the faults
/// injected, restarts, EP resizes, instances that stay down, autoscaling).
std::map<std::string, std::uint64_t> swarm_coverage(const nlohmann::json& report);

/// One seed's verdict.
struct swarm_seed_result {
  std::uint64_t seed = 0;
  std::vector<std::string> problems;
  std::uint64_t requests = 0;
  std::uint64_t faults = 0;
  /// swarm_coverage of its run (empty when the run failed or had nothing to run).
  std::map<std::string, std::uint64_t> coverage;

  bool passed() const noexcept { return problems.empty(); }
};

/// Draws, runs and checks one seed.
swarm_seed_result run_swarm_seed(const topology& topo, std::uint64_t seed, bool plant_bug = false);

struct swarm_command_options {
  std::string topology;
  /// Seeds first..last, inclusive, written "A..B" (or a single seed "A").
  std::string seeds = "0..99";
  unsigned jobs = 1;
  bool plant_bug = false; // test-only, hidden from --help
  bool quiet = false;
  /// How the replay command names the troupe binary (argv[0]).
  std::string program = "troupe";
};

/// Parses "A..B" (A ≤ B) or "A". False with a message in `error` otherwise.
bool parse_seed_range(const std::string& text, std::uint64_t& first, std::uint64_t& last,
                      std::string& error);

/// `troupe swarm`: runs every seed on `jobs` threads, prints progress on `err`, then
/// `N passed, M failed` on `out`, the coverage (per path of swarm_coverage: in how many seeds
/// it was taken, and how often in all) and, per failing seed (in seed
/// order), its first problems and the one-line command that replays it. Returns 0 when every seed passed, 2 when one
/// failed, 1 on a bad input.
int run_swarm_command(const swarm_command_options& options, std::ostream& out, std::ostream& err);

} // namespace troupe::cluster::sim
