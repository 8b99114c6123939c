#include "actors/request/request.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

namespace troupe::actors {

namespace {

struct request_state {
  request_spec spec;
  request_services services;
  request_outcome outcome;
  static inline const char* name = "request";
};

using request_ptr = caf::stateful_actor<request_state>*;

void finish(request_ptr self, std::string failure) {
  auto& o = self->state.outcome;
  o.completed = failure.empty();
  o.failure = std::move(failure);
  o.finished = self->clock().now();
  self->send(self->state.services.sink, o);
  self->quit();
}

auto fail_with(request_ptr self, std::string phase) {
  return [self, phase](const caf::error& err) {
    finish(self, phase + ": " + self->system().render(err));
  };
}

void decode(request_ptr self) {
  auto& st = self->state;
  auto kv_tokens = st.spec.input_tokens;
  self->request(st.services.decode, caf::infinite, decode_route{st.spec.id, kv_tokens})
    .then(
      [self, kv_tokens](const decode_assignment& a) {
        auto& st = self->state;
        st.outcome.decode_instance = a.instance;
        // The first token came with prefill; decode generates the rest.
        auto rest = st.spec.output_tokens > 0 ? st.spec.output_tokens - 1 : 0;
        decode_job job;
        job.request = st.spec.id;
        job.context_tokens = kv_tokens;
        job.output_tokens = rest;
        job.kv_bytes = kv_tokens * st.services.kv_bytes_per_token;
        // The blocks decode fills continue the prompt's chain.
        if (!st.spec.chain.empty()) {
          job.parent = st.spec.chain.back();
          job.parent_blocks = st.spec.chain.size();
        }
        job.traffic = st.spec.traffic;
        self->request(a.engine, caf::infinite, job)
          .then(
            [self, a, kv_tokens](const decode_done& done) {
              auto& st = self->state;
              st.outcome.delivered_tokens += done.tokens;
              self->send(st.services.decode, decode_release{a.instance, kv_tokens});
              finish(self, "");
            },
            [self, a, kv_tokens](const caf::error& err) {
              self->send(self->state.services.decode, decode_release{a.instance, kv_tokens});
              finish(self, "decode: " + self->system().render(err));
            });
      },
      fail_with(self, "decode routing"));
}

void prefill(request_ptr self, std::uint64_t cached_tokens) {
  auto& st = self->state;
  auto uncached = st.spec.input_tokens - std::min(cached_tokens, st.spec.input_tokens);
  self->request(st.services.prefill, caf::infinite, prefill_route{st.spec.id, uncached})
    .then(
      [self, cached_tokens, uncached](const prefill_assignment& a) {
        auto& st = self->state;
        st.outcome.prefill_instance = a.instance;
        prefill_job job{st.spec.id, st.spec.input_tokens, cached_tokens,
                        cached_tokens * st.services.kv_bytes_per_token};
        self->request(a.engine, caf::infinite, job)
          .then(
            [self, a, uncached](const prefill_done& done) {
              auto& st = self->state;
              self->send(st.services.prefill, prefill_release{a.instance, uncached});
              st.outcome.prefill_started = done.started;
              st.outcome.first_token = done.finished;
              // The first token leaves with the end of prefill.
              if (st.spec.output_tokens > 0)
                st.outcome.delivered_tokens = 1;
              // The prompt's full blocks are persisted as the KV moves on to decode.
              // (Anonymous: the store's reply must not come back to this actor.)
              if (!st.spec.chain.empty())
                caf::anon_send(st.services.kv, kv_insert{st.spec.chain, st.spec.traffic});
              decode(self);
            },
            [self, a, uncached](const caf::error& err) {
              self->send(self->state.services.prefill, prefill_release{a.instance, uncached});
              finish(self, "prefill: " + self->system().render(err));
            });
      },
      fail_with(self, "prefill routing"));
}

void match(request_ptr self) {
  auto& st = self->state;
  self->request(st.services.kv, caf::infinite,
                kv_match{st.spec.chain, st.spec.traffic, st.spec.input_tokens})
    .then(
      [self](const kv_match_result& m) {
        auto& st = self->state;
        st.outcome.hit_blocks = m.hit_blocks;
        st.outcome.hit_tokens = m.hit_tokens;
        prefill(self, m.hit_tokens);
      },
      // The cache is an optimisation: without an answer, prefill everything.
      [self](const caf::error&) { prefill(self, 0); });
}

/// Encodes the request's images on a vision instance, then goes on to match.
void encode(request_ptr self) {
  auto& st = self->state;
  if (!st.services.vision) {
    finish(self, "vision routing: no vision tier");
    return;
  }
  auto tokens = st.spec.image_tokens;
  self->request(st.services.vision, caf::infinite, vision_route{st.spec.id, tokens})
    .then(
      [self, tokens](const vision_assignment& a) {
        auto& st = self->state;
        st.outcome.vision_instance = a.instance;
        self->request(a.engine, caf::infinite, vision_job{st.spec.id, st.spec.images, tokens})
          .then(
            [self, a, tokens](const vision_done& done) {
              auto& st = self->state;
              self->send(st.services.vision, vision_release{a.instance, tokens});
              st.outcome.vision_started = done.started;
              st.outcome.encoded = done.finished;
              match(self);
            },
            [self, a, tokens](const caf::error& err) {
              self->send(self->state.services.vision, vision_release{a.instance, tokens});
              finish(self, "vision: " + self->system().render(err));
            });
      },
      fail_with(self, "vision routing"));
}

caf::behavior request_fn(request_ptr self, request_spec spec, request_services services) {
  auto& st = self->state;
  st.outcome.id = spec.id;
  st.outcome.admitted = self->clock().now();
  st.outcome.vision_started = st.outcome.admitted;
  st.outcome.encoded = st.outcome.admitted;
  st.outcome.input_tokens = spec.input_tokens;
  st.outcome.output_tokens = spec.output_tokens;
  st.spec = std::move(spec);
  st.services = std::move(services);
  if (st.spec.images > 0)
    encode(self);
  else
    match(self);
  return {[](caf::unit_t) {}};
}

} // namespace

caf::actor spawn_request(caf::local_actor* parent, request_spec spec,
                         const request_services& services) {
  return parent->spawn(request_fn, std::move(spec), services);
}

} // namespace troupe::actors
