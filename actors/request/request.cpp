#include "actors/request/request.hpp"

#include "runtime/errors.hpp"

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/local_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>
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
  /// The engine of the current job (watched: services.watch) and what to do if it goes down.
  engine_watch::ticket watched;
  std::function<void(const caf::error&)> on_lost;
  /// What to do when the retry timer fires.
  std::function<void()> retry;
  /// The first prefill has ended (the first token left with it).
  bool first_delivered = false;
  /// Output tokens delivered, and of those, by the current decode job so far.
  std::uint64_t delivered = 0;
  std::uint64_t progress = 0;
  /// The output ids delivered (kept for content requests: a re-prefill computes them), and
  /// the last one (the next decode job feeds it).
  std::vector<std::int32_t> output;
  std::int32_t last = 0;
  /// The KV the last prefill exported, for the next decode job to import (real world): by
  /// handle in one process, by fabric ticket across processes (troupe launch).
  runtime::kv_snapshot_ptr kv;
  runtime::fabric_ticket kv_ticket;
  std::vector<kv_part> kv_parts;
  /// The engine of the current job (cancel reaches it there) and the balancer booking it holds.
  caf::actor engine;
  std::function<void()> release;
  bool cancelled = false;
  /// KV tokens the current decode job appended that decode_lb has been told of (decode_grow).
  std::uint64_t grown = 0;
  /// Prompt tokens the first prefill took from the KV cache (not computed).
  std::uint64_t cached_used = 0;
  /// The last decode job was forwarded by a draining instance: the next one carries the
  /// sliding-window rings with the KV.
  bool forwarded_kv = false;
  /// services.stream_kv: the decode instance booked as the prefill began (its KV bridge pulls
  /// the prompt's blocks as they are computed), and the KV tokens and output it was booked for.
  std::optional<decode_assignment> early;
  std::uint64_t early_kv = 0;
  std::uint64_t early_new = 0;
  /// The blocks of the last prefill that went to the booked decode instance while it computed
  /// (prefill_done::kv_first_block): that instance's hand-off moves only the rest.
  std::uint64_t streamed_blocks = 0;
  static inline const char* name = "request";
};

using request_ptr = caf::stateful_actor<request_state>*;

/// decode_lb hears of a decoding request's KV growth in steps of at least this many tokens (a
/// message per 4 progress notices of 16, not per notice: the balancer's figure lags the truth
/// by less than this per request, and the release settles it exactly).
constexpr std::uint64_t kv_grow_every = 64;

/// Gives back the decode booking made as the prefill began (it is not used).
void release_early(request_ptr self) {
  auto& st = self->state;
  if (!st.early)
    return;
  self->send(st.services.decode, decode_release{st.early->instance, st.early_kv, st.early_new, 0});
  st.early.reset();
}

void finish(request_ptr self, std::string failure) {
  auto& st = self->state;
  release_early(self);
  auto& o = st.outcome;
  o.completed = failure.empty();
  o.failure = std::move(failure);
  o.finished = self->clock().now();
  if (auto& h = st.services.history)
    h->add(request_fact{o.finished, o.id,
                        o.completed ? request_fact::completed : request_fact::failed,
                        o.input_tokens, o.output_tokens, o.stopped});
  if (st.spec.stream) {
    generation_end end{st.spec.id, finish_reason::length, {}, 0, 0, 0};
    end.reason = st.cancelled     ? finish_reason::cancelled
                 : !o.completed   ? finish_reason::error
                 : o.stopped      ? finish_reason::stop
                                  : finish_reason::length;
    if (!o.completed && !st.cancelled)
      end.error = o.failure;
    end.prompt_tokens = static_cast<std::uint32_t>(o.input_tokens);
    end.completion_tokens = static_cast<std::uint32_t>(o.delivered_tokens);
    end.cached_tokens = static_cast<std::uint32_t>(st.cached_used);
    self->send(st.spec.stream, std::move(end));
  }
  if (st.services.sink)
    self->send(st.services.sink, o);
  self->quit();
}

/// The booking of the job that starts now; released when the job ends, fails or is cancelled.
void book(request_ptr self, caf::actor engine, std::function<void()> release) {
  self->state.engine = std::move(engine);
  self->state.release = std::move(release);
}

