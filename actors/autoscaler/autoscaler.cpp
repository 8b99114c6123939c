#include "actors/autoscaler/autoscaler.hpp"

#include "actors/engine/decode_engine.hpp"
#include "runtime/log.hpp"

#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace troupe::actors {

scale_decision decide_scale(const scale_inputs& in, const scale_limits& limits) {
  scale_decision out;
  out.occupancy = limits.quota > 0 ? static_cast<double>(in.gpus_held)
                                       / static_cast<double>(limits.quota)
                                   : 1.0;
  auto held = in.gpus_held;
  auto ready = in.inventory_ready;
  for (const auto& p : in.pools) {
    scale_pool_decision d;
    d.pool = p.pool;
    auto capacity = std::max(p.capacity, 1e-12);
    d.need = static_cast<std::uint32_t>(std::ceil(std::max(0.0, p.demand) / capacity - 1e-9));
    auto wanted = d.need;
    if (d.need > 0 && limits.over_provision > 0)
      wanted = std::max(d.need + 1, static_cast<std::uint32_t>(std::ceil(
                                      static_cast<double>(d.need) * (1 + limits.over_provision)
                                      - 1e-9)));
    d.desired = std::clamp(wanted, p.min, p.max);
    d.current = p.online + p.starting;
    std::string why
      = fmt::format("need {} = ceil({:.6g} / {:.6g} per instance ({})), desired {}", d.need,
                    p.demand, p.capacity, p.capacity_measured ? "measured" : "configured",
                    d.desired);
    if (p.down > 0)
      why += fmt::format(" ({} down, not counted)", p.down);
    if (d.desired != wanted)
      why += fmt::format(" (bounds [{}, {}])", p.min, p.max);
    if (d.desired > d.current) {
      auto want = d.desired - d.current;
      auto step = std::min(want, limits.max_step_up);
      std::uint32_t granted = 0;
      for (; granted < step; ++granted) {
        if (ready > 0) {
          --ready;
          ++d.from_inventory;
        } else if (held + p.gpus_per_instance <= limits.quota) {
          held += p.gpus_per_instance;
        } else {
          break;
        }
      }
      d.up = granted;
      why += fmt::format("; up {} ({} from the inventory)", d.up, d.from_inventory);
      if (step < want)
        why += fmt::format(", limited by max_step_up {}", limits.max_step_up);
      if (granted < step)
        why += fmt::format(", limited by the quota ({} of {} GPUs held)", held, limits.quota);
    } else if (d.desired < d.current) {
      if (out.occupancy > limits.occupancy_limit) {
        why += fmt::format("; hold: occupancy {:.3g}% above {:.3g}% blocks scale-down",
                           out.occupancy * 100, limits.occupancy_limit * 100);
      } else if (p.below_for < limits.scale_down_after) {
        why += fmt::format("; hold: below current for {:.3g} s of the {:.3g} s before a "
                           "scale-down",
                           runtime::to_seconds(p.below_for),
                           runtime::to_seconds(limits.scale_down_after));
      } else {
        auto want = d.current - d.desired;
        d.down = std::min({want, limits.max_step_down, p.online});
        why += fmt::format("; down {}", d.down);
        if (d.down < want)
          why += d.down == limits.max_step_down
                   ? fmt::format(", limited by max_step_down {}", limits.max_step_down)
                   : std::string{", limited to instances online"};
      }
    } else {
      why += "; hold";
    }
    d.target = d.current + d.up - d.down;
    d.reason = std::move(why);
    out.pools.push_back(std::move(d));
  }
  // Refill the inventory from the quota, as far as the quota allows.
  auto slots = ready + in.inventory_refilling;
  while (slots < limits.inventory && held + in.slot_gpus <= limits.quota) {
    ++slots;
    ++out.refill;
    held += in.slot_gpus;
  }
  return out;
}

