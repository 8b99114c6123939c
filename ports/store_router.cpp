#include "ports/store_router.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace troupe::ports {

std::uint32_t store_shard_of(const runtime::store_key& key, std::uint32_t shards) noexcept {
  return static_cast<std::uint32_t>(key.lo % std::max<std::uint32_t>(1, shards));
}

std::filesystem::path store_shard_directory(const std::filesystem::path& root,
                                            std::uint32_t index, std::uint32_t shards) {
  if (shards <= 1)
    return root;
  return root / ("shard-" + std::to_string(index) + "-of-" + std::to_string(shards));
}

namespace {

/// Asks every shard `msg` and answers `combine(answers)` once all have answered, or the first
/// error.
template <class T, class Msg, class Combine>
caf::result<T> ask_all(runtime::store_port::pointer self,
                       const std::shared_ptr<const std::vector<runtime::store_port>>& shards,
                       std::chrono::seconds timeout, Msg msg, Combine combine) {
  auto rp = self->make_response_promise<T>();
  struct gather {
    std::vector<T> answers;
    std::size_t left = 0;
    bool failed = false;
  };
  auto g = std::make_shared<gather>();
  g->answers.resize(shards->size());
  g->left = shards->size();
  for (std::size_t i = 0; i < shards->size(); ++i)
    self->request((*shards)[i], timeout, msg)
      .then(
        [g, rp, i, combine](T& answer) mutable {
          if (g->failed)
            return;
          g->answers[i] = std::move(answer);
          if (--g->left == 0)
            rp.deliver(combine(std::move(g->answers)));
        },
        [g, rp](caf::error& e) mutable {
          if (g->failed)
            return;
          g->failed = true;
          rp.deliver(std::move(e));
        });
  return rp;
}

runtime::store_port::behavior_type
store_router(runtime::store_port::pointer self,
             std::shared_ptr<const std::vector<runtime::store_port>> shards,
             std::chrono::seconds timeout) {
  // The shards end with the router; a shard that ends alone fails only its own blocks.
  self->attach_functor([shards] {
    for (const auto& s : *shards)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  });
  auto shard = [shards](const runtime::store_key& k) {
    return (*shards)[store_shard_of(k, static_cast<std::uint32_t>(shards->size()))];
  };
  return {
    [self, shard](runtime::store_put& p) { return self->delegate(shard(p.key), std::move(p)); },
    [self, shard](const runtime::store_get& g) { return self->delegate(shard(g.key), g); },
    [self, shard](const runtime::store_has& h) { return self->delegate(shard(h.key), h); },
    [self, shard](const runtime::store_delete& d) { return self->delegate(shard(d.key), d); },
    [self, shards, timeout](const runtime::store_list& l) {
      using entries = std::vector<runtime::store_entry>;
      return ask_all<entries>(self, shards, timeout, l, [](std::vector<entries> parts) {
        entries all;
        for (auto& p : parts)
          all.insert(all.end(), p.begin(), p.end());
        std::sort(all.begin(), all.end(),
                  [](const runtime::store_entry& a, const runtime::store_entry& b) {
                    return a.key < b.key;
                  });
        return all;
      });
    },
    [self, shards, timeout](runtime::store_stats_atom a) {
      return ask_all<runtime::store_stats>(
        self, shards, timeout, a, [](std::vector<runtime::store_stats> parts) {
          runtime::store_stats sum;
          for (const auto& s : parts) {
            sum.capacity += s.capacity;
            sum.used += s.used;
            sum.objects += s.objects;
            sum.hits += s.hits;
            sum.misses += s.misses;
            sum.corrupt += s.corrupt;
            sum.evicted += s.evicted;
            sum.expired += s.expired;
          }
          return sum;
        });
    },
  };
}

} // namespace

runtime::store_port spawn_store_router(caf::actor_system& sys,
                                       std::vector<runtime::store_port> shards,
                                       std::chrono::seconds timeout) {
  if (shards.size() == 1)
    return shards.front();
  auto all = std::make_shared<const std::vector<runtime::store_port>>(std::move(shards));
  return sys.spawn(store_router, std::move(all), timeout);
}

runtime::store_port spawn_sharded_posix_store(caf::actor_system& sys, posix_store_params params,
                                              std::uint32_t shards) {
  shards = std::max<std::uint32_t>(1, shards);
  std::vector<runtime::store_port> ports;
  for (std::uint32_t i = 0; i < shards; ++i) {
    auto p = params;
    p.directory = store_shard_directory(params.directory, i, shards);
    p.capacity = params.capacity / shards;
    if (shards > 1)
      p.metrics_shard = std::to_string(i);
    ports.push_back(spawn_posix_store(sys, std::move(p)));
  }
  return spawn_store_router(sys, std::move(ports));
}

} // namespace troupe::ports
