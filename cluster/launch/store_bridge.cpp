#include "cluster/launch/store_bridge.hpp"
#include "cluster/launch/kv_bridge.hpp"

#include "ports/store_metrics.hpp"
#include "ports/store_router.hpp"
#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace troupe::cluster {

namespace {

std::string as_string(const std::vector<std::uint8_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

std::vector<std::uint8_t> as_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

caf::error fabric_failed(const char* what, const runtime::store_key& key, const caf::error& e) {
  return runtime::make_error(runtime::errc::unavailable,
                             std::string(what) + " of block " + runtime::to_string(key)
                               + " over the fabric failed: " + caf::to_string(e));
}

} // namespace

caf::actor spawn_store_front(caf::actor_system& sys, runtime::store_port store,
                             runtime::fabric_link_port link, std::chrono::seconds offer_ttl,
                             std::chrono::seconds pull_timeout) {
  return sys.spawn([store, link, offer_ttl,
                    pull_timeout](caf::event_based_actor* self) -> caf::behavior {
    return {
      [=](store_fetch& f) {
        auto rp = self->make_response_promise();
        self->request(store, pull_timeout, runtime::store_get{f.key})
          .then(
            [=](runtime::store_object& o) mutable {
              store_fetched answer{o.key, o.size, o.checksum, {}};
              if (o.payload.empty()) {
                rp.deliver(std::move(answer));
                return;
              }
              auto id = next_offer_id();
              self->request(link, pull_timeout, runtime::fabric_offer{id, as_string(o.payload)})
                .then(
                  [=](runtime::fabric_ticket& t) mutable {
                    caf::delayed_anon_send(link, offer_ttl, runtime::fabric_withdraw{id});
                    answer.ticket = std::move(t);
                    rp.deliver(std::move(answer));
                  },
                  [=](caf::error& e) mutable { rp.deliver(fabric_failed("the offer", f.key, e)); });
            },
            [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](store_deposit& d) {
        auto rp = self->make_response_promise();
        self->request(link, pull_timeout + std::chrono::seconds(5),
                      runtime::fabric_pull{d.ticket, pull_timeout})
          .then(
            [=](runtime::fabric_pulled& got) mutable {
              runtime::store_put put{d.key, d.size, as_bytes(got.bytes), d.ttl};
              self->request(store, pull_timeout, std::move(put))
                .then([=](runtime::store_stats& s) mutable { rp.deliver(std::move(s)); },
                      [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
            },
            [=](caf::error& e) mutable { rp.deliver(fabric_failed("the pull", d.key, e)); });
        return rp;
      },
      [=](store_release_atom, std::uint64_t id) {
        caf::anon_send(link, runtime::fabric_withdraw{id});
      },
    };
  });
}

namespace {

/// At most `limit` payload transfers of a proxy in flight; the others wait, in arrival order.
/// (A prefill of a long cached prompt asks for thousands of blocks at once; each transfer in
/// flight holds an offer of its payload in the control process.) Used on the proxy's thread
/// only.
struct transfer_gate {
  std::size_t limit = 1;
  std::size_t running = 0;
  std::deque<std::function<void()>> waiting;

  void admit(std::function<void()> start) {
    if (running < limit) {
      ++running;
      start();
    } else {
      waiting.push_back(std::move(start));
    }
  }

  /// A transfer ended: the next waiting one starts in its place.
  void done() {
    if (waiting.empty()) {
      --running;
      return;
    }
    auto next = std::move(waiting.front());
    waiting.pop_front();
    next();
  }
};

} // namespace

caf::actor spawn_store_registry(caf::actor_system& sys, std::uint32_t shards,
                                runtime::registry* metrics, std::chrono::milliseconds poll) {
  shards = std::max<std::uint32_t>(1, shards);
  struct shard_state {
    store_binding current;
    ports::store_metrics figures;
  };
  struct state {
    std::vector<shard_state> shards;
    std::vector<caf::actor> subscribers;
  };
  using poll_atom = caf::atom_constant<caf::atom("storepoll")>;
  return sys.spawn([shards, metrics, poll](caf::event_based_actor* self) -> caf::behavior {
    auto st = std::make_shared<state>();
    st->shards.resize(shards);
    for (std::uint32_t i = 0; i < shards; ++i) {
      st->shards[i].current.shard = i;
      st->shards[i].figures =
        ports::store_metrics::in(metrics, shards > 1 ? std::to_string(i) : std::string{});
    }
    auto tell_all = [self, st](std::uint32_t shard) {
      for (const auto& s : st->subscribers)
        self->send(s, caf::put_atom::value, st->shards[shard].current);
    };
    self->set_down_handler([st, tell_all](caf::down_msg& m) {
      auto& subs = st->subscribers;
      subs.erase(std::remove_if(subs.begin(), subs.end(),
                                [&](const caf::actor& s) { return s.address() == m.source; }),
                 subs.end());
      for (auto& sh : st->shards)
        if (sh.current.store && sh.current.store.address() == m.source) {
          sh.current = store_binding{{}, {}, sh.current.shard};
          tell_all(sh.current.shard);
        }
    });
    if (metrics != nullptr)
      self->send(self, poll_atom::value);
    return {
      [self, st, tell_all](caf::put_atom, store_binding& b) -> caf::result<caf::ok_atom> {
        if (b.shard >= st->shards.size())
          return runtime::make_error(
            runtime::errc::invalid_argument,
            "shard " + std::to_string(b.shard) + " does not exist: the cluster's store has "
              + std::to_string(st->shards.size()) + " shard(s) (storage.shards of the control "
              + "process's topology)");
        if (!b.store)
          return caf::ok_atom::value;
        auto& sh = st->shards[b.shard];
        self->monitor(b.store);
        sh.current = std::move(b);
        sh.figures.restart();  // a new store counts from zero
        tell_all(sh.current.shard);
        return caf::ok_atom::value;
      },
      [st](caf::get_atom, std::uint32_t shard) {
        return shard < st->shards.size() ? st->shards[shard].current
                                          : store_binding{{}, {}, shard};
      },
      [self, st](caf::join_atom, const caf::actor& subscriber) {
        self->monitor(subscriber);
        st->subscribers.push_back(subscriber);
        for (const auto& sh : st->shards)
          self->send(subscriber, caf::put_atom::value, sh.current);
      },
      [self, st, poll](poll_atom) {
        self->delayed_send(self, poll, poll_atom::value);
        for (std::uint32_t i = 0; i < st->shards.size(); ++i) {
          auto asked = st->shards[i].current.store;
          if (!asked)
            continue;
          self->request(asked, poll, runtime::store_stats_atom::value)
            .then(
              [st, i, asked](const runtime::store_stats& s) {
                if (st->shards[i].current.store == asked)
                  st->shards[i].figures.publish(s);
              },
              [](const caf::error&) {});
        }
      },
    };
  });
}

namespace {

/// What a store proxy keeps between messages (on its own thread only).
struct proxy_state {
  caf::actor registry;
  /// The shard of the store this proxy reaches.
  std::uint32_t shard = 0;
  runtime::fabric_link_port link;
  std::chrono::seconds timeout{30};
  /// The store of the moment; an invalid store: none known.
  store_binding bound;
  /// A lookup at the registry is under way; these wait for its answer (nullptr: no store).
  bool looking = false;
  std::vector<std::function<void(const store_binding*)>> waiting;
  /// Operations sent to `bound`: each fails at once if that store goes down.
  std::map<std::uint64_t, std::function<void()>> in_flight;
  std::uint64_t next_op = 0;
  transfer_gate gate;

  /// Calls `f` with the store (nullptr when there is none), asking the registry if need be.
  void with_store(caf::event_based_actor* self, std::function<void(const store_binding*)> f) {
    if (bound.store) {
      f(&bound);
      return;
    }
    waiting.push_back(std::move(f));
    if (looking)
      return;
    looking = true;
    auto answer = [this, self](store_binding* b) {
      looking = false;
      if (b != nullptr && b->store) {
        bound = std::move(*b);
        self->monitor(bound.store);
      }
      auto ready = std::move(waiting);
      waiting.clear();
      for (auto& w : ready)
        w(bound.store ? &bound : nullptr);
    };
    self->request(registry, timeout, caf::get_atom::value, shard)
      .then([answer](store_binding& b) { answer(&b); },
            [answer](const caf::error&) { answer(nullptr); });
  }

  /// The store went down: forget it, and fail what was sent to it.
  void lost(const caf::actor_addr& store) {
    if (!bound.store || bound.store.address() != store)
      return;
    bound = {};
    auto failing = std::move(in_flight);
    in_flight.clear();
    for (auto& [id, fail] : failing)
      fail();
  }

  /// The registry names the store of the moment (an invalid store: none). It sees a store
  /// process die even when this process had no connection of its own to it (CAF routes to a
  /// third process through the control process, and may not tell us of its loss).
  void told(caf::event_based_actor* self, store_binding b) {
    if (b.shard != shard || b.store == bound.store)
      return;
    if (bound.store)
      lost(bound.store.address());
    if (b.store) {
      bound = std::move(b);
      self->monitor(bound.store);
    }
  }
};

caf::error no_store(const char* why) {
  return runtime::make_error(runtime::errc::unavailable,
                             std::string("the cluster's block store ") + why);
}

/// Runs one operation of a proxy: once a store is known, `body(store, finish)` sends it there
/// and calls `finish` with the answer. The operation is answered once: by `finish`, or with
/// errc::unavailable when there is no store or the store goes down first. With `gated`, it
/// waits for a transfer slot first and frees it when answered.
template <class T>
caf::result<T> run_op(caf::event_based_actor* self, const std::shared_ptr<proxy_state>& st,
                      bool gated,
                      std::function<void(const store_binding&,
                                         std::function<void(caf::expected<T>)>)> body) {
  auto rp = self->make_response_promise<T>();
  auto begin = [self, st, gated, body, rp]() mutable {
    st->with_store(self, [self, st, gated, body, rp](const store_binding* b) mutable {
      const auto id = ++st->next_op;
      auto done = std::make_shared<bool>(false);
      std::function<void(caf::expected<T>)> finish = [st, gated, rp, done,
                                                       id](caf::expected<T> r) mutable {
        if (*done)
          return;
        *done = true;
        st->in_flight.erase(id);
        if (gated)
          st->gate.done();
        if (r)
          rp.deliver(std::move(*r));
        else
          rp.deliver(std::move(r.error()));
      };
      if (b == nullptr) {
        finish(no_store("is not available (its process is down or has not joined)"));
        return;
      }
      st->in_flight.emplace(id, [finish]() mutable {
        finish(no_store("went down during the operation"));
      });
      body(*b, finish);
    });
  };
  if (gated)
    st->gate.admit(std::move(begin));
  else
    begin();
  return rp;
}

/// An operation without a payload to move: sent to the store itself.
template <class T, class Msg>
caf::result<T> forward(caf::event_based_actor* self, const std::shared_ptr<proxy_state>& st,
                       Msg msg) {
  return run_op<T>(self, st, false,
                   [self, st, msg](const store_binding& b,
                                   std::function<void(caf::expected<T>)> finish) {
                     self->request(b.store, st->timeout, msg)
                       .then([finish](T& r) mutable { finish(std::move(r)); },
                             [finish](caf::error& e) mutable { finish(std::move(e)); });
                   });
}

} // namespace

runtime::store_port spawn_store_proxy(caf::actor_system& sys, caf::actor registry,
                                      runtime::fabric_link_port link,
                                      std::chrono::seconds timeout, std::size_t max_transfers,
                                      std::uint32_t shard) {
  auto st = std::make_shared<proxy_state>();
  st->registry = std::move(registry);
  st->shard = shard;
  st->link = std::move(link);
  st->timeout = timeout;
  st->gate.limit = std::max<std::size_t>(1, max_transfers);
  auto proxy = sys.spawn([st](caf::event_based_actor* self) -> caf::behavior {
    self->set_down_handler([st](caf::down_msg& m) { st->lost(m.source); });
    self->send(st->registry, caf::join_atom::value, caf::actor_cast<caf::actor>(self));
    const auto timeout = st->timeout;
    return {
      [self, st](caf::put_atom, store_binding& b) { st->told(self, std::move(b)); },
      [self, st, timeout](runtime::store_put& p) -> caf::result<runtime::store_stats> {
        if (!st->link || p.payload.empty())
          return forward<runtime::store_stats>(self, st, std::move(p));
        auto bytes = std::make_shared<std::string>(as_string(p.payload));
        store_deposit d{p.key, p.size, {}, p.ttl};
        return run_op<runtime::store_stats>(
          self, st, true,
          [self, st, timeout, bytes, d](const store_binding& b,
                                           std::function<void(caf::expected<runtime::store_stats>)>
                                             finish) mutable {
            if (!b.front) {  // the store's process has no fabric link
              self->request(b.store, timeout,
                            runtime::store_put{d.key, d.size, as_bytes(*bytes), d.ttl})
                .then([finish](runtime::store_stats& s) mutable { finish(std::move(s)); },
                      [finish](caf::error& e) mutable { finish(std::move(e)); });
              return;
            }
            auto link = st->link;
            auto id = next_offer_id();
            auto key = d.key;
            self->request(link, timeout, runtime::fabric_offer{id, std::move(*bytes)})
              .then(
                [self, link, timeout, b, d, id, finish](runtime::fabric_ticket& t) mutable {
                  d.ticket = std::move(t);
                  self->request(b.front, timeout * 2, std::move(d))
                    .then(
                      [link, id, finish](runtime::store_stats& s) mutable {
                        caf::anon_send(link, runtime::fabric_withdraw{id});
                        finish(std::move(s));
                      },
                      [link, id, finish](caf::error& e) mutable {
                        caf::anon_send(link, runtime::fabric_withdraw{id});
                        finish(std::move(e));
                      });
                },
                [key, finish](caf::error& e) mutable {
                  finish(fabric_failed("the offer", key, e));
                });
          });
      },
      [self, st, timeout](runtime::store_get& g) -> caf::result<runtime::store_object> {
        auto key = g.key;
        return run_op<runtime::store_object>(
          self, st, static_cast<bool>(st->link),
          [self, st, timeout, key](const store_binding& b,
                                   std::function<void(caf::expected<runtime::store_object>)>
                                     finish) {
            if (!st->link || !b.front) {  // no fabric here or there: the bytes in the answer
              self->request(b.store, timeout, runtime::store_get{key})
                .then([finish](runtime::store_object& o) mutable { finish(std::move(o)); },
                      [finish](caf::error& e) mutable { finish(std::move(e)); });
              return;
            }
            auto front = b.front;
            auto link = st->link;
            self->request(front, timeout, store_fetch{key})
              .then(
                [self, front, link, timeout, key, finish](store_fetched& f) mutable {
                  if (f.ticket.id == 0) {
                    finish(runtime::store_object{f.key, f.size, {}, f.checksum});
                    return;
                  }
                  auto id = f.ticket.id;
                  self->request(link, timeout + std::chrono::seconds(5),
                                runtime::fabric_pull{std::move(f.ticket), timeout})
                    .then(
                      [self, front, id, f, finish](runtime::fabric_pulled& got) mutable {
                        self->send(front, store_release_atom::value, id);
                        finish(runtime::store_object{f.key, f.size, as_bytes(got.bytes),
                                                     f.checksum});
                      },
                      [self, front, id, key, finish](caf::error& e) mutable {
                        self->send(front, store_release_atom::value, id);
                        finish(fabric_failed("the pull", key, e));
                      });
                },
                [finish](caf::error& e) mutable { finish(std::move(e)); });
          });
      },
      [self, st](runtime::store_has& h) { return forward<bool>(self, st, std::move(h)); },
      [self, st](runtime::store_delete& d) {
        return forward<runtime::store_stats>(self, st, std::move(d));
      },
      [self, st](runtime::store_list& l) {
        return forward<std::vector<runtime::store_entry>>(self, st, std::move(l));
      },
      [self, st](runtime::store_stats_atom a) {
        return forward<runtime::store_stats>(self, st, a);
      },
    };
  });
  return caf::actor_cast<runtime::store_port>(proxy);
}

runtime::store_port spawn_cluster_store(caf::actor_system& sys, caf::actor registry,
                                        std::uint32_t shards, std::uint32_t replicas,
                                        runtime::fabric_link_port link,
                                        runtime::registry* metrics) {
  std::vector<runtime::store_port> proxies;
  for (std::uint32_t i = 0; i < std::max<std::uint32_t>(1, shards); ++i)
    proxies.push_back(spawn_store_proxy(sys, registry, link, std::chrono::seconds(30), 32, i));
  return ports::spawn_store_router(sys, std::move(proxies), replicas, std::chrono::seconds(60),
                                   metrics);
}

} // namespace troupe::cluster
