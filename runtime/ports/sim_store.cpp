#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/store.hpp"

#include "runtime/check.hpp"
#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <map>

namespace troupe::runtime {

namespace {

struct stored {
  std::uint64_t size = 0;
  std::vector<std::uint8_t> payload;
};

struct sim_store_state {
  sim_store_params params;
  std::map<std::uint64_t, stored> objects;
  std::uint64_t used = 0;
  /// When the store's bandwidth has moved every byte queued so far.
  time_point busy_until{};
  detail::delayed_replies replies;
  static inline const char* name = "sim_store";

  store_stats stats() const { return {params.capacity, used, objects.size()}; }
};

using store_actor = caf::stateful_actor<sim_store_state>;

/// When an operation moving `bytes` completes if it arrives now.
time_point completion(store_actor* self, std::uint64_t bytes) {
  auto& st = self->state;
  auto started = std::max(self->clock().now(), st.busy_until);
  st.busy_until = started + from_seconds(static_cast<double>(bytes) / st.params.bandwidth);
  return st.busy_until + st.params.latency;
}

caf::behavior sim_store_fn(store_actor* self, sim_store_params params) {
  TROUPE_CHECK(params.bandwidth > 0, "sim_store: bandwidth must be > 0");
  self->state.params = params;
  auto metadata_done = [self] { return self->clock().now() + self->state.params.latency; };
  return {
    [self, metadata_done](store_put& put) {
      auto& st = self->state;
      if (!put.payload.empty() && put.payload.size() != put.size)
        return st.replies.fail_at(self, metadata_done(),
                                  make_error(errc::invalid_argument,
                                             "payload size differs from declared size"));
      auto old = st.objects.find(put.key);
      auto freed = old != st.objects.end() ? old->second.size : 0;
      if (st.used - freed + put.size > st.params.capacity)
        return st.replies.fail_at(self, metadata_done(),
                                  make_error(errc::store_full,
                                             std::to_string(put.size) + " bytes, "
                                               + std::to_string(st.params.capacity - st.used)
                                               + " free"));
      st.used = st.used - freed + put.size;
      st.objects[put.key] = stored{put.size, std::move(put.payload)};
      return st.replies.at(self, completion(self, put.size), st.stats());
    },
    [self, metadata_done](const store_get& get) {
      auto& st = self->state;
      auto i = st.objects.find(get.key);
      if (i == st.objects.end())
        return st.replies.fail_at(self, metadata_done(),
                                  make_error(errc::not_found, std::to_string(get.key)));
      return st.replies.at(self, completion(self, i->second.size),
                           store_object{get.key, i->second.size, i->second.payload});
    },
    [self, metadata_done](const store_has& has) {
      auto& st = self->state;
      return st.replies.at(self, metadata_done(), st.objects.count(has.key) > 0);
    },
    [self, metadata_done](const store_delete& del) {
      auto& st = self->state;
      auto i = st.objects.find(del.key);
      if (i == st.objects.end())
        return st.replies.fail_at(self, metadata_done(),
                                  make_error(errc::not_found, std::to_string(del.key)));
      st.used -= i->second.size;
      st.objects.erase(i);
      return st.replies.at(self, metadata_done(), st.stats());
    },
    [self, metadata_done](store_stats_atom) {
      return self->state.replies.at(self, metadata_done(), self->state.stats());
    },
    [self](detail::reply_timer_atom, std::uint64_t token) { self->state.replies.fire(token); },
  };
}

} // namespace

store_port spawn_sim_store(caf::actor_system& sys, sim_store_params params) {
  return caf::actor_cast<store_port>(sys.spawn(sim_store_fn, params));
}

} // namespace troupe::runtime
