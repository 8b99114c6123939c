#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/device.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <memory>

namespace troupe::runtime {

std::string to_string(step_phase p) {
  switch (p) {
    case step_phase::prefill:
      return "prefill";
    case step_phase::decode:
      return "decode";
    case step_phase::encode:
      return "encode";
  }
  return "?";
}

std::int32_t modelled_token(std::uint64_t sequence, std::uint64_t position) noexcept {
  // splitmix64 of the pair, folded to a non-negative 31-bit id.
  auto x = sequence * 0x9e3779b97f4a7c15ull + position + 0x632be59bd9b4e019ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::int32_t>((x ^ (x >> 31)) & 0x7fffffffu);
}

namespace {

/// The one snapshot every sim device answers exports with: empty, shared, made once.
const kv_snapshot_ptr& empty_snapshot() {
  static const kv_snapshot_ptr snapshot = std::make_shared<const kv_snapshot>(
    kv_snapshot{"sim", 0, {}, {}, {}});
  return snapshot;
}

struct sim_device_state {
  step_cost_fn cost;
  /// When the device finishes the work queued so far.
  time_point busy_until{};
  detail::delayed_replies replies;
  static inline const char* name = "sim_device";
};

caf::behavior sim_device_fn(caf::stateful_actor<sim_device_state>* self, step_cost_fn cost) {
  self->state.cost = std::move(cost);
  return {
    [self](const device_step& step) {
      auto& st = self->state;
      auto started = std::max(self->clock().now(), st.busy_until);
      st.busy_until = started + std::max(duration{0}, st.cost(step));
      device_result r{step.id, started, st.busy_until, {}};
      r.sampled.reserve(step.batch.size());
      for (const auto& s : step.batch)
        if (s.sample)
          r.sampled.push_back({s.sequence, modelled_token(s.sequence, s.position + s.count), 0.0f,
                               {}});
      return st.replies.at(self, st.busy_until, std::move(r));
    },
    [](const device_release&) {},
    // A hand-off takes no device time here (the link port costs the bytes); it is answered
    // after the steps queued before it, as a real device answers it.
    [self](const kv_export&) {
      auto& st = self->state;
      return st.replies.at(self, std::max(self->clock().now(), st.busy_until), empty_snapshot());
    },
    [self](const kv_import&) {
      auto& st = self->state;
      return st.replies.at(self, std::max(self->clock().now(), st.busy_until),
                           caf::ok_atom::value);
    },
    [](const kv_keep&) {},
    [self](const kv_restore& x) {
      auto& st = self->state;
      return st.replies.at(self, std::max(self->clock().now(), st.busy_until),
                           kv_restored{x.blocks ? x.blocks->length : 0, false});
    },
    [self](detail::reply_timer_atom, std::uint64_t token) { self->state.replies.fire(token); },
  };
}

} // namespace

device_port spawn_sim_device(caf::actor_system& sys, step_cost_fn cost) {
  return caf::actor_cast<device_port>(sys.spawn(sim_device_fn, std::move(cost)));
}

} // namespace troupe::runtime
