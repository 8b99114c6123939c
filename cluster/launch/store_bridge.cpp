#include "cluster/launch/store_bridge.hpp"
#include "cluster/launch/kv_bridge.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <deque>
#include <functional>
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

runtime::store_port spawn_store_proxy(caf::actor_system& sys, runtime::store_port store,
                                      caf::actor front, runtime::fabric_link_port link,
                                      std::chrono::seconds timeout, std::size_t max_transfers) {
  const bool fabric = front && link;
  auto gate = std::make_shared<transfer_gate>();
  gate->limit = std::max<std::size_t>(1, max_transfers);
  auto proxy = sys.spawn([store, front, link, timeout, fabric,
                          gate](caf::event_based_actor* self) -> caf::behavior {
    return {
      [=](runtime::store_put& p) -> caf::result<runtime::store_stats> {
        if (!fabric || p.payload.empty())
          return self->delegate(store, std::move(p));
        auto rp = self->make_response_promise<runtime::store_stats>();
        auto key = p.key;
        auto bytes = std::make_shared<std::string>(as_string(p.payload));
        store_deposit d{p.key, p.size, {}, p.ttl};
        gate->admit([=]() mutable {
          auto id = next_offer_id();
          self->request(link, timeout, runtime::fabric_offer{id, std::move(*bytes)})
            .then(
              [=](runtime::fabric_ticket& t) mutable {
                d.ticket = std::move(t);
                self->request(front, timeout * 2, std::move(d))
                  .then(
                    [=](runtime::store_stats& s) mutable {
                      caf::anon_send(link, runtime::fabric_withdraw{id});
                      gate->done();
                      rp.deliver(std::move(s));
                    },
                    [=](caf::error& e) mutable {
                      caf::anon_send(link, runtime::fabric_withdraw{id});
                      gate->done();
                      rp.deliver(std::move(e));
                    });
              },
              [=](caf::error& e) mutable {
                gate->done();
                rp.deliver(fabric_failed("the offer", key, e));
              });
        });
        return rp;
      },
      [=](runtime::store_get& g) -> caf::result<runtime::store_object> {
        if (!fabric)
          return self->delegate(store, std::move(g));
        auto rp = self->make_response_promise<runtime::store_object>();
        auto key = g.key;
        gate->admit([=]() mutable {
          self->request(front, timeout, store_fetch{key})
            .then(
              [=](store_fetched& f) mutable {
                if (f.ticket.id == 0) {
                  gate->done();
                  rp.deliver(runtime::store_object{f.key, f.size, {}, f.checksum});
                  return;
                }
                auto id = f.ticket.id;
                self->request(link, timeout + std::chrono::seconds(5),
                              runtime::fabric_pull{std::move(f.ticket), timeout})
                  .then(
                    [=](runtime::fabric_pulled& got) mutable {
                      self->send(front, store_release_atom::value, id);
                      gate->done();
                      rp.deliver(runtime::store_object{f.key, f.size, as_bytes(got.bytes),
                                                       f.checksum});
                    },
                    [=](caf::error& e) mutable {
                      self->send(front, store_release_atom::value, id);
                      gate->done();
                      rp.deliver(fabric_failed("the pull", key, e));
                    });
              },
              [=](caf::error& e) mutable {
                gate->done();
                rp.deliver(std::move(e));
              });
        });
        return rp;
      },
      [=](runtime::store_has& h) { return self->delegate(store, std::move(h)); },
      [=](runtime::store_delete& d) { return self->delegate(store, std::move(d)); },
      [=](runtime::store_list& l) { return self->delegate(store, std::move(l)); },
      [=](runtime::store_stats_atom a) { return self->delegate(store, a); },
    };
  });
  return caf::actor_cast<runtime::store_port>(proxy);
}

} // namespace troupe::cluster
