// autoscaler: grows and shrinks the prefill and decode pools from their measured load.
//
// Two parts. `decide_scale` is the policy as a pure function — inputs in, a target per pool
// with its reason out — so every rule is unit-testable without actors:
//   - need = ceil(demand / per-instance capacity): prefill demand is cache-missed prompt
//     tokens per second, decode demand is requests in compute;
//   - an over-provision margin: the wanted count is need × (1 + margin), and strictly above
//     need when need > 0 and the margin is not zero (online > computed need);
//   - the wanted count is clamped to the pool's [min, max];
//   - at most `max_step_up` instances added and `max_step_down` removed per pool per interval;
//   - an added instance comes from the ready-but-unassigned inventory when one is ready
//     (it joins in seconds), otherwise from the quota (minutes), and only while the GPUs held
//     stay within the quota; a used inventory slot is refilled from the quota;
//   - no scale-down while quota occupancy (GPUs held / quota) is above the limit (0.8), nor
//     before the desired count has stayed below the current one for `scale_down_after`.
//
// The `autoscaler` actor runs it every `interval`: it asks the cluster supervisor for the pool
// supervisors and each of those for its instances (down, restarting ones included: a down
// instance is lost capacity, replaced from the inventory first and then retired), the
// prefill engines for their work counters (the measured prefill capacity: tokens computed per
// second of device time), prefill_lb and decode_lb for their `pool_load`, decides, and acts through the pool
// supervisors: `start_child` with a fresh instance id to add (after the join or refill delay),
// and to remove, for decode ALWAYS the drain path (the engine's leave notice: excluded from
// decode_lb at once, serves for the pool's grace, forwards what is left with its KV, then
// `stop_child`), for prefill an exclusion from prefill_lb, then `stop_child` once the engine
// has no job in flight (it finishes its current work first). Every decision is logged (the
// "autoscaler" logger, virtual-time stamped) with its inputs and appended to a shared log
// that the simulation's report and invariant checker read.
#pragma once

#include "actors/lb/decode_lb.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "runtime/supervisor.hpp"
#include "runtime/time.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::actors {

/// One pool as the policy sees it at a decision.
struct scale_pool_input {
  std::string pool;
  std::uint32_t min = 0;
  std::uint32_t max = 0;
  std::uint32_t gpus_per_instance = 1;
  /// Prefill: cache-missed prompt tokens per second; decode: requests in compute.
  double demand = 0;
  /// What one instance serves, in the unit of `demand` (> 0).
  double capacity = 1;
  /// Whether `capacity` was measured on the running engines (else it is the model's figure).
  bool capacity_measured = false;
  /// Instances taking work.
  std::uint32_t online = 0;
  /// Instances ordered (or started) by the autoscaler, not serving yet: capacity to come.
  std::uint32_t starting = 0;
  /// Instances leaving (draining or finishing their work, on the autoscaler's notice or the
  /// fault injector's); not counted as capacity.
  std::uint32_t draining = 0;
  /// Instances down after a failure (restarting, or staying down for want of healthy GPUs):
  /// lost capacity, counted neither online nor starting, so the policy replaces them; each
  /// instance ordered while some are down retires one of them (docs/autoscaler.md).
  std::uint32_t down = 0;
  /// How long the pool's desired count has been below its current one, without a break
  /// (zero at the first such decision).
  runtime::duration below_for{0};
};

struct scale_limits {
  std::uint32_t max_step_up = 1;
  std::uint32_t max_step_down = 1;
  double over_provision = 0.1;
  /// No scale-down while GPUs held / quota is above this.
  double occupancy_limit = 0.8;
  /// GPUs the cluster may hold at once.
  std::uint64_t quota = 0;
  /// Ready-but-unassigned instance slots to keep.
  std::uint32_t inventory = 0;
  /// A pool shrinks only once its desired count has stayed below its current one this long
  /// (a noisy demand does not make it go down and up again).
  runtime::duration scale_down_after{0};
};

struct scale_inputs {
  std::vector<scale_pool_input> pools;
  /// GPUs held now: every instance of every pool (any state), pools not autoscaled, and the
  /// inventory (ready and refilling).
  std::uint64_t gpus_held = 0;
  /// Inventory slots ready now, and being refilled from the quota.
  std::uint32_t inventory_ready = 0;
  std::uint32_t inventory_refilling = 0;
  /// GPUs of one inventory slot (a slot can become an instance of any autoscaled pool).
  std::uint32_t slot_gpus = 1;
};

