// The messages every load balancer shares: instance membership and inspectable counters.
//
// An engine announces itself to its balancer when it starts (`add_instance_atom`), and the
// balancer monitors it: when the engine exits (its instance failed, drained or was
// restarted) the balancer forgets it. So membership follows supervision, with no polling.
// Every balancer answers `lb_stats_atom` with named counters for reports.
#pragma once

#include "actors/lb/prefill_balancer.hpp"

#include <caf/actor_addr.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include <optional>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::actors {

using add_instance_atom = caf::atom_constant<caf::atom("addinst")>;
using lb_stats_atom = caf::atom_constant<caf::atom("lbstats")>;
/// Instance `id` is leaving: route nothing more to it (it stays a member until it exits).
using drain_instance_atom = caf::atom_constant<caf::atom("draininst")>;
/// Asks a balancer for its pool's load (`pool_load`), as the autoscaler reads it.
using pool_load_atom = caf::atom_constant<caf::atom("poolload")>;

/// A pool's load as its balancer sees it.
struct pool_load {
  /// Members that take new work (announced, alive, not draining).
  std::uint32_t online = 0;
  /// prefill_lb: uncached (cache-missed) prompt tokens routed since the balancer started;
  /// the autoscaler divides its growth by the interval. decode_lb: 0.
  std::uint64_t routed_tokens = 0;
  /// decode_lb: requests booked on the online members (in compute). prefill_lb: 0.
  std::uint64_t in_compute = 0;
  /// decode_lb: requests refused for want of room and not booked since, whose retry is due
  /// (decode_balancer_params::waiting_window). prefill_lb: 0.
  std::uint64_t waiting = 0;
  /// Members excluded by a drain notice (from the autoscaler or the fault injector) that are
  /// still alive: not online, leaving.
  std::vector<instance_id> draining;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_load& x) {
  return f(caf::meta::type_name("pool_load"), x.online, x.routed_tokens, x.in_compute,
           x.waiting, x.draining);
}

/// Named counters of one balancer, e.g. {"routed_16K-64K", 1234}.
struct lb_counters {
  std::string lb;
  std::vector<std::string> names;
  std::vector<std::uint64_t> values;

  void add(std::string name, std::uint64_t value) {
    names.push_back(std::move(name));
    values.push_back(value);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lb_counters& x) {
  return f(caf::meta::type_name("lb_counters"), x.lb, x.names, x.values);
}

/// Removes from `members` (a map from instance id to a member) the member whose engine —
/// `engine_of(member)` — is `source`, the actor a down message came from. Returns its id, or
/// nullopt when `source` is no member's engine.
template <class Map, class EngineOf>
std::optional<instance_id> forget_member(Map& members, const caf::actor_addr& source,
                                         EngineOf engine_of) {
  for (auto i = members.begin(); i != members.end(); ++i)
    if (engine_of(i->second).address() == source) {
      auto id = i->first;
      members.erase(i);
      return id;
    }
  return std::nullopt;
}

/// Instance `id` is draining (prefill_lb, decode_lb): route nothing more to it.
using drain_instance_atom = caf::atom_constant<caf::atom("draininst")>;

} // namespace troupe::actors
