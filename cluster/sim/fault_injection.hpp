// fault_injection: how a fault plan acts on the simulated world.
//
// The fault injector (actors/fault_injector.hpp) sends exits and drain notices down the
// supervision tree; what a fault means besides that is the world's bookkeeping, kept here:
// which GPUs are failed (an instance re-forms on the healthy ones when it restarts, with an
// EP size from expert_placement.hpp, or stays down), which instances run slowed, which KV
// links are cut by a partition, and the events of the fault timeline. `plan_fault_orders`
// turns an expanded plan into the injector's orders, each with the bookkeeping effect it has
// at its time (docs/faults.md, "What is injected").
#pragma once

#include "actors/fault_injector.hpp"
#include "actors/kv/kv_store.hpp"
#include "cluster/sim/fault_plan.hpp"
#include "cluster/topology.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/time.hpp"
#include "runtime/world.hpp"

#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>

#include <caf/fwd.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// The world's view of its GPUs while faults play out (one thread in the sim): which GPUs are
/// failed, which instances run slowed, what size each instance re-formed with, and the
/// events of the fault timeline (restarts, EP resizes, instances that stay down).
struct fleet_state {
  const runtime::world* clock = nullptr;
  runtime::time_point origin{};
  /// "pool/instance" -> the indices of its failed GPUs.
  std::map<std::string, std::set<std::uint32_t>> failed;
  /// "pool/instance" -> the factors of the slowdowns in force (the slowest rank sets the pace
  /// of an EP group's collective steps).
  std::map<std::string, std::multiset<double>> slow;
  /// "pool/instance" -> until when its KV link is cut off by a partition.
  std::map<std::string, runtime::time_point> cut_until;
  /// "pool/instance" -> the factors of the link slowdowns in force on its KV link.
  std::map<std::string, std::multiset<double>> link_slow;
  /// "pool/instance" -> starts so far, and the size of its current (or last) incarnation.
  std::map<std::string, std::uint32_t> starts;
  std::map<std::string, std::uint32_t> size;
  /// Restarts, EP resizes, instances that stay down, recoveries (report `timeline`).
  nlohmann::json events = nlohmann::json::array();

  double now_s() const {
    return clock == nullptr ? 0 : runtime::to_seconds(clock->now() - origin);
  }
  double factor(const std::string& key) const {
    auto i = slow.find(key);
    return i == slow.end() || i->second.empty() ? 1.0 : *i->second.rbegin();
  }
  void event(std::string kind, std::string target, nlohmann::json detail = nlohmann::json::object()) {
    detail["at_s"] = std::round(now_s() * 1e6) / 1e6;
    detail["kind"] = std::move(kind);
    detail["target"] = std::move(target);
    events.push_back(std::move(detail));
  }
};

/// The GPUs the next incarnation of instance `key` ("pool/instance", `configured` GPUs, a
/// model with `experts` routed experts) runs on: its healthy GPUs in index order, as many as
/// resized_ep allows (none: it stays down). Every call after the first is a restart and goes
/// on the timeline (`restart`, `ep_resize` when the size changed, or `stays_down`).
std::vector<std::uint32_t> incarnation_gpus(fleet_state& fleet, const std::string& key,
                                            std::uint32_t configured, std::uint32_t experts);

/// A KV link under faults: a transfer that starts while instance `key` is cut off
/// (fleet.cut_until) is held until the cut ends; one that starts while the link is slowed by
/// `factor` (fleet.link_slow, the largest) is held (factor - 1) × bytes / `bandwidth` first,
/// so it takes `factor` times its bandwidth time; then it crosses `inner`.
runtime::link_port spawn_faulty_link(caf::actor_system& sys, runtime::link_port inner,
                                     double bandwidth, std::shared_ptr<const fleet_state> fleet,
                                     std::string key);

/// The injector's orders for an expanded plan, and for each fault the index of its order
/// (SIZE_MAX: not injected). Orders past those are effect-only ends of timed faults.
struct planned_orders {
  std::vector<actors::fault_order> orders;
  std::vector<std::size_t> order_of_fault;
};

/// `faults` as orders for an injector started `started` after the run's origin, acting on
/// `fleet` and the KV store `kv`; `prefill_pool` / `decode_pool` name the pools that drain.
planned_orders plan_fault_orders(const topology& topo, const std::vector<fault>& faults,
                                 runtime::duration started, std::shared_ptr<fleet_state> fleet,
                                 actors::kv_check_actor kv, const std::string& prefill_pool,
                                 const std::string& decode_pool);

} // namespace troupe::cluster::sim
