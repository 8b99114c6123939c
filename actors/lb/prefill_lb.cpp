#include "actors/lb/prefill_lb.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <deque>
#include <map>
#include <set>

namespace troupe::actors {

namespace {

/// The compute a request books on its instance: its uncached tokens (at least the bounded
/// replay every prefill does).
double compute_of(std::uint64_t uncached) {
  return static_cast<double>(std::max<std::uint64_t>(uncached, 128));
}

struct prefill_lb_state {
  prefill_lb_params params;
  std::unique_ptr<prefill_balancer> balancer;
  std::map<instance_id, prefill_engine_actor> engines;
  runtime::time_point last_rebalance{};
  /// Members excluded by a drain notice (until their engine exits).
  std::set<instance_id> draining;
  /// Uncached tokens of every request routed (the autoscaler's prefill demand).
  std::uint64_t routed_tokens = 0;
  /// Drain notices taken (lb.prefill.drained in the report).
  std::uint64_t drained = 0;
  /// The instance that last reported keeping the window state at a key, with the report's
  /// number; the keys in report order (a key reported again appears twice, and only its
  /// newest entry, whose number matches, forgets it).
  struct keeper_record {
    instance_id instance = 0;
    std::uint64_t number = 0;
    /// A decode instance (its ids are not the members'): asked through outside_keepers.
    bool outside = false;
  };
  std::map<block_key, keeper_record> keepers;
  /// Keepers that are not members (decode instances): what to ask, by instance.
  std::map<instance_id, caf::actor> outside_keepers;
  std::deque<std::pair<block_key, std::uint64_t>> kept_order;
  std::uint64_t kept_reports = 0;
  static inline const char* name = "prefill_lb";
};

using lb_ptr = prefill_lb_actor::stateful_pointer<prefill_lb_state>;

prefill_lb_actor::behavior_type prefill_lb_fn(lb_ptr self, prefill_lb_params params) {
  auto& st = self->state;
  st.params = params;
  st.balancer = std::make_unique<prefill_balancer>(params.balancer);
  st.last_rebalance = self->clock().now();
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    if (auto id = forget_member(st.engines, msg.source, [](auto& e) -> auto& { return e; })) {
      st.balancer->remove_instance(*id);
      st.draining.erase(*id);
    } else {
      forget_member(st.outside_keepers, msg.source, [](auto& a) -> auto& { return a; });
    }
  });
  return {
    [self](const prefill_route& r) -> caf::result<prefill_assignment> {
      auto& st = self->state;
      auto now = self->clock().now();
      if (now - st.last_rebalance >= st.params.rebalance_interval) {
        st.balancer->rebalance();
        st.last_rebalance = now;
      }
      auto id = st.balancer->route(r.uncached_tokens, compute_of(r.uncached_tokens));
      if (!id)
        return runtime::make_error(runtime::errc::unavailable, "no prefill instance is up");
      st.routed_tokens += r.uncached_tokens;
      prefill_assignment a{*id, st.engines.at(*id), {}};
      if (r.kept != block_key{})
        if (auto k = st.keepers.find(r.kept); k != st.keepers.end()) {
          const auto& rec = k->second;
          if (rec.outside) {
            if (auto o = st.outside_keepers.find(rec.instance); o != st.outside_keepers.end())
              a.keeper = o->second;
          } else if (rec.instance != *id) {
            if (auto e = st.engines.find(rec.instance); e != st.engines.end())
              a.keeper = caf::actor_cast<caf::actor>(e->second);
          }
        }
      return a;
    },
    [self](const prefill_release& r) {
      self->state.balancer->complete(r.instance, compute_of(r.uncached_tokens));
    },
    [self](add_instance_atom, instance_id id, prefill_engine_actor& engine) {
      auto& st = self->state;
      self->monitor(engine);
      st.engines[id] = std::move(engine);
      st.balancer->add_instance(id);
    },
    [self](const prefill_kept& k) {
      auto& st = self->state;
      if (k.keeper) {
        auto& known = st.outside_keepers[k.instance];
        if (known != caf::actor_cast<caf::actor>(k.keeper)) {
          known = caf::actor_cast<caf::actor>(k.keeper);
          self->monitor(known);
        }
      }
      const auto n = ++st.kept_reports;
      st.keepers[k.key] = {k.instance, n, static_cast<bool>(k.keeper)};
      st.kept_order.emplace_back(k.key, n);
      while (st.kept_order.size() > st.params.kept_records) {
        auto [key, number] = st.kept_order.front();
        st.kept_order.pop_front();
        if (auto i = st.keepers.find(key); i != st.keepers.end() && i->second.number == number)
          st.keepers.erase(i);
      }
    },
    [self](drain_instance_atom, instance_id id) {
      // Draining: no new routes; the jobs it holds finish there.
      auto& st = self->state;
      if (st.engines.count(id) != 0 && st.draining.insert(id).second) {
        st.balancer->remove_instance(id);
        ++st.drained;
      }
    },
    [self](pool_load_atom) {
      auto& st = self->state;
      return pool_load{static_cast<std::uint32_t>(st.engines.size() - st.draining.size()),
                       st.routed_tokens, 0, 0,
                       std::vector<instance_id>(st.draining.begin(), st.draining.end())};
    },
    [self](lb_stats_atom) {
      auto& b = *self->state.balancer;
      lb_counters c;
      c.lb = "prefill";
      auto& s = b.stats();
      auto counts = b.instances_per_bucket();
      for (std::size_t i = 0; i < b.buckets(); ++i) {
        c.add("routed_" + b.bucket_name(i), s.routed[i]);
        c.add("instances_" + b.bucket_name(i), counts[i]);
      }
      c.add("spilled", s.spilled);
      c.add("rejected", s.rejected);
      c.add("moves", s.moves);
      c.add("rebalances", s.rebalances);
      c.add("drained", self->state.drained);
      return c;
    },
  };
}

} // namespace

prefill_lb_actor spawn_prefill_lb(caf::actor_system& sys, prefill_lb_params params) {
  return sys.spawn(prefill_lb_fn, std::move(params));
}

} // namespace troupe::actors
