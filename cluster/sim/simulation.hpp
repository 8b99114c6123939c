// simulation: replays a workload through the serving actor graph in the simulated world.
//
// This is troupe's main job on a laptop. From a topology it builds the actor graph of the
// design — the KV store's CHECK role (sharded), prefill_lb, decode_lb and (with a vision
// pool) vision_lb, a supervisor per pool whose children are instances (ranks + engine, each
// rank on a simulated device costed by the performance model; decode instances also persist
// the blocks they fill), and an entrypoint that admits the workload's requests as
// request actors — then drives the virtual clock until every request has ended (or a
// deadline), and summarises what happened: a report that depends only on the topology,
// workload and seed (so it is byte-identical across runs and machines) and host figures kept
// apart.
#pragma once

#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/invariants.hpp"
#include "cluster/sim/perf_model.hpp"
#include "cluster/sim/result.hpp"
#include "cluster/sim/trace.hpp"
#include "actors/engine/decode_engine.hpp"
#include "cluster/topology.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/time.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// Knobs of the simulated world that a topology does not carry (documented defaults).
struct sim_params {
  /// Tokens per GPU per prefill step (chunked prefill budget).
  std::uint64_t prefill_tokens_per_gpu = 4096;
  /// Requests per GPU in a decode batch.
  std::uint32_t decode_requests_per_gpu = 128;
  /// KV length from which decode_lb treats a request as long.
  std::uint64_t decode_long_threshold = 32768;
  /// Share of decode instances reserved for long requests.
  double decode_long_share = 0.25;
  /// Store → device fetch path of one prefill instance (bytes/s, latency).
  double fetch_bandwidth = 40e9;
  runtime::duration fetch_latency = std::chrono::microseconds(200);
  /// Prefill → decode KV hand-off into one decode instance (bytes/s, latency).
  double handoff_bandwidth = 400e9;
  runtime::duration handoff_latency = std::chrono::microseconds(20);
  /// Shards of the KV store (its CHECK role); `troupe sim` takes the topology's
  /// `storage.shards` when it gives one.
  std::uint32_t kv_shards = 8;
  /// The modelled time of one KV store shard operation (a metadata round trip in the
  /// datacenter): a match (its probes, in parallel across shards) or an insert is answered
  /// this long after it reaches its shard; a `store_slow` multiplies it. A block writer's
  /// reserve / commit pair is not delayed (docs/kv-store.md).
  runtime::duration kv_store_latency = std::chrono::microseconds(200);
  /// Time an instance takes to come back after a failure.
  runtime::duration restart_time = std::chrono::minutes(3);
  /// prefill_lb re-derives engines per bucket this often.
  runtime::duration rebalance_interval = std::chrono::seconds(30);
  /// Encoder tokens per image (a request record carries only its image count).
  std::uint64_t image_tokens = 576;
  /// Images per GPU per vision encoder step.
  std::uint32_t vision_images_per_gpu = 16;
  /// A request not served within this time of its admission fails ("deadline").
  runtime::duration request_deadline = std::chrono::minutes(10);
  /// Reroutes (its instance died under it) after which a request gives up.
  std::uint32_t max_reroutes = 3;
  /// A request that no instance can take asks its balancer again this often.
  runtime::duration retry_interval = std::chrono::seconds(1);
  /// Decode reports delivered tokens to the request every this many tokens.
  std::uint64_t progress_every = 16;
  /// The share of requests with a structured-output constraint (the same requests for a
  /// seed), the host time to build one token mask (perf_options::mask_s: each decode step
  /// takes the longer of its forward and its GPUs' masks), and to compile a constraint
  /// (perf_options::compile_s: its first token waits for it).
  double structured_share = 0.0;
  double structured_mask_s = perf_options{}.mask_s;
  double structured_compile_s = perf_options{}.compile_s;
  /// Speculative decoding of the decode instances (decode_engine.hpp): off, fixed-length
  /// verification of `fixed_drafts` drafts, or DSpark's per-step choice under the performance
  /// model's step time; drafts accepted as `drafts` models them (assumed acceptance rates).
  actors::speculation speculation = actors::speculation::off;
  std::uint32_t fixed_drafts = 5;
  runtime::sim_draft_model drafts;
  /// Overlapped scheduling on the decode instances (decode_engine_params::overlap): off, every
  /// decode step waits for the scheduler's time (perf_options::schedule_*) after the previous
  /// one; on, it was built while that one ran.
  bool overlap = true;
  /// The routed experts' load: Zipf exponent over the experts (0: every expert alike, the
  /// performance model's calibration), and whether EPLB places them (one spare slot per rank
  /// for copies of hot experts) or they sit in contiguous ranges. Each EP group's steps wait
  /// for its busiest rank (perf_options::moe_balance, expert_balance).
  double expert_skew = 0.0;
  bool eplb = false;
  /// The load drifts: every `expert_drift` the hot ranking moves one expert on (0: fixed).
  runtime::duration expert_drift{0};
  /// With `eplb`: the expert balancer re-places the experts every `eplb_interval` by their load
  /// over the last interval (0: once, at start), switching `eplb_load_time` later (the ranks
  /// load the new copies meanwhile; actors/lb/expert_balancer.hpp).
  runtime::duration eplb_interval = std::chrono::minutes(5);
  runtime::duration eplb_load_time = std::chrono::seconds(10);
  /// How a cached prefix's window state is rebuilt on a hit: bounded replay of the prompt's
  /// last window (false) or exactly, layer by layer over its receptive field
  /// (prefill_engine_params::exact_rebuild_layers; docs/simulation.md, "Bounded replay").
  bool exact_rebuild = false;
  /// A prompt's full blocks move to the decode instance booked as its prefill began while its
  /// chunks compute (`troupe launch --kv-stream`: request_services::stream_kv), so the hand-off
  /// after the prefill moves only the rest. Off: one transfer of the whole KV after it.
  bool stream_kv = false;
  /// Block TTLs by traffic class name that replace the topology's `storage.ttl` entries (the
  /// swarm draws short ones, so that blocks expire within a run). Empty: the topology's.
  std::map<std::string, runtime::duration> kv_ttl;
  /// KV tokens a decode instance holds, whatever its size; 0: its HBM left after weights
  /// (capacity.hpp). The swarm draws small ones, so that routing meets the limit.
  std::uint64_t decode_kv_tokens = 0;
  /// TEST ONLY — a planted bug that proves the invariant checker and the swarm catch lost
  /// requests: on a reroute, a request drops the rest of its stream and reports itself
  /// completed. Reachable from the CLI only through the hidden `--plant-bug` flag of
  /// `troupe sim` / `troupe swarm` (docs/faults.md, "Swarm"). Never set it otherwise.
  bool test_drop_on_reroute = false;
  /// TEST ONLY — a planted autoscaler bug (autoscaler_params::test_order_one_more): every
  /// scale-up orders one instance more than decided, which the autoscaler invariants catch.
  bool test_autoscaler_order_one_more = false;
  /// TEST ONLY — a second planted bug, for the token-stream invariant: after a decode
  /// failure a request streams the positions it had delivered again (its count still comes
  /// out right). Not reachable from the CLI.
  bool test_replay_on_reroute = false;
  /// TEST ONLY — a planted KV bug (kv_index_params::test_ignore_expiry): the store serves
  /// expired blocks as hits, which the TTL invariant catches. Not reachable from the CLI.
  bool test_kv_ignore_expiry = false;
};

