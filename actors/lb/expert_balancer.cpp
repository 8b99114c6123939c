// The expert-parallel load balancer (see expert_balancer.hpp).
#include "actors/lb/expert_balancer.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_system.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace troupe::actors {

namespace {

struct expert_balancer_state {
  expert_balancer_params params;
  /// Placements waiting for the ranks to load their copies, by number.
  std::map<std::uint64_t, std::pair<std::vector<double>, expert_placement>> loading;
  std::uint64_t computed = 0;
  std::uint64_t published = 0;
  std::uint64_t idle = 0;
  double last_balancedness = 1.0;
  /// The first tick (sent at spawn) places from the load of that instant and publishes at once.
  bool started = false;
  static inline const char* name = "expert_balancer";
};

using balancer_ptr = expert_balancer_actor::stateful_pointer<expert_balancer_state>;

/// Places the experts by the load over [from, to); nullopt when no token was routed then (the
/// placement stays as it is), or (and the actor exits) when the parameters admit no placement.
std::optional<std::pair<std::vector<double>, expert_placement>>
place(balancer_ptr self, runtime::time_point from, runtime::time_point to) {
  auto& st = self->state;
  auto load = st.params.load(from, to);
  if (std::all_of(load.begin(), load.end(), [](double x) { return x == 0.0; })) {
    ++st.idle;
    return std::nullopt;
  }
  auto placed = place_experts(
    {load, st.params.ranks, st.params.slots_per_rank, st.params.nodes, st.params.groups});
  if (auto* why = std::get_if<std::string>(&placed)) {
    self->quit(runtime::make_error(runtime::errc::invalid_argument, "expert_balancer: " + *why));
    return std::nullopt;
  }
  ++st.computed;
  auto& p = std::get<expert_placement>(placed);
  st.last_balancedness = p.balancedness();
  return std::pair{std::move(load), std::move(p)};
}

void publish(balancer_ptr self, const std::vector<double>& load, const expert_placement& p) {
  ++self->state.published;
  if (self->state.params.publish)
    self->state.params.publish(load, p);
}

expert_balancer_actor::behavior_type expert_balancer_fn(balancer_ptr self,
                                                        expert_balancer_params params) {
  self->state.params = std::move(params);
  self->send(self, eplb_tick_atom::value);
  return {
    [self](lb_stats_atom) {
      auto& st = self->state;
      lb_counters c;
      c.lb = "expert";
      c.add("placements_computed", st.computed);
      c.add("placements_published", st.published);
      c.add("windows_idle", st.idle);
      c.add("last_balancedness_ppm", static_cast<std::uint64_t>(std::llround(st.last_balancedness * 1e6)));
      return c;
    },
    [self](eplb_tick_atom) {
      auto& st = self->state;
      const auto now = self->clock().now();
      if (!st.started) {
        // The pool starts balanced for the load of this instant.
        st.started = true;
        if (auto first = place(self, now, now))
          publish(self, first->first, first->second);
      } else if (auto next = place(self, now - st.params.window, now)) {
        const auto number = st.computed;
        st.loading.emplace(number, std::move(*next));
        self->delayed_send(self, st.params.load_time, eplb_switch_atom::value, number);
      }
      if (st.params.interval > runtime::duration{0})
        self->delayed_send(self, st.params.interval, eplb_tick_atom::value);
    },
    [self](eplb_switch_atom, std::uint64_t number) {
      auto& st = self->state;
      auto i = st.loading.find(number);
      if (i == st.loading.end())
        return;
      publish(self, i->second.first, i->second.second);
      st.loading.erase(i);
    },
  };
}

} // namespace

expert_balancer_actor spawn_expert_balancer(caf::actor_system& sys, expert_balancer_params params) {
  return sys.spawn(expert_balancer_fn, std::move(params));
}

} // namespace troupe::actors
