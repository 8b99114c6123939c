#include "actors/request/request.hpp"

#include "runtime/errors.hpp"

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <functional>

namespace troupe::actors {

namespace {

using retry_atom = caf::atom_constant<caf::atom("rqretry")>;

struct request_state {
  request_spec spec;
  request_services services;
  request_outcome outcome;
  /// Bumped whenever a job is given up: handlers of an older job ignore what they get.
  std::uint64_t attempt = 0;
  /// The engine of the current job (monitored) and what to do if it goes down.
  caf::actor_addr watched;
  std::function<void(const caf::error&)> on_lost;
  /// What to do when the retry timer fires.
  std::function<void()> retry;
  /// The first token has been delivered (with the end of the first prefill).
  bool first_delivered = false;
  /// Decode tokens delivered by earlier decode jobs, and by the current one so far.
  std::uint64_t decoded = 0;
  std::uint64_t progress = 0;
  /// The last decode job was forwarded by a draining instance: the next one carries the
  /// sliding-window rings with the KV.
  bool forwarded_kv = false;
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

std::string seconds_text(runtime::duration d) {
  return std::to_string(static_cast<long long>(runtime::to_seconds(d))) + " s";
}

bool past_deadline(request_ptr self, runtime::duration ahead = runtime::duration{0}) {
  auto& st = self->state;
  return self->clock().now() + ahead - st.outcome.admitted > st.services.deadline;
}

/// A balancer had no instance for it: try `again` after the retry interval unless that is
/// past the deadline; any other routing error ends the request.
auto retry_or_fail(request_ptr self, std::string phase, std::function<void()> again) {
  return [self, phase, again](const caf::error& err) {
    auto& st = self->state;
    auto why = phase + ": " + self->system().render(err);
    if (!runtime::is(err, runtime::errc::unavailable)) {
      finish(self, why);
      return;
    }
    if (past_deadline(self, st.services.retry_interval)) {
      finish(self, why + "; not served within the deadline ("
                     + seconds_text(st.services.deadline) + ")");
      return;
    }
    st.retry = again;
    self->delayed_send(self, st.services.retry_interval, retry_atom::value);
  };
}

/// Monitors the engine of a new job; returns the job's attempt number.
template <class Handle>
std::uint64_t watch(request_ptr self, const Handle& engine,
                    std::function<void(const caf::error&)> on_lost) {
  auto& st = self->state;
  st.watched = engine.address();
  st.on_lost = std::move(on_lost);
  self->monitor(engine);
  return ++st.attempt;
}

/// The current job ended (answered or failed): stop watching its engine.
void unwatch(request_ptr self) {
  auto& st = self->state;
  if (st.watched)
    self->demonitor(st.watched);
  st.watched = caf::actor_addr{};
  st.on_lost = nullptr;
  ++st.attempt;
}

void match(request_ptr self);

/// The instance of the current job is gone: go through the balancers again.
void reroute(request_ptr self, const std::string& phase, const std::string& why) {
  auto& st = self->state;
  auto& o = st.outcome;
  ++o.reroutes;
  if (st.services.test_drop_on_reroute) {
    finish(self, ""); // the planted bug: claims completion with the stream cut short
    return;
  }
  if (o.reroutes > st.services.max_reroutes) {
    finish(self, phase + ": " + why + "; gave up after "
                   + std::to_string(st.services.max_reroutes) + " reroutes");
    return;
  }
  if (past_deadline(self)) {
    finish(self, phase + ": " + why + "; not served within the deadline ("
                   + seconds_text(st.services.deadline) + ")");
    return;
  }
  match(self);
}

/// The client receives positions [from, to) of the output.
void deliver(request_state& st, std::uint64_t from, std::uint64_t to) {
  if (to <= from)
    return;
  st.outcome.token_digest = stream_digest(st.outcome.token_digest, st.spec.id, from, to);
  st.outcome.delivered_tokens = to;
}

std::uint64_t first_token_count(const request_state& st) {
  return st.first_delivered && st.spec.output_tokens > 0 ? 1 : 0;
}

void decode(request_ptr self) {
  auto& st = self->state;
  // The context: the prompt plus every token delivered by earlier decode jobs.
  auto kv_tokens = st.spec.input_tokens + st.decoded;
  self->request(st.services.decode, caf::infinite, decode_route{st.spec.id, kv_tokens})
    .then(
      [self, kv_tokens](const decode_assignment& a) {
        auto& st = self->state;
        st.outcome.decode_instance = a.instance;
        // The first token came with prefill; decode generates the rest.
        auto rest = st.spec.output_tokens > 0 ? st.spec.output_tokens - 1 - st.decoded : 0;
        decode_job job;
        job.request = st.spec.id;
        job.context_tokens = kv_tokens;
        job.output_tokens = rest;
        job.kv_bytes = kv_tokens * st.services.kv_bytes_per_token;
        // A forwarded request brings its sliding-window rings too.
        if (st.forwarded_kv)
          job.kv_bytes += st.services.swa_ring_bytes;
        st.forwarded_kv = false;
        // The blocks decode fills continue the prompt's chain.
        if (!st.spec.chain.empty()) {
          job.parent = st.spec.chain.back();
          job.parent_blocks = st.spec.chain.size();
        }
        job.traffic = st.spec.traffic;
        job.progress_every = st.services.progress_every;
        st.progress = 0;
        auto lost = [self, a, kv_tokens](const std::string& why) {
          auto& st = self->state;
          self->send(st.services.decode, decode_release{a.instance, kv_tokens});
          // What the client has, it keeps: the next job starts after it.
          if (!st.services.test_replay_on_reroute)
            st.decoded += st.progress;
          st.progress = 0;
          reroute(self, "decode", why);
        };
        auto attempt = watch(self, a.engine, [self, lost, a](const caf::error& reason) {
          lost("decode instance " + std::to_string(a.instance)
               + " down: " + self->system().render(reason));
        });
        self->request(a.engine, caf::infinite, job)
          .then(
            [self, a, kv_tokens, attempt](const decode_done& done) {
              auto& st = self->state;
              if (attempt != st.attempt)
                return;
              unwatch(self);
              auto base = first_token_count(st) + st.decoded;
              deliver(st, base + st.progress, base + done.tokens);
              self->send(st.services.decode, decode_release{a.instance, kv_tokens});
              if (done.forwarded) {
                // Its instance drained: the tokens generated there have reached the client
                // (an exact count), and the KV goes with the request to another instance.
                st.decoded += done.tokens;
                st.progress = 0;
                ++st.outcome.forwards;
                st.forwarded_kv = true;
                decode(self);
                return;
              }
              finish(self, "");
            },
            [self, lost, attempt](const caf::error& err) {
              if (attempt != self->state.attempt)
                return;
              unwatch(self);
              lost(self->system().render(err));
            });
      },
      retry_or_fail(self, "decode routing", [self] { decode(self); }));
}

void prefill(request_ptr self, std::uint64_t cached_tokens) {
  auto& st = self->state;
  // After a decode failure the context also holds the tokens delivered so far.
  auto context = st.spec.input_tokens + st.decoded;
  cached_tokens = std::min(cached_tokens, context);
  auto uncached = context - cached_tokens;
  self->request(st.services.prefill, caf::infinite, prefill_route{st.spec.id, uncached})
    .then(
      [self, cached_tokens, uncached, context](const prefill_assignment& a) {
        auto& st = self->state;
        st.outcome.prefill_instance = a.instance;
        prefill_job job{st.spec.id, context, cached_tokens,
                        cached_tokens * st.services.kv_bytes_per_token};
        auto lost = [self, a, uncached](const std::string& why) {
          self->send(self->state.services.prefill, prefill_release{a.instance, uncached});
          reroute(self, "prefill", why);
        };
        auto attempt = watch(self, a.engine, [self, lost, a](const caf::error& reason) {
          lost("prefill instance " + std::to_string(a.instance)
               + " down: " + self->system().render(reason));
        });
        self->request(a.engine, caf::infinite, job)
          .then(
            [self, a, uncached, attempt](const prefill_done& done) {
              auto& st = self->state;
              if (attempt != st.attempt)
                return;
              unwatch(self);
              self->send(st.services.prefill, prefill_release{a.instance, uncached});
              if (!st.first_delivered) {
                st.first_delivered = true;
                st.outcome.prefill_started = done.started;
                st.outcome.first_token = done.finished;
                // The first token leaves with the end of prefill.
                if (st.spec.output_tokens > 0)
                  deliver(st, 0, 1);
                // The prompt's full blocks are persisted as the KV moves on to decode.
                // (Anonymous: the store's reply must not come back to this actor.)
                if (!st.spec.chain.empty())
                  caf::anon_send(st.services.kv, kv_insert{st.spec.chain, st.spec.traffic});
              }
              decode(self);
            },
            [self, lost, attempt](const caf::error& err) {
              if (attempt != self->state.attempt)
                return;
              unwatch(self);
              lost(self->system().render(err));
            });
      },
      retry_or_fail(self, "prefill routing", [self, cached_tokens] {
        prefill(self, cached_tokens);
      }));
}

void match(request_ptr self) {
  auto& st = self->state;
  self->request(st.services.kv, caf::infinite,
                kv_match{st.spec.chain, st.spec.traffic, st.spec.input_tokens})
    .then(
      [self](const kv_match_result& m) {
        auto& st = self->state;
        // The hit figures are those of its first match (a reroute's match re-hits blocks
        // the request itself persisted).
        if (st.outcome.reroutes == 0) {
          st.outcome.hit_blocks = m.hit_blocks;
          st.outcome.hit_tokens = m.hit_tokens;
        }
        prefill(self, m.hit_tokens);
      },
      // The cache is an optimisation: without an answer, prefill everything.
      [self](const caf::error&) { prefill(self, 0); });
}

auto fail_with(request_ptr self, std::string phase) {
  return [self, phase](const caf::error& err) {
    finish(self, phase + ": " + self->system().render(err));
  };
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
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    if (!st.watched || msg.source != st.watched)
      return;
    auto lost = std::move(st.on_lost);
    st.watched = caf::actor_addr{};
    st.on_lost = nullptr;
    ++st.attempt;
    if (lost)
      lost(msg.reason);
  });
  return {
    [self](const decode_progress& p) {
      auto& st = self->state;
      if (p.tokens > st.progress) {
        auto base = first_token_count(st) + st.decoded;
        deliver(st, base + st.progress, base + p.tokens);
        st.progress = p.tokens;
      }
    },
    [self](retry_atom) {
      auto again = std::move(self->state.retry);
      self->state.retry = nullptr;
      if (again)
        again();
    },
  };
}

} // namespace

caf::actor spawn_request(caf::local_actor* parent, request_spec spec,
                         const request_services& services) {
  return parent->spawn(request_fn, std::move(spec), services);
}

std::uint64_t token_at(std::uint64_t request, std::uint64_t position) noexcept {
  // splitmix64 of the pair: a fixed, well-mixed function of (request, position).
  auto x = request * 0x9e3779b97f4a7c15ull + position + 0x632be59bd9b4e019ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t stream_digest(std::uint64_t digest, std::uint64_t request, std::uint64_t from,
                            std::uint64_t to) noexcept {
  for (auto p = from; p < to; ++p) {
    // Order-sensitive: each step mixes the running digest with the next (position, token).
    auto x = (digest ^ token_at(request, p)) + p * 0xd6e8feb86659fd93ull;
    x = (x ^ (x >> 32)) * 0xd6e8feb86659fd93ull;
    digest = x ^ (x >> 32);
  }
  return digest;
}

} // namespace troupe::actors