namespace {

using tick_atom = caf::atom_constant<caf::atom("astick")>;
using join_atom = caf::atom_constant<caf::atom("asjoin")>;
using ready_atom = caf::atom_constant<caf::atom("asready")>;
using finish_atom = caf::atom_constant<caf::atom("asfinish")>;

struct pool_state {
  autoscaled_pool spec;
  caf::actor supervisor;
  /// Instances the pool supervisor holds: id -> instance supervisor (invalid while down).
  std::map<instance_id, caf::actor> members;
  /// Instances told to leave, until the supervisor no longer holds them.
  std::set<instance_id> leaving;
  /// Down instances given up for a replacement, until the supervisor no longer holds them.
  std::set<instance_id> retiring;
  /// Instances started since the pool supervisor last listed its children (no handle yet).
  std::set<instance_id> fresh;
  /// Ordered, not started yet.
  std::uint32_t pending = 0;
  instance_id next_id = 0;
  pool_load load;
  /// Since when the desired count has been below the current one (unset: it is not).
  std::optional<runtime::time_point> below_since;
};

struct autoscaler_state {
  autoscaler_params params;
  std::array<pool_state, 2> pools;
  std::uint32_t ready = 0;
  std::uint32_t refilling = 0;
  std::uint64_t last_routed = 0;
  /// The prefill engines' work counters, summed at the current gathering.
  std::uint64_t prefill_tokens = 0;
  runtime::duration prefill_busy{0};
  /// Answers still awaited by the current gathering.
  int waiting = 0;
  static inline const char* name = "autoscaler";
};

using autoscaler_ptr = caf::stateful_actor<autoscaler_state>*;

std::uint32_t slot_gpus(const autoscaler_params& p) {
  return std::max(p.prefill.gpus_per_instance, p.decode.gpus_per_instance);
}

std::uint64_t gpus_held(const autoscaler_state& st) {
  std::uint64_t held = st.params.fixed_gpus;
  for (auto& ps : st.pools)
    held += std::uint64_t{ps.spec.gpus_per_instance}
            * (ps.members.size() + ps.pending);
  held += std::uint64_t{slot_gpus(st.params)} * (st.ready + st.refilling);
  return held;
}

void event(autoscaler_ptr self, const std::string& pool, instance_id id, std::string kind,
           std::string detail = {}) {
  if (self->state.params.log)
    self->state.params.log->events.push_back(
      scale_event{self->clock().now(), pool, id, std::move(kind), std::move(detail)});
}

std::string child_name(const pool_state& ps, instance_id id) {
  return ps.spec.name + "/" + std::to_string(id);
}

/// A prefill instance that was excluded: stop it once its engine has nothing in flight.
void finish_prefill(autoscaler_ptr self, std::size_t pool, instance_id id, caf::actor engine) {
  self->request(engine, caf::infinite, engine_stats_atom::value)
    .then(
      [self, pool, id, engine](const engine_stats& s) {
        if (s.jobs_in_flight > 0) {
          self->delayed_send(self, self->state.params.finish_poll, finish_atom::value, pool, id,
                             engine);
          return;
        }
        auto& ps = self->state.pools[pool];
        self->request(ps.supervisor, caf::infinite, runtime::stop_child_atom::value,
                      child_name(ps, id))
          .then([self, pool, id]() {
            event(self, self->state.pools[pool].spec.name, id, "removed");
          },
                [](const caf::error&) {});
      },
      // The engine is gone (its instance failed meanwhile): the supervisor restarts it as a
      // member; the next decision sees it again.
      [self, pool, id](const caf::error&) { self->state.pools[pool].leaving.erase(id); });
}

/// Takes instance `id` of pool `pool` out: decode through the drain path, prefill by
/// exclusion and finishing its work.
void remove_instance(autoscaler_ptr self, std::size_t pool, instance_id id) {
  auto& ps = self->state.pools[pool];
  auto node = ps.members[id];
  ps.leaving.insert(id);
  event(self, ps.spec.name, id, "leaving");
  self->request(node, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self, pool, id](const std::vector<runtime::child_info>& children) {
        auto& ps = self->state.pools[pool];
        for (auto& c : children) {
          if (c.id != "engine" || !c.handle)
            continue;
          if (ps.spec.decode) {
            self->request(c.handle, caf::infinite, drain_atom::value, ps.spec.grace)
              .then(
                [self, pool, id](std::uint64_t forwarded) {
                  auto& ps = self->state.pools[pool];
                  self->request(ps.supervisor, caf::infinite, runtime::stop_child_atom::value,
                                child_name(ps, id))
                    .then(
                      [self, pool, id, forwarded]() {
                        event(self, self->state.pools[pool].spec.name, id, "removed",
                              fmt::format("{} forwarded", forwarded));
                      },
                      [](const caf::error&) {});
                },
                [self, pool, id](const caf::error&) { self->state.pools[pool].leaving.erase(id); });
          } else {
            self->send(self->state.params.prefill_lb, drain_instance_atom::value, id);
            finish_prefill(self, pool, id, c.handle);
          }
          return;
        }
        ps.leaving.erase(id); // down meanwhile: not removed
      },
      [self, pool, id](const caf::error&) { self->state.pools[pool].leaving.erase(id); });
}