void release_booking(request_ptr self) {
  auto& st = self->state;
  st.engine = caf::actor{};
  if (auto r = std::move(st.release)) {
    st.release = nullptr;
    r();
  }
}

std::string seconds_text(runtime::duration d) {
  return std::to_string(static_cast<long long>(runtime::to_seconds(d))) + " s";
}

bool past_deadline(request_ptr self, runtime::duration ahead = runtime::duration{0}) {
  auto& st = self->state;
  return self->clock().now() + ahead - st.outcome.admitted > st.services.deadline;
}

/// Runs the retry a refusal left, if any.
void retry_now(request_ptr self) {
  auto again = std::move(self->state.retry);
  self->state.retry = nullptr;
  if (again)
    again();
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

/// Watches the engine of a new job; returns the job's attempt number.
template <class Handle>
std::uint64_t watch(request_ptr self, const Handle& engine,
                    std::function<void(const caf::error&)> on_lost) {
  auto& st = self->state;
  st.watched = st.services.watch->watch(engine.address(), self->address());
  st.on_lost = std::move(on_lost);
  return ++st.attempt;
}

/// The current job ended (answered or failed): stop watching its engine.
void unwatch(request_ptr self) {
  auto& st = self->state;
  st.watched.reset();
  st.on_lost = nullptr;
  ++st.attempt;
}

void match(request_ptr self);

/// The instance of the current job is gone: go through the balancers again.
void reroute(request_ptr self, const std::string& phase, const std::string& why) {
  auto& st = self->state;
  auto& o = st.outcome;
  ++o.reroutes;
  release_early(self);
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

/// The client receives `ids` (the next output positions): into the digest, the output, the
/// stream. Stops at a stop id (the request then ends, `stopped`).
void deliver(request_ptr self, std::vector<std::int32_t> ids,
             std::vector<runtime::sampled_token> logprobs) {
  auto& st = self->state;
  if (ids.empty() || st.outcome.stopped)
    return;
  const bool content = !st.spec.prompt.empty();
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto t = ids[k];
    if (auto& h = st.services.history)
      h->add(token_fact{self->clock().now(), st.spec.id, st.delivered, t});
    st.outcome.token_digest = digest_token(st.outcome.token_digest, st.delivered, t);
    ++st.delivered;
    st.last = t;
    if (content)
      st.output.push_back(t);
    if (std::find(st.spec.stop_ids.begin(), st.spec.stop_ids.end(), t) != st.spec.stop_ids.end()) {
      st.outcome.stopped = true;
      ids.resize(k + 1);
      if (logprobs.size() > k + 1)
        logprobs.resize(k + 1);
      break;
    }
  }
  st.outcome.delivered_tokens = st.delivered;
  if (st.spec.stream)
    self->send(st.spec.stream, generation_tokens{st.spec.id, std::move(ids), std::move(logprobs)});
}

void decode(request_ptr self);

/// Runs the decode job on the instance `a` booked for it (`early`: as the prefill began, so
/// that it holds the blocks the prefill streamed to it).
void start_decode(request_ptr self, const decode_assignment& a, std::uint64_t kv_tokens,
                  std::uint64_t max_new, bool early) {
  auto& st = self->state;
  st.outcome.decode_instance = a.instance;
  decode_job job;
  job.request = st.spec.id;
  job.context_tokens = kv_tokens;
  job.output_tokens = max_new;
  job.kv_bytes = kv_tokens * st.services.kv_bytes_per_token;
  // A forwarded request brings its sliding-window rings too.
  if (st.forwarded_kv)
    job.kv_bytes += st.services.swa_ring_bytes;
  st.forwarded_kv = false;
  if (early)
    job.kv_bytes -= std::min(job.kv_bytes, std::exchange(st.streamed_blocks, 0) * block_tokens
                                             * st.services.kv_bytes_per_token);
  // The blocks decode fills continue the prompt's chain (in the real world, from the
  // chain's root when the prompt holds no full block).
  if (!st.spec.chain.empty()) {
    job.parent = st.spec.chain.back();
    job.parent_blocks = st.spec.chain.size();
  } else if (!st.spec.prompt.empty()) {
    job.parent = st.services.chain_root;
  }
  job.traffic = st.spec.traffic;
  job.progress_every = st.services.progress_every;
  job.next = st.last;
  job.sampling = st.spec.sampling;
  job.stop_ids = st.spec.stop_ids;
  job.constraint = st.spec.constraint;
  if (!st.spec.prompt.empty()) {
    job.context = st.spec.prompt;
    job.context.insert(job.context.end(), st.output.begin(),
                       st.output.end() - (st.output.empty() ? 0 : 1));
  }
  // The KV of the prefill that just ended, or the one a draining decode instance
  // forwarded (a decode job after a failure recomputes or re-prefills instead).
  job.kv = std::move(st.kv);
  st.kv = nullptr;
  job.kv_ticket = std::exchange(st.kv_ticket, {});
  job.kv_parts = std::exchange(st.kv_parts, {});
  st.progress = 0;
  // The KV it appended there: one token per token delivered by this job, reported to
  // the balancer as progress notices arrive (decode_progress below).
  st.grown = 0;
  book(self, caf::actor_cast<caf::actor>(a.engine), [self, a, kv_tokens, max_new] {
    self->send(self->state.services.decode,
               decode_release{a.instance, kv_tokens, max_new, self->state.grown});
  });
  auto lost = [self](const std::string& why) {
    auto& st = self->state;
    release_booking(self);
    // What the client has, it keeps: the next job starts after it. (The planted bug
    // forgets it, so those positions are streamed again.)
    if (st.services.test_replay_on_reroute) {
      st.delivered -= st.progress;
      if (!st.output.empty())
        st.output.resize(st.output.size() - st.progress);
    }
    st.progress = 0;
    reroute(self, "decode", why);
  };
  auto attempt = watch(self, a.engine, [self, lost, a](const caf::error& reason) {
    lost("decode instance " + std::to_string(a.instance)
         + " down: " + self->system().render(reason));
  });
  self->request(a.engine, caf::infinite, std::move(job))
    .then(
      [self, attempt](decode_done& done) {
        auto& st = self->state;
        if (attempt != st.attempt)
          return;
        unwatch(self);
        deliver(self, std::move(done.ids), std::move(done.logprobs));
        release_booking(self);
        if (done.forwarded && !st.outcome.stopped) {
          // Its instance drained: the tokens generated there have reached the client
          // (an exact count), and the KV goes with the request to another instance.
          st.progress = 0;
          ++st.outcome.forwards;
          st.forwarded_kv = true;
          st.kv = std::move(done.kv);
          st.kv_ticket = std::move(done.kv_ticket);
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
}

void decode(request_ptr self) {
  auto& st = self->state;
  // The context: the prompt plus every token delivered but the last, which the job feeds.
  auto kv_tokens = st.spec.input_tokens + (st.delivered > 0 ? st.delivered - 1 : 0);
  // The balancer reserves room for the KV of every token still to come.
  auto max_new = st.spec.output_tokens > st.delivered ? st.spec.output_tokens - st.delivered : 0;
  // The instance booked as the prefill began, whose bridge has pulled the prompt's blocks.
  if (st.early && st.early_kv == kv_tokens && st.early_new == max_new) {
    auto a = *st.early;
    st.early.reset();
    start_decode(self, a, kv_tokens, max_new, true);
    return;
  }
  release_early(self);
  self->request(st.services.decode, caf::infinite, decode_route{st.spec.id, kv_tokens, max_new})
    .then(
      [self, kv_tokens, max_new](const decode_assignment& a) {
        start_decode(self, a, kv_tokens, max_new, false);
      },
      retry_or_fail(self, "decode routing", [self] { decode(self); }));
}

void run_prefill(request_ptr self, const prefill_assignment& a, prefill_job job);

void prefill(request_ptr self, std::uint64_t cached_tokens) {
  auto& st = self->state;
  // After a decode failure the context also holds the tokens delivered so far.
  auto context = st.spec.input_tokens + st.delivered;
  cached_tokens = std::min(cached_tokens, context);
  auto uncached = context - cached_tokens;
  // Real world: the last cached block the prefill restores (never the one holding the
  // context's last token, as the engine reads them), whose window state an instance may keep.
  prefill_route route{st.spec.id, uncached, {}};
  if (!st.spec.prompt.empty() && context > 0) {
    const auto usable = std::min<std::uint64_t>(
      {cached_tokens / block_tokens, st.spec.chain.size(), (context - 1) / block_tokens});
    if (usable > 0)
      route.kept = st.spec.chain[usable - 1];
  }
  self->request(st.services.prefill, caf::infinite, route)
    .then(
      [self, cached_tokens, uncached, context](const prefill_assignment& a) {
        auto& st = self->state;
        st.outcome.prefill_instance = a.instance;
        prefill_job job{st.spec.id, context, cached_tokens,
                        cached_tokens * st.services.kv_bytes_per_token, {}, st.spec.sampling};
        job.constraint = st.spec.constraint;  // the simulated world costs its compile
        job.stream_kv = st.services.stream_kv;
        job.kv_bytes_per_token = st.services.kv_bytes_per_token;
        if (!st.spec.prompt.empty()) {
          job.tokens = st.spec.prompt;
          job.tokens.insert(job.tokens.end(), st.output.begin(), st.output.end());
          job.chain = st.spec.chain;
          job.traffic = st.spec.traffic;
          job.keeper = caf::actor_cast<caf::strong_actor_ptr>(a.keeper);
        }
        book(self, caf::actor_cast<caf::actor>(a.engine), [self, a, uncached] {
          self->send(self->state.services.prefill, prefill_release{a.instance, uncached});
        });
        // With stream_kv the decode instance is booked now, so that the prompt's blocks cross
        // to it while the rest of the prompt computes. (Without one free now, the request
        // routes decode when the prefill ends.)
        const auto max_new = st.spec.output_tokens > st.delivered + 1
                               ? st.spec.output_tokens - st.delivered - 1 : 0;
        if (st.services.stream_kv && max_new > 0) {
          self->request(st.services.decode, caf::infinite,
                        decode_route{st.spec.id, context, max_new, false})
            .then(
              [self, a, job, context, max_new](const decode_assignment& d) mutable {
                auto& st = self->state;
                st.early = d;
                st.early_kv = context;
                st.early_new = max_new;
                job.kv_to = caf::actor_cast<caf::strong_actor_ptr>(d.engine);
                run_prefill(self, a, std::move(job));
              },
              [self, a, job](const caf::error&) mutable { run_prefill(self, a, std::move(job)); });
          return;
        }
        run_prefill(self, a, std::move(job));
      },
      retry_or_fail(self, "prefill routing", [self, cached_tokens] {
        prefill(self, cached_tokens);
      }));
}

/// Runs the prefill job on the instance `a` booked for it.
void run_prefill(request_ptr self, const prefill_assignment& a, prefill_job job) {
  auto lost = [self](const std::string& why) {
    release_booking(self);
    reroute(self, "prefill", why);
  };
  auto attempt = watch(self, a.engine, [self, lost, a](const caf::error& reason) {
    lost("prefill instance " + std::to_string(a.instance)
         + " down: " + self->system().render(reason));
  });
  self->request(a.engine, caf::infinite, std::move(job))
    .then(
      [self, attempt](prefill_done& done) {
        auto& st = self->state;
        if (attempt != st.attempt)
          return;
        unwatch(self);
        release_booking(self);
        st.kv = std::move(done.kv);
        st.kv_ticket = std::move(done.kv_ticket);
        st.kv_parts = std::move(done.kv_parts);
        st.streamed_blocks = done.kv_first_block;
        if (!st.first_delivered) {
          st.first_delivered = true;
          st.cached_used = done.cached_tokens;
          // The engine's clock may be another host's: its times count only as a
          // duration, anchored at the answer's arrival here.
          st.outcome.first_token = self->clock().now();
          st.outcome.prefill_started = st.outcome.first_token - (done.finished - done.started);
          // The prompt's full blocks are persisted as the KV moves on to decode: in the
          // simulated world here (anonymous: the store's reply must not come back to
          // this actor), in the real world by the prefill instance, which has their
          // bytes and makes them hits once they are in the store.
          if (!st.spec.chain.empty() && st.spec.prompt.empty())
            caf::anon_send(st.services.kv, kv_insert{st.spec.chain, st.spec.traffic});
        }
        // The token drawn after the context leaves with the end of prefill.
        if (st.delivered < st.spec.output_tokens) {
          std::vector<runtime::sampled_token> lp;
          auto token = done.next.token;
          if (st.spec.sampling.top_logprobs >= 0)
            lp.push_back(std::move(done.next));
          deliver(self, {token}, std::move(lp));
        }
        if (st.outcome.stopped) {
          finish(self, "");
          return;
        }
        decode(self);
      },
      [self, lost, attempt](const caf::error& err) {
        if (attempt != self->state.attempt)
          return;
        unwatch(self);
        lost(self->system().render(err));
      });
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
              // (As prefill's: the encoder's duration, ending on arrival here.)
              st.outcome.encoded = self->clock().now();
              st.outcome.vision_started = st.outcome.encoded - (done.finished - done.started);
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
  if (auto& h = st.services.history)
    h->add(request_fact{st.outcome.admitted, st.spec.id, request_fact::admitted,
                        st.spec.input_tokens, st.spec.output_tokens, false});
  if (st.spec.images > 0)
    encode(self);
  else
    match(self);
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    if (!st.watched || msg.source != st.watched.engine())
      return;
    auto lost = std::move(st.on_lost);
    st.watched.reset();
    st.on_lost = nullptr;
    ++st.attempt;
    if (lost)
      lost(msg.reason);
  });
  return {
    [self](decode_progress& p) {
      auto& st = self->state;
      // Only the current job's notices count (an old job's may still be on the way).
      if (!st.engine || p.tokens <= st.progress || p.instance != st.outcome.decode_instance)
        return;
      // The KV the job appended now counts on its instance (kv_grow_every at a time).
      if (p.tokens - st.grown >= kv_grow_every) {
        self->send(st.services.decode, decode_grow{p.instance, p.tokens - st.grown});
        st.grown = p.tokens;
      }
      st.progress = p.tokens;
      deliver(self, std::move(p.ids), std::move(p.logprobs));
      if (st.outcome.stopped) {
        // A stop id the engine does not know of (it checks the same list): end here.
        if (st.engine)
          self->send(st.engine, cancel_atom::value, st.spec.id);
        unwatch(self);
        release_booking(self);
        finish(self, "");
      }
    },
    [self](cancel_atom) {
      auto& st = self->state;
      st.cancelled = true;
      if (st.engine)
        self->send(st.engine, cancel_atom::value, st.spec.id);
      unwatch(self);
      release_booking(self);
      finish(self, "cancelled");
    },
    [self](retry_atom) { retry_now(self); },
    // decode_lb refused it for want of room, and room may have come: ask now, not at the timer
    // (which, when it fires, finds nothing to retry, or the next refusal's retry a little early).
    [self](decode_room_atom) { retry_now(self); },
  };
}

} // namespace

caf::actor spawn_request(caf::local_actor* parent, request_spec spec,
                         const request_services& services) {
  return parent->spawn(request_fn, std::move(spec), services);
}

std::uint64_t digest_token(std::uint64_t digest, std::uint64_t position,
                           std::int32_t token) noexcept {
  // Order-sensitive: each step mixes the running digest with the next (position, token).
  auto x = (digest ^ static_cast<std::uint32_t>(token)) + position * 0xd6e8feb86659fd93ull;
  x = (x ^ (x >> 32)) * 0xd6e8feb86659fd93ull;
  return x ^ (x >> 32);
}

std::uint64_t modelled_digest(std::uint64_t digest, std::uint64_t request,
                              std::uint64_t input_tokens, std::uint64_t from,
                              std::uint64_t to) noexcept {
  for (auto p = from; p < to; ++p)
    digest = digest_token(digest, p, runtime::modelled_token(request, input_tokens + p));
  return digest;
}

} // namespace troupe::actors
