// delayed_reply: answer a request at a later instant of the actor clock.
//
// Simulated ports (device, link, store), the simulated KV shards and the script device answer
// a request only when the modelled work is done. `reply_at` hands the response message itself
// to the actor clock for that instant (virtual time in the simulator): the message a response
// promise would send then, with the request's sender, id and stages. One event per answer,
// where a timer to the port that then delivers a promise takes two.
#pragma once

#include "runtime/time.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/response_promise.hpp>

#include <algorithm>
#include <utility>

namespace troupe::runtime::detail {

/// Answers the request being handled with `value` (a result, or a caf::error to fail it) at
/// `when` (at the current instant, after what is due now, if `when` has passed). The request
/// counts as answered: the handler returns the result of this call (untyped actors) or
/// `caf::delegated<T>` (typed ones).
template <class T>
caf::response_promise reply_at(caf::local_actor* self, time_point when, T value) {
  auto* request = self->current_mailbox_element();
  auto& mid = request->mid;
  if (mid.is_answered() || !mid.is_request())
    return {};
  auto at = std::max(when, self->clock().now());
  auto& stages = request->stages;
  if (!stages.empty()) {
    // A forwarded request: the answer goes to the next stage, on behalf of the sender.
    auto next = std::move(stages.back());
    stages.pop_back();
    self->clock().schedule_message(
      at, std::move(next),
      caf::make_mailbox_element(std::move(request->sender), mid, std::move(stages),
                                std::move(value)));
  } else if (request->sender) {
    self->clock().schedule_message(
      at, std::move(request->sender),
      caf::make_mailbox_element(self->ctrl(), mid.response_id(), {}, std::move(value)));
  }
  mid.mark_as_answered();
  return {};
}

} // namespace troupe::runtime::detail