struct scale_pool_decision {
  std::string pool;
  /// ceil(demand / capacity).
  std::uint32_t need = 0;
  /// need with the margin, within [min, max].
  std::uint32_t desired = 0;
  /// online + starting before the decision.
  std::uint32_t current = 0;
  /// current + up - down.
  std::uint32_t target = 0;
  std::uint32_t up = 0;
  /// Of `up`, taken from the ready inventory (the rest come from the quota).
  std::uint32_t from_inventory = 0;
  std::uint32_t down = 0;
  std::string reason;
};

struct scale_decision {
  /// GPUs held / quota before the decision.
  double occupancy = 0;
  std::vector<scale_pool_decision> pools;
  /// Inventory slots to order from the quota now.
  std::uint32_t refill = 0;
};

/// The policy (see the file comment). Pools are decided in order; the quota and the
/// inventory are shared, so an earlier pool may take what a later one wanted.
scale_decision decide_scale(const scale_inputs& in, const scale_limits& limits);

/// A pool the actor manages.
struct autoscaled_pool {
  std::string name;
  bool decode = false;
  std::uint32_t min = 0;
  std::uint32_t initial = 0;
  std::uint32_t max = 0;
  std::uint32_t gpus_per_instance = 1;
  /// Per-instance capacity (see scale_pool_input::capacity). For prefill this is the figure
  /// used until the engines have run `measure_after` of device time; from then on the
  /// measured one is: tokens computed per second of device time, over the live engines.
  double capacity = 1;
  /// Decode: the drain grace of a removed instance.
  runtime::duration grace{0};
  /// The child spec of a new instance with this id (named "<pool>/<id>").
  std::function<runtime::child_spec(instance_id)> make_instance;
};

/// Something the actor did to a pool, for the report's timeline.
struct scale_event {
  runtime::time_point at{};
  std::string pool;
  instance_id instance = 0;
  /// "ordered" (from the inventory or the quota), "joined" (started), "leaving" (drain notice
  /// or exclusion), "removed" (stopped), "retired" (a down instance given up for the one
  /// ordered in its place), "refill" (an inventory slot ordered), "ready" (a slot refilled).
  std::string kind;
  /// "inventory" or "quota" for "ordered"; the jobs forwarded for a decode "removed".
  std::string detail;
};

struct scale_record {
  runtime::time_point at{};
  scale_inputs inputs;
  scale_decision decision;
};

/// What the autoscaler decided and did (one thread in the simulated world).
struct autoscaler_log {
  std::vector<scale_record> decisions;
  std::vector<scale_event> events;
};

struct autoscaler_params {
  runtime::duration interval = std::chrono::seconds(30);
  scale_limits limits;
  /// A ready inventory slot joins a pool after this; a slot (or an instance when the
  /// inventory is empty) comes from the quota after `refill`.
  runtime::duration join = std::chrono::seconds(10);
  runtime::duration refill = std::chrono::minutes(5);
  /// The cluster supervisor: the pools are its children, by name.
  caf::actor root;
  prefill_lb_actor prefill_lb;
  decode_lb_actor decode_lb;
  autoscaled_pool prefill;
  autoscaled_pool decode;
  /// GPUs of pools the autoscaler does not manage (held all along).
  std::uint64_t fixed_gpus = 0;
  /// Device time the prefill engines must have run before their measured throughput replaces
  /// the configured capacity.
  runtime::duration measure_after = std::chrono::seconds(1);
  /// Polling period while a removed prefill instance finishes its work.
  runtime::duration finish_poll = std::chrono::seconds(1);
  std::shared_ptr<autoscaler_log> log;
  /// Called with each decision's inputs and outcome, on the actor's thread (troupe serve's
  /// metrics); may be empty.
  std::function<void(const scale_inputs&, const scale_decision&)> on_decision;
  /// TEST ONLY — a planted bug that proves the autoscaler invariants are checked end to end:
  /// every scale-up orders one instance more than decided. Never set it otherwise.
  bool test_order_one_more = false;
};

/// Spawns the autoscaler; its first decision is one interval after it starts. The inventory
/// starts full, as far as the quota allows.
caf::actor spawn_autoscaler(caf::actor_system& sys, autoscaler_params params);

} // namespace troupe::actors
