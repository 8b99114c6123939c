#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/store.hpp"
#include "runtime/ports/store_index.hpp"

#include "runtime/check.hpp"
#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <xxhash.h>

#include <algorithm>
#include <map>

namespace troupe::runtime {

namespace {

struct sim_store_state {
  sim_store_params params;
  store_index index{0};
  /// Payloads of the objects put with one (none for objects put by size only).
  std::map<store_key, std::vector<std::uint8_t>> payloads;
  /// When the store's bandwidth has moved every byte queued so far.
  time_point busy_until{};
  static inline const char* name = "sim_store";

  void drop(const std::vector<store_key>& keys) {
    for (const auto& k : keys)
      payloads.erase(k);
  }
};

using store_actor = caf::stateful_actor<sim_store_state>;

/// The actor clock as an index instant.
store_index::instant instant_of(time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

time_point time_of(store_index::instant i) {
  if (i == store_index::never)
    return store_never_expires;
  return time_point{std::chrono::duration_cast<time_point::duration>(
    std::chrono::nanoseconds{i})};
}

/// When an operation moving `bytes` completes if it arrives now.
time_point completion(store_actor* self, std::uint64_t bytes) {
  auto& st = self->state;
  auto started = std::max(self->clock().now(), st.busy_until);
  st.busy_until = started + from_seconds(static_cast<double>(bytes) / st.params.bandwidth);
  return st.busy_until + st.params.latency;
}

/// Removes the objects whose expiry has passed; every request starts with it.
void sweep(store_actor* self) {
  auto& st = self->state;
  st.drop(st.index.sweep(instant_of(self->clock().now())));
}

caf::behavior sim_store_fn(store_actor* self, sim_store_params params) {
  TROUPE_CHECK(params.bandwidth > 0, "sim_store: bandwidth must be > 0");
  self->state.params = params;
  self->state.index = store_index{params.capacity};
  auto metadata_done = [self] { return self->clock().now() + self->state.params.latency; };
  return {
    [self, metadata_done](store_put& put) {
      auto& st = self->state;
      if (!put.payload.empty() && put.payload.size() != put.size)
        return detail::reply_at(self, metadata_done(),
                                make_error(errc::invalid_argument,
                                           "payload size differs from declared size"));
      if (put.ttl < duration{0})
        return detail::reply_at(self, metadata_done(),
                                make_error(errc::invalid_argument, "negative ttl"));
      sweep(self);
      auto victims = st.index.make_room(put.key, put.size);
      if (!victims)
        return detail::reply_at(self, metadata_done(),
                                make_error(errc::store_full,
                                           std::to_string(put.size) + " bytes, capacity "
                                             + std::to_string(st.params.capacity)));
      st.drop(*victims);
      auto now = instant_of(self->clock().now());
      auto ttl_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(put.ttl).count();
      st.index.insert(put.key, {put.size, put.size, store_index::expiry_after(now, ttl_ns)});
      if (put.payload.empty())
        st.payloads.erase(put.key);
      else
        st.payloads[put.key] = std::move(put.payload);
      return detail::reply_at(self, completion(self, put.size), st.index.stats());
    },
    [self, metadata_done](const store_get& get) {
      auto& st = self->state;
      sweep(self);
      auto* e = st.index.find(get.key);
      if (e == nullptr) {
        st.index.count_miss();
        return detail::reply_at(self, metadata_done(),
                                make_error(errc::not_found, to_string(get.key)));
      }
      st.index.count_hit();
      st.index.touch(get.key);
      store_object obj{get.key, e->size, {}};
      if (auto p = st.payloads.find(get.key); p != st.payloads.end()) {
        obj.payload = p->second; // the store keeps its copy
        obj.checksum = XXH3_64bits(obj.payload.data(), obj.payload.size());
      }
      return detail::reply_at(self, completion(self, e->size), std::move(obj));
    },
    [self, metadata_done](const store_has& has) {
      auto& st = self->state;
      sweep(self);
      return detail::reply_at(self, metadata_done(), st.index.find(has.key) != nullptr);
    },
    [self, metadata_done](const store_delete& del) {
      auto& st = self->state;
      sweep(self);
      if (!st.index.erase(del.key))
        return detail::reply_at(self, metadata_done(),
                                make_error(errc::not_found, to_string(del.key)));
      st.payloads.erase(del.key);
      return detail::reply_at(self, metadata_done(), st.index.stats());
    },
    [self, metadata_done](const store_list&) {
      auto& st = self->state;
      sweep(self);
      std::vector<store_entry> out;
      out.reserve(st.index.objects());
      st.index.for_each([&](const store_key& k, const store_index::entry& e) {
        out.push_back(store_entry{k, e.size, time_of(e.expiry)});
      });
      return detail::reply_at(self, metadata_done(), std::move(out));
    },
    [self, metadata_done](store_stats_atom) {
      sweep(self);
      return detail::reply_at(self, metadata_done(), self->state.index.stats());
    },
  };
}

} // namespace

store_port spawn_sim_store(caf::actor_system& sys, sim_store_params params) {
  return caf::actor_cast<store_port>(sys.spawn(sim_store_fn, params));
}

} // namespace troupe::runtime