/// Gives up down instance `id` of pool `pool` (it would otherwise come back on top of
/// `replacement`, ordered in its place): the pool supervisor removes it, so it is not
/// restarted and its GPUs go back to the quota.
void retire_instance(autoscaler_ptr self, std::size_t pool, instance_id id,
                     instance_id replacement) {
  auto& ps = self->state.pools[pool];
  ps.retiring.insert(id);
  self->request(ps.supervisor, caf::infinite, runtime::stop_child_atom::value,
                child_name(ps, id))
    .then(
      [self, pool, id, replacement]() {
        event(self, self->state.pools[pool].spec.name, id, "retired",
              fmt::format("down; replaced by {}", replacement));
      },
      [self, pool, id](const caf::error&) { self->state.pools[pool].retiring.erase(id); });
}

void decide_and_act(autoscaler_ptr self) {
  auto& st = self->state;
  auto& p = st.params;
  auto interval_s = std::max(1e-9, runtime::to_seconds(p.interval));
  scale_inputs in;
  in.slot_gpus = slot_gpus(p);
  in.inventory_ready = st.ready;
  in.inventory_refilling = st.refilling;
  in.gpus_held = gpus_held(st);
  for (auto& ps : st.pools) {
    for (auto* ids : {&ps.leaving, &ps.retiring})
      for (auto i = ids->begin(); i != ids->end();)
        i = ps.members.count(*i) == 0 ? ids->erase(i) : std::next(i);
    // Leaving: told to by the autoscaler, or excluded by anyone's drain notice (the fault
    // injector's too). Down: no handle (failed: restarting or staying down), not just started
    // and not already given up.
    std::set<instance_id> excluded(ps.load.draining.begin(), ps.load.draining.end());
    std::uint32_t live = 0, leaving = 0, down = 0, fresh = 0;
    for (auto& [id, node] : ps.members) {
      if (ps.leaving.count(id) != 0 || (node && excluded.count(id) != 0))
        ++leaving;
      else if (node)
        ++live;
      else if (ps.fresh.count(id) != 0)
        ++fresh;
      else if (ps.retiring.count(id) == 0)
        ++down;
    }
    scale_pool_input pi;
    pi.pool = ps.spec.name;
    pi.min = ps.spec.min;
    pi.max = ps.spec.max;
    pi.gpus_per_instance = ps.spec.gpus_per_instance;
    pi.capacity = ps.spec.capacity;
    if (!ps.spec.decode && st.prefill_busy >= p.measure_after && st.prefill_tokens > 0) {
      pi.capacity = static_cast<double>(st.prefill_tokens) / runtime::to_seconds(st.prefill_busy);
      pi.capacity_measured = true;
    }
    if (ps.spec.decode) {
      // In compute, and waiting for room: what the pool would hold if it could.
      pi.demand = static_cast<double>(ps.load.in_compute + ps.load.waiting);
    } else {
      pi.demand = static_cast<double>(ps.load.routed_tokens - st.last_routed) / interval_s;
      st.last_routed = ps.load.routed_tokens;
    }
    pi.online = std::min(ps.load.online, live);
    // Alive but not announced to the balancer yet, or started since the last listing.
    pi.starting = ps.pending + fresh + (live - pi.online);
    pi.draining = leaving;
    pi.down = down;
    if (ps.below_since)
      pi.below_for = self->clock().now() - *ps.below_since;
    in.pools.push_back(std::move(pi));
  }
  auto d = decide_scale(in, p.limits);
  if (p.on_decision)
    p.on_decision(in, d);
  // Decisions that change a pool at info level, holds at debug.
  auto logger = runtime::log::get("autoscaler");
  for (std::size_t k = 0; k < d.pools.size(); ++k) {
    auto& i = in.pools[k];
    auto level = d.pools[k].up + d.pools[k].down > 0 ? spdlog::level::info : spdlog::level::debug;
    logger->log(level, "{}: demand {:.6g}, online {}, starting {}, draining {}, down {}, "
                 "occupancy {:.3g}%, inventory {} ready / {} refilling -> target {}: {}",
                 i.pool, i.demand, i.online, i.starting, i.draining, i.down, d.occupancy * 100,
                 in.inventory_ready, in.inventory_refilling, d.pools[k].target,
                 d.pools[k].reason);
  }
  // Act.
  for (std::size_t k = 0; k < d.pools.size(); ++k) {
    auto& ps = st.pools[k];
    auto& pd = d.pools[k];
    if (pd.desired >= pd.current)
      ps.below_since.reset();
    else if (!ps.below_since)
      ps.below_since = self->clock().now();
    // The down instances, oldest id first: each instance ordered now takes one's place.
    std::vector<instance_id> lost;
    for (auto& [id, node] : ps.members)
      if (!node && ps.fresh.count(id) == 0 && ps.leaving.count(id) == 0
          && ps.retiring.count(id) == 0)
        lost.push_back(id);
    auto orders = pd.up + (pd.up > 0 && p.test_order_one_more ? 1 : 0);
    for (std::uint32_t n = 0; n < orders; ++n) {
      auto id = ps.next_id++;
      ++ps.pending;
      bool inventory = n < pd.from_inventory;
      if (inventory)
        --st.ready;
      event(self, ps.spec.name, id, "ordered", inventory ? "inventory" : "quota");
      self->delayed_send(self, inventory ? p.join : p.refill, join_atom::value, k, id);
      if (n < lost.size())
        retire_instance(self, k, lost[n], id);
    }
    if (pd.down > 0) {
      std::set<instance_id> excluded(ps.load.draining.begin(), ps.load.draining.end());
      std::vector<instance_id> candidates;
      for (auto& [id, node] : ps.members)
        if (node && ps.leaving.count(id) == 0 && excluded.count(id) == 0)
          candidates.push_back(id);
      std::sort(candidates.rbegin(), candidates.rend());
      for (std::uint32_t n = 0; n < pd.down && n < candidates.size(); ++n)
        remove_instance(self, k, candidates[n]);
    }
  }
  for (std::uint32_t n = 0; n < d.refill; ++n) {
    ++st.refilling;
    event(self, "inventory", 0, "refill");
    self->delayed_send(self, p.refill, ready_atom::value);
  }
  if (p.log)
    p.log->decisions.push_back(scale_record{self->clock().now(), std::move(in), std::move(d)});
}

