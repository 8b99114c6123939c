// delayed_reply: answer a request at a later instant of the actor clock.
//
// Simulated ports (device, link, store) answer a request only when the modelled work is done.
// They keep the request's response promise, send themselves a timer through the actor clock
// (so that it runs in virtual time), and deliver the result when the timer fires. This helper
// holds the pending promises of one actor; the actor forwards its timer message to `fire`.
#pragma once

#include "runtime/time.hpp"

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>

#include <cstdint>
#include <map>
#include <utility>

namespace troupe::runtime::detail {

using reply_timer_atom = caf::atom_constant<caf::atom("replytimer")>;

class delayed_replies {
public:
  /// Delivers `value` to the sender of the current request at `when` (at once if `when` has
  /// passed). Returns the promise, to be returned from the handler.
  template <class T>
  caf::response_promise at(caf::event_based_actor* self, time_point when, T value) {
    auto rp = self->make_response_promise();
    auto token = next_++;
    pending_.emplace(token, [rp, v = std::move(value)]() mutable { rp.deliver(std::move(v)); });
    auto now = self->clock().now();
    self->delayed_send(self, when > now ? when - now : duration{0}, reply_timer_atom::value,
                       token);
    return rp;
  }

  /// Fails the current request with `err` at `when`.
  caf::response_promise fail_at(caf::event_based_actor* self, time_point when, caf::error err) {
    auto rp = self->make_response_promise();
    auto token = next_++;
    pending_.emplace(token, [rp, e = std::move(err)]() mutable { rp.deliver(std::move(e)); });
    auto now = self->clock().now();
    self->delayed_send(self, when > now ? when - now : duration{0}, reply_timer_atom::value,
                       token);
    return rp;
  }

  /// Delivers the reply scheduled under `token` (from the timer message).
  void fire(std::uint64_t token) {
    auto i = pending_.find(token);
    if (i == pending_.end())
      return;
    auto deliver = std::move(i->second);
    pending_.erase(i);
    deliver();
  }

  /// Replies scheduled and not yet delivered.
  std::size_t pending() const noexcept { return pending_.size(); }

private:
  std::uint64_t next_ = 1;
  std::map<std::uint64_t, std::function<void()>> pending_;
};

} // namespace troupe::runtime::detail
