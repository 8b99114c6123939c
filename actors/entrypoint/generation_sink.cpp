// The sink actor between the serving graph and an HTTP connection (see generation_sink.hpp).
#include "actors/entrypoint/generation_sink.hpp"

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>

namespace troupe::actors {

namespace {

using give_up_atom = caf::atom_constant<caf::atom("give_up")>;

struct sink_state {
  generation_sink_config cfg;
  caf::actor request;       // the request actor, once the service answered
  bool cancel_wanted = false;
  bool give_up_armed = false;
  bool done = false;
  static inline const char* name = "generation_sink";
};

using sink_actor = caf::stateful_actor<sink_state>;

template <class F>
void post(sink_actor* self, F f) {
  auto& st = self->state;
  if (!st.cfg.post)
    return;
  st.cfg.post([w = st.cfg.listener, f = std::move(f)]() mutable {
    if (auto l = w.lock())
      f(*l);
  });
}

void finish(sink_actor* self) {
  self->state.done = true;
  if (self->state.request)
    self->demonitor(self->state.request);
  self->quit();
}

void arm_give_up(sink_actor* self) {
  if (self->state.give_up_armed)
    return;
  self->state.give_up_armed = true;
  self->delayed_send(self, self->state.cfg.cancel_timeout, give_up_atom::value);
}

caf::behavior sink(sink_actor* self) {
  auto& st = self->state;
  st.cfg.request.sink = caf::actor_cast<caf::actor>(self);
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& s = self->state;
    if (s.done || msg.source != s.request)
      return;
    // The graph may send the end from another actor: wait a moment before calling it lost.
    s.cancel_wanted = true;
    arm_give_up(self);
  });
  self->request(st.cfg.service, st.cfg.service_timeout, st.cfg.request)
    .then(
      [self](caf::actor& request) {
        auto& s = self->state;
        if (s.done)
          return;
        s.request = request;
        if (request)
          self->monitor(request);
        if (s.cancel_wanted && request) {
          self->send(request, cancel_atom::value);
          arm_give_up(self);
        }
        post(self, [](generation_listener& l) { l.on_accepted(); });
      },
      [self](caf::error& err) {
        auto& s = self->state;
        if (s.done)
          return;
        std::string why = err == caf::sec::request_timeout
                            ? std::string("the serving graph did not answer in time")
                            : "the serving graph refused the request: "
                                + self->system().render(err);
        post(self, [why = std::move(why)](generation_listener& l) { l.on_rejected(why); });
        finish(self);
      });
  return {
    [self](generation_tokens& t) {
      if (self->state.done)
        return;
      post(self, [t = std::move(t)](generation_listener& l) mutable { l.on_tokens(std::move(t)); });
    },
    [self](generation_end& e) {
      if (self->state.done)
        return;
      post(self, [e = std::move(e)](generation_listener& l) mutable { l.on_end(std::move(e)); });
      finish(self);
    },
    [self](cancel_atom) {
      auto& s = self->state;
      if (s.done || s.cancel_wanted)
        return;
      s.cancel_wanted = true;
      // Before the service answered there is nothing to cancel yet: the answer handler
      // forwards it (the service's own timeout bounds that wait).
      if (s.request) {
        self->send(s.request, cancel_atom::value);
        arm_give_up(self);
      }
    },
    [self](give_up_atom) {
      if (self->state.done)
        return;
      post(self, [](generation_listener& l) {
        l.on_lost("the request ended without its final message");
      });
      finish(self);
    },
  };
}

} // namespace

caf::actor spawn_generation_sink(caf::actor_system& sys, generation_sink_config cfg) {
  return sys.spawn([cfg = std::move(cfg)](sink_actor* self) mutable {
    self->state.cfg = std::move(cfg);
    return sink(self);
  });
}

} // namespace troupe::actors