void gathered(autoscaler_ptr self) {
  if (--self->state.waiting == 0)
    decide_and_act(self);
}

/// Adds the work counters of the engine of prefill instance `node` to the measurement.
void measure_prefill(autoscaler_ptr self, caf::actor node) {
  ++self->state.waiting;
  self->request(node, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self](const std::vector<runtime::child_info>& children) {
        for (auto& c : children)
          if (c.id == "engine" && c.handle) {
            ++self->state.waiting;
            self->request(c.handle, caf::infinite, engine_stats_atom::value)
              .then(
                [self](const engine_stats& s) {
                  self->state.prefill_tokens += s.tokens;
                  self->state.prefill_busy += s.busy;
                  gathered(self);
                },
                [self](const caf::error&) { gathered(self); });
          }
        gathered(self);
      },
      [self](const caf::error&) { gathered(self); });
}

/// Asks every source of the decision's inputs; decides when the last answer is in.
void gather(autoscaler_ptr self) {
  auto& st = self->state;
  st.waiting = 1;
  st.prefill_tokens = 0;
  st.prefill_busy = runtime::duration{0};
  self->request(st.params.root, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self](const std::vector<runtime::child_info>& pools) {
        auto& st = self->state;
        for (std::size_t k = 0; k < st.pools.size(); ++k) {
          auto& ps = st.pools[k];
          ps.supervisor = caf::actor{};
          for (auto& c : pools)
            if (c.id == ps.spec.name)
              ps.supervisor = c.handle;
          if (!ps.supervisor)
            continue;
          ++st.waiting;
          self->request(ps.supervisor, caf::infinite, runtime::which_children_atom::value)
            .then(
              [self, k](const std::vector<runtime::child_info>& children) {
                auto& ps = self->state.pools[k];
                ps.members.clear();
                auto prefix = ps.spec.name + "/";
                for (auto& c : children)
                  if (c.id.rfind(prefix, 0) == 0)
                    ps.members[std::stoul(c.id.substr(prefix.size()))] = c.handle;
                // Listed now: no longer fresh. Started after the listing: held, not down.
                for (auto i = ps.fresh.begin(); i != ps.fresh.end();)
                  if (ps.members.count(*i) != 0) {
                    i = ps.fresh.erase(i);
                  } else {
                    ps.members[*i] = caf::actor{};
                    ++i;
                  }
                if (!ps.spec.decode)
                  for (auto& [id, node] : ps.members)
                    if (node)
                      measure_prefill(self, node);
                gathered(self);
              },
              [self](const caf::error&) { gathered(self); });
        }
        st.waiting += 2;
        self->request(st.params.prefill_lb, caf::infinite, pool_load_atom::value)
          .then(
            [self](const pool_load& l) {
              self->state.pools[0].load = l;
              gathered(self);
            },
            [self](const caf::error&) { gathered(self); });
        self->request(st.params.decode_lb, caf::infinite, pool_load_atom::value)
          .then(
            [self](const pool_load& l) {
              self->state.pools[1].load = l;
              gathered(self);
            },
            [self](const caf::error&) { gathered(self); });
        gathered(self);
      },
      [self](const caf::error&) { self->state.waiting = 0; }); // no cluster: no decision
}