/// How to run.
struct sim_options {
  std::uint64_t seed = 0;
  /// Stop at this virtual time even if requests are still running (they count as unfinished).
  std::optional<runtime::duration> until;
  sim_params params;
  /// Called every `progress_every` of virtual time and at the end.
  std::function<void(const struct sim_progress_info&)> progress;
  runtime::duration progress_every = std::chrono::seconds(10);
  /// The expanded fault timeline to inject (times since the start of the run). Injected
  /// today: `fail` of a gpu or an instance and `drain` of a decode instance; the other kinds
  /// are listed as not injected yet. With faults, the report gets `faults` = {injected,
  /// timeline (each entry marked), ...}.
  std::vector<fault> faults;
  /// Record the run's history (actors/history.hpp) and check it (history_checker.hpp): its
  /// violations join `invariants`, its fact counts go to `report["invariants"]["history"]`.
  bool check_history = false;
  /// Count and time every event by actor and message type (sim_driver::set_profiling); the
  /// rows go to `run["profile"]`.
  bool profile = false;
};

struct sim_progress_info {
  double virtual_s = 0;
  std::uint64_t events = 0;
  std::uint64_t admitted = 0;
  std::uint64_t finished = 0;
  std::uint64_t total = 0;
};

/// What a run produced.
struct sim_outcome {
  /// Reproducible: depends only on topology, workload, options and seed.
  nlohmann::json report;
  /// Host figures: wall time, speed, events/s, peak RSS; with `profile`, `profile`: rows of
  /// {actor, message, count, wall_s}, most frequent first.
  nlohmann::json run;
  /// Every request ended (completed or failed); false when stopped by `until`.
  bool finished = false;
  /// The end-of-run invariant checks (also in `report["invariants"]`).
  invariant_report invariants;
};

/// Runs `records` (arrival order) on `topo`. Fails with a message when the topology's model
/// or hardware has no profile or the topology lacks a prefill or decode pool. Without a
/// vision pool, requests with images fail ("no vision tier"). A run that breaks an invariant
/// still succeeds: its violations are in `invariants` and `report["invariants"]`.
result<sim_outcome> run_simulation(const topology& topo, const std::vector<request_record>& records,
                                   const sim_options& options);

/// Yields a workload's records in arrival order, one per call; nullopt once it is exhausted.
using record_stream = std::function<std::optional<request_record>()>;

/// The same as above for a workload of `total` records pulled from `next` as they fall due, so
/// that a long workload (a trace tiled many times) is never held in memory whole. The report
/// is the one the vector form gives for the same records.
result<sim_outcome> run_simulation(const topology& topo, record_stream next, std::uint64_t total,
                                   const sim_options& options);

/// The terminal summary of a report.
std::string summarize(const nlohmann::json& report, const nlohmann::json& run);

} // namespace troupe::cluster::sim
