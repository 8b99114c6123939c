#include "ports/store_router.hpp"

#include "runtime/errors.hpp"

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

std::vector<std::uint32_t> store_copies_of(const runtime::store_key& key, std::uint32_t shards,
                                           std::uint32_t replicas) {
  shards = std::max<std::uint32_t>(1, shards);
  replicas = std::clamp<std::uint32_t>(replicas, 1, shards);
  std::vector<std::uint32_t> out;
  out.reserve(replicas);
  const auto first = store_shard_of(key, shards);
  for (std::uint32_t c = 0; c < replicas; ++c)
    out.push_back((first + c) % shards);
  return out;
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

/// A put or delete sent to every copy: the copies still to answer, whether the answer went,
/// and the first copy's error.
struct copies_answer {
  std::size_t left = 0;
  bool answered = false;
  caf::error first_error;
};

/// Sends `msg` to every copy of its key; answers the stats of the first copy that succeeds,
/// or once every copy has failed, the first copy's error.
template <class Msg>
caf::result<runtime::store_stats> to_all_copies(runtime::store_port::pointer self,
                                                const std::vector<runtime::store_port>& copies,
                                                std::chrono::seconds timeout, Msg msg) {
  auto rp = self->make_response_promise<runtime::store_stats>();
  auto g = std::make_shared<copies_answer>();
  g->left = copies.size();
  for (std::size_t i = 0; i < copies.size(); ++i) {
    // The last copy takes the message; the others a copy of it (a put's payload too).
    auto m = i + 1 < copies.size() ? Msg{msg} : std::move(msg);
    self->request(copies[i], timeout, std::move(m))
      .then(
        [g, rp](runtime::store_stats& st) mutable {
          --g->left;
          if (!g->answered) {
            g->answered = true;
            rp.deliver(std::move(st));
          }
        },
        [g, rp, i](caf::error& e) mutable {
          --g->left;
          if (i == 0)
            g->first_error = std::move(e);
          if (g->left == 0 && !g->answered) {
            g->answered = true;
            rp.deliver(g->first_error ? g->first_error : e);
          }
        });
  }
  return rp;
}

/// Asks the copies of a key in order, from copy `i` on, until one answers `accept`ably; the
/// answer is that one's, else the first definite answer (a value, or not_found: a copy that
/// was reached), else the first copy's error (`first`).
template <class T, class Msg, class Accept>
void ask_copies(runtime::store_port::pointer self,
                std::shared_ptr<const std::vector<runtime::store_port>> copies,
                std::chrono::seconds timeout, Msg msg, Accept accept,
                caf::typed_response_promise<T> rp, std::size_t i,
                std::shared_ptr<caf::expected<T>> first) {
  auto next = [self, copies, timeout, msg, accept, rp, i,
               first](caf::expected<T> a) mutable {
    if (a && accept(*a)) {
      rp.deliver(std::move(*a));
      return;
    }
    auto definite = [](const caf::expected<T>& x) {
      return x || runtime::is(x.error(), runtime::errc::not_found);
    };
    if (i == 0 || (!definite(*first) && definite(a)))
      *first = std::move(a);
    if (i + 1 < copies->size()) {
      ask_copies<T>(self, copies, timeout, msg, accept, rp, i + 1, first);
      return;
    }
    if (*first)
      rp.deliver(std::move(**first));
    else
      rp.deliver(first->error());
  };
  self->request((*copies)[i], timeout, msg)
    .then([next](T& x) mutable { next(std::move(x)); },
          [next](caf::error& e) mutable { next(std::move(e)); });
}

runtime::store_port::behavior_type
store_router(runtime::store_port::pointer self,
             std::shared_ptr<const std::vector<runtime::store_port>> shards,
             std::uint32_t replicas, std::chrono::seconds timeout) {
  // The shards end with the router; a shard that ends alone fails only its own blocks.
  self->attach_functor([shards] {
    for (const auto& s : *shards)
      caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  });
  const auto count = static_cast<std::uint32_t>(shards->size());
  auto shard = [shards, count](const runtime::store_key& k) {
    return (*shards)[store_shard_of(k, count)];
  };
  auto copies = [shards, count, replicas](const runtime::store_key& k) {
    auto v = std::make_shared<std::vector<runtime::store_port>>();
    for (auto c : store_copies_of(k, count, replicas))
      v->push_back((*shards)[c]);
    return std::shared_ptr<const std::vector<runtime::store_port>>{std::move(v)};
  };
  return {
    [self, shard, copies, replicas, timeout](runtime::store_put& p) -> caf::result<runtime::store_stats> {
      if (replicas <= 1)
        return self->delegate(shard(p.key), std::move(p));
      return to_all_copies(self, *copies(p.key), timeout, std::move(p));
    },
    [self, shard, copies, replicas, timeout](const runtime::store_get& g) -> caf::result<runtime::store_object> {
      if (replicas <= 1)
        return self->delegate(shard(g.key), g);
      auto rp = self->make_response_promise<runtime::store_object>();
      ask_copies<runtime::store_object>(self, copies(g.key), timeout, g,
                                        [](const runtime::store_object&) { return true; }, rp,
                                        0, std::make_shared<caf::expected<runtime::store_object>>(caf::error{}));
      return rp;
    },
    [self, shard, copies, replicas, timeout](const runtime::store_has& h) -> caf::result<bool> {
      if (replicas <= 1)
        return self->delegate(shard(h.key), h);
      auto rp = self->make_response_promise<bool>();
      ask_copies<bool>(self, copies(h.key), timeout, h, [](bool has) { return has; }, rp, 0,
                       std::make_shared<caf::expected<bool>>(caf::error{}));
      return rp;
    },
    [self, shard, copies, replicas, timeout](const runtime::store_delete& d) -> caf::result<runtime::store_stats> {
      if (replicas <= 1)
        return self->delegate(shard(d.key), d);
      return to_all_copies(self, *copies(d.key), timeout, d);
    },
    [self, shards, timeout](const runtime::store_list& l) {
      using entries = std::vector<runtime::store_entry>;
      return ask_all<entries>(self, shards, timeout, l, [](std::vector<entries> parts) {
        entries all;
        for (auto& p : parts)
          all.insert(all.end(), p.begin(), p.end());
        // Each block once (its copies list it on several shards), with its latest expiry.
        std::sort(all.begin(), all.end(),
                  [](const runtime::store_entry& a, const runtime::store_entry& b) {
                    return a.key != b.key ? a.key < b.key : a.expires_at > b.expires_at;
                  });
        all.erase(std::unique(all.begin(), all.end(),
                              [](const runtime::store_entry& a, const runtime::store_entry& b) {
                                return a.key == b.key;
                              }),
                  all.end());
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
                                       std::uint32_t replicas, std::chrono::seconds timeout) {
  if (shards.size() == 1)
    return shards.front();
  replicas = std::clamp<std::uint32_t>(replicas, 1, static_cast<std::uint32_t>(shards.size()));
  auto all = std::make_shared<const std::vector<runtime::store_port>>(std::move(shards));
  return sys.spawn(store_router, std::move(all), replicas, timeout);
}

runtime::store_port spawn_sharded_posix_store(caf::actor_system& sys, posix_store_params params,
                                              std::uint32_t shards, std::uint32_t replicas) {
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
  return spawn_store_router(sys, std::move(ports), replicas);
}

} // namespace troupe::ports