caf::behavior autoscaler_fn(autoscaler_ptr self, autoscaler_params params) {
  auto& st = self->state;
  st.params = std::move(params);
  st.pools[0].spec = st.params.prefill;
  st.pools[1].spec = st.params.decode;
  for (auto& ps : st.pools) {
    ps.next_id = ps.spec.initial;
    for (instance_id i = 0; i < ps.spec.initial; ++i)
      ps.members[i] = caf::actor{};
  }
  // The inventory starts full, as far as the quota allows.
  auto held = gpus_held(st);
  auto slot = slot_gpus(st.params);
  while (st.ready < st.params.limits.inventory && held + slot <= st.params.limits.quota) {
    ++st.ready;
    held += slot;
  }
  self->delayed_send(self, st.params.interval, tick_atom::value);
  return {
    [self](tick_atom) {
      self->delayed_send(self, self->state.params.interval, tick_atom::value);
      // The previous gathering is still waiting for answers (a slow cluster in the real
      // world): skip this interval rather than mix two gatherings' counts.
      if (self->state.waiting > 0) {
        runtime::log::get("autoscaler")->warn("inputs of the previous interval still pending; "
                                              "no decision this interval");
        return;
      }
      gather(self);
    },
    [self](join_atom, std::size_t k, instance_id id) {
      auto& ps = self->state.pools[k];
      auto done = [self, k, id](std::string kind) {
        auto& ps = self->state.pools[k];
        --ps.pending;
        ps.members[id] = caf::actor{}; // held from now on; its handle comes with the next gather
        ps.fresh.insert(id);
        event(self, ps.spec.name, id, std::move(kind));
      };
      if (!ps.supervisor) {
        --ps.pending;
        event(self, ps.spec.name, id, "failed", "no pool supervisor");
        return;
      }
      self->request(ps.supervisor, caf::infinite, runtime::start_child_atom::value,
                    ps.spec.make_instance(id))
        .then([done](const caf::actor&) { done("joined"); },
              [self, k, id](const caf::error& e) {
                --self->state.pools[k].pending;
                event(self, self->state.pools[k].spec.name, id, "failed", to_string(e));
              });
    },
    [self](ready_atom) {
      auto& st = self->state;
      --st.refilling;
      ++st.ready;
      event(self, "inventory", 0, "ready");
    },
    [self](finish_atom, std::size_t k, instance_id id, caf::actor engine) {
      finish_prefill(self, k, id, std::move(engine));
    },
  };
}

} // namespace

caf::actor spawn_autoscaler(caf::actor_system& sys, autoscaler_params params) {
  return sys.spawn(autoscaler_fn, std::move(params));
}

} // namespace troupe::actors
