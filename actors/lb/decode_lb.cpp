#include "actors/lb/decode_lb.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <deque>
#include <map>
#include <set>

namespace troupe::actors {

namespace {

struct decode_lb_state {
  std::unique_ptr<decode_balancer> balancer;
  std::map<instance_id, decode_engine_actor> engines;
  std::uint64_t drained = 0;
  /// Members excluded by a drain notice (until their engine exits).
  std::set<instance_id> draining;
  /// Requests refused for want of room, by the time of their last refusal (until booked, or
  /// past the waiting window).
  std::map<std::uint64_t, runtime::time_point> waiting;
  runtime::duration waiting_window{0};
  runtime::time_point pruned{};  // when `waiting` last lost its overdue entries
  /// The requests refused for want of room, oldest first, to tell when room may have come
  /// (decode_room_atom): ids in order, and each one's actor while it is to be told (an id
  /// whose entry is gone was booked or told already, and is skipped).
  std::deque<std::uint64_t> refused_order;
  std::map<std::uint64_t, caf::actor_addr> refused;
  run_history_ptr history;
  static inline const char* name = "decode_lb";
};

using lb_ptr = decode_lb_actor::stateful_pointer<decode_lb_state>;

/// Forgets the refusals older than the window (the request was served elsewhere, or gave up).
void prune_waiting(lb_ptr self) {
  auto& st = self->state;
  const auto now = self->clock().now();
  for (auto it = st.waiting.begin(); it != st.waiting.end();)
    it = now - it->second > st.waiting_window ? st.waiting.erase(it) : std::next(it);
  st.pruned = now;
}

/// Tells the `n` oldest refused requests still waiting that room may have come.
void tell_refused(lb_ptr self, std::size_t n) {
  auto& st = self->state;
  while (n > 0 && !st.refused_order.empty()) {
    const auto id = st.refused_order.front();
    st.refused_order.pop_front();
    auto it = st.refused.find(id);
    if (it == st.refused.end())
      continue;
    auto request = caf::actor_cast<caf::actor>(it->second);
    st.refused.erase(it);
    if (request) {  // it may have ended meanwhile
      caf::anon_send(request, decode_room_atom::value);
      --n;
    }
  }
}

void record(lb_ptr self, instance_id id, booking_fact::kind_t kind, std::uint64_t reserved = 0) {
  if (auto& h = self->state.history)
    h->add(booking_fact{self->clock().now(), id, kind, reserved});
}

decode_lb_actor::behavior_type decode_lb_fn(lb_ptr self, decode_balancer_params params,
                                            run_history_ptr history) {
  self->state.balancer = std::make_unique<decode_balancer>(params);
  self->state.waiting_window = params.waiting_window;
  self->state.history = std::move(history);
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    if (auto id = forget_member(st.engines, msg.source, [](auto& e) -> auto& { return e; })) {
      st.balancer->remove_instance(*id);
      st.draining.erase(*id);
      record(self, *id, booking_fact::leave);
    }
  });
  return {
    [self](const decode_route& r) -> caf::result<decode_assignment> {
      auto& st = self->state;
      auto id = st.balancer->route(r.kv_tokens, r.max_new_tokens);
      if (!id) {
        // Pruned here too, once a window at most: without an autoscaler asking pool_load the
        // refusals of requests that gave up would pile up.
        if (self->clock().now() - st.pruned > st.waiting_window)
          prune_waiting(self);
        st.waiting[r.request] = self->clock().now();
        if (r.waits
            && st.refused.emplace(r.request,
                                  caf::actor_cast<caf::actor_addr>(self->current_sender()))
                 .second)
          st.refused_order.push_back(r.request);
        return runtime::make_error(runtime::errc::unavailable, "no decode instance has room");
      }
      st.waiting.erase(r.request);
      st.refused.erase(r.request);
      record(self, *id, booking_fact::book, r.kv_tokens + r.max_new_tokens);
      return decode_assignment{*id, st.engines.at(*id)};
    },
    [self](const decode_release& r) {
      self->state.balancer->complete(r.instance, r.kv_tokens, r.max_new_tokens, r.grown);
      record(self, r.instance, booking_fact::release, r.kv_tokens + r.max_new_tokens);
      tell_refused(self, 1);
    },
    [self](const decode_grow& g) { self->state.balancer->grow(g.instance, g.tokens); },
    [self](add_instance_atom, instance_id id, decode_engine_actor& engine) {
      auto& st = self->state;
      self->monitor(engine);
      st.engines[id] = std::move(engine);
      st.balancer->add_instance(id);
      record(self, id, booking_fact::join);
      tell_refused(self, st.refused.size());
    },
    [self](drain_instance_atom, instance_id id) {
      // Its engine stays a member (monitored) until it exits; it just takes no new routes.
      self->state.balancer->remove_instance(id);
      record(self, id, booking_fact::leave);
      ++self->state.drained;
      if (self->state.engines.count(id) != 0)
        self->state.draining.insert(id);
    },
    [self](pool_load_atom) {
      auto& st = self->state;
      pool_load load;
      for (auto& [id, engine] : st.engines)
        if (st.draining.count(id) == 0) {
          ++load.online;
          load.in_compute += st.balancer->requests(id);
        } else {
          load.draining.push_back(id);
        }
      prune_waiting(self);
      load.waiting = st.waiting.size();
      return load;
    },
    [self](lb_stats_atom) {
      auto& s = self->state.balancer->stats();
      lb_counters c;
      c.lb = "decode";
      c.add("routed_long", s.routed_long);
      c.add("routed_short", s.routed_short);
      c.add("spilled", s.spilled);
      c.add("rejected", s.rejected);
      c.add("drained", self->state.drained);
      // What the live instances still hold (requests booked, their KV): zero once every
      // request has ended, or a KV allocation leaked (the invariant checker's KV check).
      std::uint64_t held = 0, held_kv = 0;
      for (auto& [id, engine] : self->state.engines) {
        held += self->state.balancer->requests(id);
        held_kv += self->state.balancer->kv_tokens(id);
      }
      c.add("held_requests", held);
      c.add("held_kv_tokens", held_kv);
      return c;
    },
  };
}

} // namespace

decode_lb_actor spawn_decode_lb(caf::actor_system& sys, decode_balancer_params params,
                                run_history_ptr history) {
  return sys.spawn(decode_lb_fn, params, std::move(history));
}

} // namespace troupe::actors
