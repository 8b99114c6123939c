#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/device.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <memory>
#include <unordered_map>

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

/// A uniform in [0, 1) from (sequence, position, salt): splitmix64 of the three.
double unit(std::uint64_t sequence, std::uint64_t position, std::uint64_t salt) noexcept {
  auto x = sequence * 0x9e3779b97f4a7c15ull + position * 0xd1b54a32d192ed03ull + salt;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * 0x1p-53;
}

} // namespace

float sim_draft_model::confidence(std::uint64_t sequence, std::uint64_t position,
                                  std::uint32_t depth) const {
  const auto j = std::clamp<std::uint32_t>(depth, 1, static_cast<std::uint32_t>(mean.size()));
  const double c = mean[j - 1] + spread * (unit(sequence, position, 0x5eed1) - 0.5);
  return static_cast<float>(std::clamp(c, 0.01, 0.99));
}

bool sim_draft_model::accepted(std::uint64_t sequence, std::uint64_t position,
                               std::uint32_t depth) const {
  return unit(sequence, position, 0xacce97) < confidence(sequence, position, depth);
}

namespace {

/// The one snapshot every sim device answers exports with: empty, shared, made once.
const kv_snapshot_ptr& empty_snapshot() {
  static const kv_snapshot_ptr snapshot = std::make_shared<const kv_snapshot>(
    kv_snapshot{"sim", 0, {}, {}, {}, {}});
  return snapshot;
}

struct sim_device_state {
  step_cost_fn cost;
  sim_draft_model drafts;
  /// When the device finishes the work queued so far.
  time_point busy_until{};
  /// Speculating sequences (`propose`): the tokens each one's cache holds after the steps
  /// queued so far, where a `feed_drawn` row of theirs starts.
  std::unordered_map<std::uint64_t, std::uint64_t> held;
  static inline const char* name = "sim_device";
};

caf::behavior sim_device_fn(caf::stateful_actor<sim_device_state>* self, step_cost_fn cost,
                           sim_draft_model drafts) {
  self->state.cost = std::move(cost);
  self->state.drafts = drafts;
  return {
    [self](device_step& step) {
      auto& st = self->state;
      auto started = std::max(self->clock().now() + step.prepare, st.busy_until);
      st.busy_until = started + std::max(duration{0}, st.cost(step));
      device_result r{step.id, started, st.busy_until, {}};
      r.sampled.reserve(step.batch.size());
      for (auto& s : step.batch) {
        if (s.feed_drawn) {
          // Built while this sequence's previous step ran: start where that one left the cache
          // (speculating sequences; the others' position is exact).
          if (auto h = st.held.find(s.sequence); h != st.held.end())
            s.position = h->second;
        }
        if (!s.sample)
          continue;
        // The token after the first new one, then one more per accepted draft.
        const auto first = s.position + s.count - s.verify;
        std::uint32_t accepted = 0;
        // (Draft j sits at position first − 1 + j.)
        while (accepted < s.verify && st.drafts.accepted(s.sequence, first + accepted,
                                                         accepted + 1))
          ++accepted;
        for (std::uint32_t i = 0; i <= accepted; ++i)
          r.sampled.push_back({s.sequence, modelled_token(s.sequence, first + i), 0.0f, {}});
        if (s.propose) {
          st.held[s.sequence] = first + accepted;
          // Drafts for the positions after the last token answered.
          draft_proposal d{s.sequence, {}, {}};
          const auto next = first + accepted;
          for (std::uint32_t j = 1; j <= st.drafts.mean.size(); ++j)
            d.confidences.push_back(st.drafts.confidence(s.sequence, next + j, j));
          r.drafts.push_back(std::move(d));
        }
      }
      return detail::reply_at(self, st.busy_until, std::move(r));
    },
    [self](const device_release& r) { self->state.held.erase(r.sequence); },
    // A hand-off takes no device time here (the link port costs the bytes); it is answered
    // after the steps queued before it, as a real device answers it.
    [self](const kv_export&) {
      auto& st = self->state;
      return detail::reply_at(self, st.busy_until, empty_snapshot());
    },
    [self](const kv_import&) {
      auto& st = self->state;
      return detail::reply_at(self, st.busy_until, caf::ok_atom::value);
    },
    [](const kv_keep&) {},
    [](const kv_kept_export&) -> caf::result<kv_snapshot_ptr> {
      return make_error(device_errc::unknown_sequence,
                        "the simulated device keeps no window state");
    },
    [self](const kv_restore& x) {
      auto& st = self->state;
      return detail::reply_at(self, st.busy_until,
                              kv_restored{x.blocks ? x.blocks->length : 0, false});
    },
  };
}

} // namespace

device_port spawn_sim_device(caf::actor_system& sys, step_cost_fn cost, sim_draft_model drafts) {
  return caf::actor_cast<device_port>(sys.spawn(sim_device_fn, std::move(cost), drafts));
}

} // namespace troupe::runtime
