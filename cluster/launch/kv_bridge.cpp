#include "cluster/launch/kv_bridge.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <openssl/rand.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <variant>
#include <vector>

namespace troupe::cluster {

namespace {

constexpr std::uint32_t snapshot_magic = 0x53564b54;  // "TKVS"
constexpr std::uint32_t snapshot_version = 2;  // 2: the draft context

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, std::string_view b) {
  put<std::uint64_t>(out, b.size());
  out.append(b);
}

/// Reads from a byte string, failing (ok = false) instead of reading past its end.
struct reader {
  std::string_view in;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (in.size() < sizeof(T)) {
      ok = false;
      return v;
    }
    std::memcpy(&v, in.data(), sizeof(T));
    in.remove_prefix(sizeof(T));
    return v;
  }
  std::string bytes() {
    auto n = get<std::uint64_t>();
    if (!ok || in.size() < n) {
      ok = false;
      return {};
    }
    std::string s(in.substr(0, n));
    in.remove_prefix(n);
    return s;
  }
};

void forget_constraint(const kv_bridge_params& params, std::uint64_t request) {
  if (params.constraints)
    params.constraints->remove(request);
}

using refused_atom = caf::atom_constant<caf::atom("refused")>;

caf::error structured_output_error(std::uint64_t request, const std::string& why) {
  return caf::make_error(caf::sec::runtime_error,
                         "request " + std::to_string(request) + ": structured output: " + why);
}

/// The bridge's constrained jobs that run while their constraints compile, and those of them
/// whose constraint turned out not to rebuild: their engine's answer becomes that error.
struct restoring {
  std::set<std::uint64_t> running;
  std::map<std::uint64_t, std::string> refused;
};

/// Counts the job as running, rebuilds its constraint in this process's table and runs `next()`
/// at once, the compile overlapping the job when the format is new here
/// (constraint_table::restore); `failed(error)` instead when the constraint cannot be rebuilt
/// now. `context` is the ids the constraint has seen (empty for an unconstrained job). A refusal that comes from the compile thread reaches the bridge as a `refused` message: the
/// bridge cancels the job at its engine and answers its requester with the error.
template <class Self, class Next, class Failed>
void restore_then(Self* self, const kv_bridge_params& params, restoring& jobs,
                  std::uint64_t request, const runtime::constraint_spec& spec,
                  std::vector<std::int32_t> context, Next next, Failed failed) {
  jobs.running.insert(request);
  if (spec.format.empty()) {
    next();
    return;
  }
  if (!params.constraints) {
    jobs.running.erase(request);
    failed(structured_output_error(request, "this process has no constraint table"));
    return;
  }
  auto bridge = caf::actor_cast<caf::actor>(self);
  auto r = params.constraints->restore(request, spec, std::move(context),
                                       [bridge, request](std::optional<std::string> why) {
                                         if (why)
                                           caf::anon_send(bridge, refused_atom::value, request, *why);
                                       });
  if (r.state == actors::constraint_table::restore_result::refused) {
    jobs.running.erase(request);
    failed(structured_output_error(request, r.why));
  } else {
    next();
  }
}

/// The engine answered a job: its constraint is forgotten, and a refused one's answer is the
/// refusal. Returns that error, or none.
caf::error job_answered(restoring& r, const kv_bridge_params& params, std::uint64_t request) {
  forget_constraint(params, request);
  r.running.erase(request);
  auto it = r.refused.find(request);
  if (it == r.refused.end())
    return {};
  auto err = structured_output_error(request, it->second);
  r.refused.erase(it);
  return err;
}

/// A refusal from the compile thread: the job ends at its engine (the device may only end the
/// output meanwhile) and answers with the refusal.
template <class Self>
void job_refused(Self* self, restoring& r, const caf::actor& engine, std::uint64_t request,
                 std::string why) {
  if (r.running.count(request) == 0)
    return;  // answered already
  r.refused.emplace(request, std::move(why));
  self->send(engine, actors::cancel_atom::value, request);
}

/// A job's KV could not be pulled: counted, and said (its engine recomputes the context).
void pull_failed(const kv_bridge_params& params, std::uint64_t request, const std::string& why) {
  if (params.counters)
    ++params.counters->pull_failures;
  if (params.warn)
    params.warn("the KV of request " + std::to_string(request) + " could not be pulled ("
                + why + "); its context is recomputed");
}

/// A kept window state could not be pulled: counted, and said (its job replays the window).
void kept_pull_failed(const kv_bridge_params& params, std::uint64_t request,
                      const std::string& why) {
  if (params.counters)
    ++params.counters->pull_failures;
  if (params.warn)
    params.warn("the kept window state for request " + std::to_string(request)
                + " could not be pulled (" + why + "); its prefix is replayed");
}

void job_ended(const kv_bridge_params& params) {
  if (params.counters)
    --params.counters->jobs;
}

/// An offer nobody pulled is withdrawn `offer_ttl` from now.
void expire(const kv_bridge_params& p, std::uint64_t id) {
  caf::delayed_anon_send(p.link, p.offer_ttl, runtime::fabric_withdraw{id});
}

/// Offers a snapshot's bytes on the link; `then(ticket)` gets the ticket, or an empty one when
/// the offer failed (the receiver then recomputes). The offer expires (`expire`), unless
/// `expiring` is false: a streaming job's run, whose time counts from the job's end.
template <class Self, class Then>
void offer(Self* self, const kv_bridge_params& p, const runtime::kv_snapshot& kv, Then then,
           bool expiring = true) {
  if (!p.link) {  // no fabric (--fabric none): the receiver recomputes
    then(runtime::fabric_ticket{});
    return;
  }
  auto id = next_offer_id();
  auto bytes = encode_snapshot(kv);
  auto size = bytes.size();
  if (p.counters)
    ++p.counters->offering;
  self->request(p.link, std::chrono::seconds(30),
                runtime::fabric_offer{id, std::move(bytes), true})
    .then(
      [self, p, id, size, then, expiring](runtime::fabric_ticket& t) mutable {
        if (p.counters) {
          ++p.counters->offered;
          p.counters->offered_bytes += size;
          --p.counters->offering;
        }
        if (expiring)
          expire(p, id);
        then(std::move(t));
      },
      [p, then](const caf::error&) mutable {
        if (p.counters)
          --p.counters->offering;
        then(runtime::fabric_ticket{});
      });
}

/// Ends the bridge with its engine, whatever the engine's exit reason.
template <class Self>
void follow(Self* self, const caf::actor& engine) {
  self->monitor(engine);
  self->set_down_handler([self](caf::down_msg& m) { self->quit(m.reason); });
}

/// Another process's job asks the engine `e` behind this bridge for its device's kept window
/// state: the copy goes on the fabric, and `rp` gets its ticket (or the engine's error).
template <class Self>
void offer_kept(Self* self, const caf::actor& e, const kv_bridge_params& params,
                const actors::kept_state_get& g, caf::response_promise rp) {
  self->request(e, caf::infinite, g)
    .then(
      [self, rp, params](actors::kept_state& got) mutable {
        if (!got.kv) {
          rp.deliver(std::move(got));
          return;
        }
        offer(self, params, *got.kv, [rp](runtime::fabric_ticket t) mutable {
          if (t.id == 0)
            rp.deliver(caf::make_error(caf::sec::runtime_error,
                                       "the kept window state could not be offered"));
          else
            rp.deliver(actors::kept_state{nullptr, std::move(t)});
        });
      },
      [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
}

/// A streaming prefill job's runs of blocks (prefill_kv_part) as its bridge offers them: the
/// decode bridge its request booked (told of each run), the runs offered in order, and whether
/// an offer failed.
struct stream {
  caf::actor kv_to;
  std::vector<actors::kv_part> parts;
  bool broken = false;
};

/// The runs offered are blocks 0..`blocks` - 1 in order, none missing.
bool runs_cover(const stream& s, std::uint64_t blocks) {
  std::uint64_t next = 0;
  for (const auto& p : s.parts) {
    if (p.first_block != next)
      return false;
    next += p.blocks;
  }
  return !s.broken && next == blocks;
}

stream take_stream(std::map<std::uint64_t, stream>& streams, std::uint64_t request) {
  stream s;
  if (auto it = streams.find(request); it != streams.end()) {
    s = std::move(it->second);
    streams.erase(it);
  }
  return s;
}

/// Runs nobody will pull (their job failed, or the rest could not follow them) leave the link.
void withdraw_parts(const kv_bridge_params& params, const stream& s) {
  for (const auto& p : s.parts)
    caf::anon_send(params.link, runtime::fabric_withdraw{p.ticket.id});
}

} // namespace

std::uint64_t next_offer_id() {
  // Drawn by OpenSSL's CSPRNG: an id is the capability to pull the offer, and it reaches the
  // puller only in a ticket over the middleman (TLS in a cluster), so no other peer of the
  // fabric can guess one.
  std::uint64_t id = 0;
  while (id == 0)
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id) != 1)
      throw std::runtime_error("troupe: OpenSSL's RAND_bytes failed to draw a fabric offer id");
  return id;
}

std::string encode_snapshot(const runtime::kv_snapshot& s) {
  std::string out;
  std::size_t total =
    s.model.size() + s.state.bytes.size() + s.swa.bytes.size() + s.draft.bytes.size() + 80;
  for (const auto& b : s.blocks)
    total += b.bytes.size() + 16;
  out.reserve(total);
  put(out, snapshot_magic);
  put(out, snapshot_version);
  put_bytes(out, s.model);
  put<std::uint64_t>(out, s.length);
  put<std::uint64_t>(out, s.blocks.size());
  for (const auto* b : {&s.state, &s.swa, &s.draft}) {
    put<std::uint64_t>(out, b->checksum);
    put_bytes(out, b->bytes);
  }
  for (const auto& b : s.blocks) {
    put<std::uint64_t>(out, b.checksum);
    put_bytes(out, b.bytes);
  }
  return out;
}

std::optional<runtime::kv_snapshot> decode_snapshot(std::string_view bytes) {
  reader r{bytes};
  if (r.get<std::uint32_t>() != snapshot_magic || r.get<std::uint32_t>() != snapshot_version)
    return std::nullopt;
  runtime::kv_snapshot s;
  s.model = r.bytes();
  s.length = r.get<std::uint64_t>();
  auto blocks = r.get<std::uint64_t>();
  for (auto* b : {&s.state, &s.swa, &s.draft}) {
    b->checksum = r.get<std::uint64_t>();
    b->bytes = r.bytes();
  }
  // Each block takes at least its two 8-byte headers: a count beyond that is corrupt.
  if (!r.ok || blocks > r.in.size() / 16)
    return std::nullopt;
  s.blocks.resize(blocks);
  for (auto& b : s.blocks) {
    b.checksum = r.get<std::uint64_t>();
    b.bytes = r.bytes();
  }
  if (!r.ok || !r.in.empty())
    return std::nullopt;
  return s;
}

actors::prefill_engine_actor spawn_prefill_bridge(caf::actor_system& sys,
                                                  actors::prefill_engine_actor engine,
                                                  kv_bridge_params params) {
  auto e = caf::actor_cast<caf::actor>(engine);
  auto bridge = sys.spawn([e, params](caf::event_based_actor* self) -> caf::behavior {
    follow(self, e);
    auto jobs = std::make_shared<restoring>();
    // The keeper (in another process) of each job whose engine asks for a kept window state:
    // the engine asks the bridge, which asks the keeper and pulls the ticket it answers.
    auto keepers = std::make_shared<std::map<std::uint64_t, caf::actor>>();
    auto streams = std::make_shared<std::map<std::uint64_t, stream>>();
    // Runs the job on the engine; its answer goes back through the bridge.
    auto run = [self, e, params, jobs, keepers, streams](actors::prefill_job job,
                                                          caf::response_promise rp) {
        auto request = job.request;
        if (job.keeper) {
          (*keepers)[request] = caf::actor_cast<caf::actor>(job.keeper);
          job.keeper = caf::actor_cast<caf::strong_actor_ptr>(self);
        }
        // With a fabric, the job's blocks go out as its chunks complete them (whatever the
        // requester asked: the runs must reach this bridge's link).
        job.stream_kv = params.link && params.stream && !job.tokens.empty();
        if (job.stream_kv)
          (*streams)[request].kv_to = caf::actor_cast<caf::actor>(job.kv_to);
        self->request(e, caf::infinite, std::move(job))
          .then(
            [self, rp, params, request, jobs, keepers, streams](actors::prefill_done& d) mutable {
              keepers->erase(request);
              if (auto refused = job_answered(*jobs, params, request)) {
                withdraw_parts(params, take_stream(*streams, request));
                rp.deliver(std::move(refused));
                return;
              }
              if (!d.kv) {
                withdraw_parts(params, take_stream(*streams, request));
                rp.deliver(std::move(d));
                return;
              }
              auto kv = std::move(d.kv);
              offer(self, params, *kv,
                    [rp, params, streams, request, d = std::move(d)](runtime::fabric_ticket t) mutable {
                      // The link answers offers in order: every run's offer has been answered.
                      auto ran = take_stream(*streams, request);
                      if (d.kv_first_block > 0 && !runs_cover(ran, d.kv_first_block)) {
                        // A run could not be offered: the rest alone is no use (decode
                        // recomputes the context).
                        withdraw_parts(params, ran);
                        if (t.id != 0)
                          caf::anon_send(params.link, runtime::fabric_withdraw{t.id});
                        t = {};
                      } else if (d.kv_first_block > 0) {
                        // The runs' offers expire with the rest's, counted from now.
                        for (const auto& p : ran.parts)
                          expire(params, p.ticket.id);
                        d.kv_parts = std::move(ran.parts);
                      } else {
                        withdraw_parts(params, ran);
                      }
                      d.kv_ticket = std::move(t);
                      rp.deliver(std::move(d));
                    });
            },
            [rp, params, request, jobs, keepers, streams](caf::error& err) mutable {
              keepers->erase(request);
              withdraw_parts(params, take_stream(*streams, request));
              auto refused = job_answered(*jobs, params, request);
              rp.deliver(refused ? std::move(refused) : std::move(err));
            });
    };
    return {
      [self, e, params, keepers](actors::kept_state_get& g) {
        auto rp = self->make_response_promise();
        auto k = keepers->find(g.request);
        if (k == keepers->end()) {
          offer_kept(self, e, params, g, rp);
          return rp;
        }
        // This engine's job asks another process's keeper, and gets the state's bytes here.
        const auto request = g.request;
        self->request(k->second, params.pull_timeout, g)
          .then(
            [self, rp, params, request](actors::kept_state& got) mutable {
              if (got.kv || got.ticket.id == 0 || !params.link) {
                rp.deliver(std::move(got));
                return;
              }
              self->request(params.link, params.pull_timeout + std::chrono::seconds(5),
                            runtime::fabric_pull{got.ticket, params.pull_timeout})
                .then(
                  [rp, params, request](runtime::fabric_pulled& bytes) mutable {
                    auto s = decode_snapshot(bytes.bytes);
                    if (!s) {
                      kept_pull_failed(params, request, "the bytes pulled are not a KV snapshot");
                      rp.deliver(caf::make_error(caf::sec::runtime_error, "not a snapshot"));
                      return;
                    }
                    if (params.counters) {
                      ++params.counters->pulled;
                      params.counters->pulled_bytes += bytes.bytes.size();
                    }
                    rp.deliver(actors::kept_state{
                      std::make_shared<const runtime::kv_snapshot>(std::move(*s))});
                  },
                  [rp, params, request](caf::error& err) mutable {
                    kept_pull_failed(params, request, caf::to_string(err));
                    rp.deliver(std::move(err));
                  });
            },
            [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self, jobs, params, run](actors::prefill_job& job) {
        auto rp = self->make_response_promise();
        auto request = job.request;
        auto spec = job.constraint;
        // (The prompt is copied only for a constraint to see.)
        auto tokens = spec.format.empty() ? std::vector<std::int32_t>{} : job.tokens;
        restore_then(
          self, params, *jobs, request, spec, std::move(tokens),
          [run, rp, job = std::move(job)]() mutable { run(std::move(job), rp); },
          [rp](caf::error err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self, e, jobs](refused_atom, std::uint64_t request, std::string& why) {
        job_refused(self, *jobs, e, request, std::move(why));
      },
      [self, params, streams](actors::prefill_kv_part& p) {
        // A run of a streaming job's blocks: offered now, and the decode side told at once.
        if (streams->count(p.request) == 0 || !p.kv)
          return;
        const auto request = p.request;
        actors::kv_part part{p.first_block, p.kv->blocks.size(), {}};
        offer(self, params, *p.kv, [self, params, streams, request, part](runtime::fabric_ticket t) mutable {
          part.ticket = std::move(t);
          auto s = streams->find(request);
          if (s == streams->end()) {  // the job ended meanwhile (it failed)
            if (part.ticket.id != 0)
              caf::anon_send(params.link, runtime::fabric_withdraw{part.ticket.id});
            return;
          }
          if (part.ticket.id == 0) {
            s->second.broken = true;
            return;
          }
          s->second.parts.push_back(part);
          if (s->second.kv_to)
            self->send(s->second.kv_to, actors::kv_part_offered{request, part});
        }, false);
      },
      [self, e](actors::engine_stats_atom a) { return self->delegate(e, a); },
      [self, e](actors::drain_atom a, runtime::duration grace) {
        return self->delegate(e, a, grace);
      },
      [self, e](actors::cancel_atom a, std::uint64_t request) { self->send(e, a, request); },
    };
  });
  return caf::actor_cast<actors::prefill_engine_actor>(bridge);
}

namespace {

using forget_runs_atom = caf::atom_constant<caf::atom("forgetruns")>;

/// A pulled snapshot, or why there is none.
using pulled_kv = std::optional<runtime::kv_snapshot>;
using pulled_fn = std::function<void(pulled_kv, std::string)>;

/// A run of a request's blocks pulled as its prefill went on (kv_part_offered): the snapshot
/// once here (or why it could not be had), and what waits for it.
struct early_run {
  bool done = false;
  pulled_kv kv;
  std::string why;
  std::vector<pulled_fn> waiters;
};

/// A request's runs pulled early: their offer ids, and how many have come (the runs are
/// forgotten `offer_ttl` after the last one, if its job has not taken them).
struct early_runs {
  std::vector<std::uint64_t> ids;
  std::uint64_t count = 0;
};

struct decode_bridge_state {
  /// Request id → the requester its progress notices go to.
  std::map<std::uint64_t, caf::actor> requesters;
  /// Offer id → a run pulled before its decode job came, and request id → its runs.
  std::map<std::uint64_t, early_run> early;
  std::map<std::uint64_t, early_runs> early_of;
};

/// Pulls a ticket's bytes and decodes them as a snapshot; `then(snapshot, "")` or
/// `then(nullopt, why)`.
template <class Self>
void pull_snapshot(Self* self, const kv_bridge_params& params, const runtime::fabric_ticket& t,
                   pulled_fn then) {
  self->request(params.link, params.pull_timeout + std::chrono::seconds(5),
                runtime::fabric_pull{t, params.pull_timeout})
    .then(
      [params, then](runtime::fabric_pulled& got) {
        auto s = decode_snapshot(got.bytes);
        if (!s) {
          then(std::nullopt, "the bytes pulled are not a KV snapshot");
          return;
        }
        if (params.counters) {
          ++params.counters->pulled;
          params.counters->pulled_bytes += got.bytes.size();
        }
        then(std::move(s), "");
      },
      [then](const caf::error& e) { then(std::nullopt, caf::to_string(e)); });
}

/// The runs a decode job's KV comes in, then the rest (prefill_done::kv_parts and kv_ticket),
/// joined into one snapshot once all are here.
struct kv_assembly {
  std::vector<pulled_kv> runs;
  pulled_kv rest;
  std::size_t left = 0;
  std::string why;
};

/// The joined snapshot: the runs' blocks (blocks 0.. in order, as `parts` say, of the same
/// model) before the rest's; or why they do not join.
std::variant<runtime::kv_snapshot, std::string> join_runs(kv_assembly& a,
                                                          const std::vector<actors::kv_part>& parts) {
  if (!a.why.empty())
    return a.why;
  auto& rest = *a.rest;
  std::vector<runtime::kv_bytes> blocks;
  std::uint64_t next = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    auto& run = *a.runs[k];
    if (parts[k].first_block != next || run.blocks.size() != parts[k].blocks
        || run.model != rest.model)
      return std::string("its runs of blocks do not join up");
    next += parts[k].blocks;
    for (auto& b : run.blocks)
      blocks.push_back(std::move(b));
  }
  for (auto& b : rest.blocks)
    blocks.push_back(std::move(b));
  rest.blocks = std::move(blocks);
  return std::move(rest);
}

} // namespace

actors::decode_engine_actor spawn_decode_bridge(caf::actor_system& sys,
                                                actors::decode_engine_actor engine,
                                                kv_bridge_params params) {
  auto e = caf::actor_cast<caf::actor>(engine);
  auto bridge = sys.spawn(
    [e, params](caf::stateful_actor<decode_bridge_state>* self) -> caf::behavior {
      follow(self, e);
      auto jobs = std::make_shared<restoring>();
      // Runs the job on the engine; its answer goes back through the bridge.
      auto run = [self, e, params, jobs](actors::decode_job job, caf::response_promise rp) {
        auto request = job.request;
        self->request(e, caf::infinite, std::move(job))
          .then(
            [self, rp, params, request, jobs](actors::decode_done& d) mutable {
              self->state.requesters.erase(request);
              if (auto refused = job_answered(*jobs, params, request)) {
                job_ended(params);
                rp.deliver(std::move(refused));
                return;
              }
              if (!d.kv) {
                job_ended(params);
                rp.deliver(std::move(d));
                return;
              }
              auto kv = std::move(d.kv);
              offer(self, params, *kv, [rp, d = std::move(d)](runtime::fabric_ticket t) mutable {
                d.kv_ticket = std::move(t);
                rp.deliver(std::move(d));
              });
              job_ended(params);  // after the offer counts as being made
            },
            [self, rp, params, request, jobs](caf::error& err) mutable {
              self->state.requesters.erase(request);
              auto refused = job_answered(*jobs, params, request);
              job_ended(params);
              rp.deliver(refused ? std::move(refused) : std::move(err));
            });
      };
      // A run of blocks: the one pulled early (taken from the table), or pulled now.
      auto obtain = [self, params](const runtime::fabric_ticket& t, pulled_fn then) {
        auto& early = self->state.early;
        auto it = early.find(t.id);
        if (it == early.end()) {
          pull_snapshot(self, params, t, std::move(then));
        } else if (it->second.done) {
          auto run = std::move(it->second);
          early.erase(it);
          then(std::move(run.kv), std::move(run.why));
        } else {
          it->second.waiters.push_back(std::move(then));
        }
      };
      // Pulls the job's KV over the fabric when it has a ticket and no handle (its runs of
      // blocks too, or takes those pulled while its prefill computed), then runs it.
      auto fetch_and_run = [self, params, run, obtain](actors::decode_job job,
                                                      caf::response_promise rp) {
        if (job.kv || job.kv_ticket.id == 0 || !params.link) {
          run(std::move(job), rp);
          return;
        }
        auto a = std::make_shared<kv_assembly>();
        a->runs.resize(job.kv_parts.size());
        a->left = job.kv_parts.size() + 1;
        auto job_ptr = std::make_shared<actors::decode_job>(std::move(job));
        auto arrived = [self, params, run, rp, a, job_ptr]() mutable {
          if (--a->left > 0)
            return;
          auto& job = *job_ptr;
          auto joined = join_runs(*a, job.kv_parts);
          if (auto* kv = std::get_if<runtime::kv_snapshot>(&joined))
            job.kv = std::make_shared<const runtime::kv_snapshot>(std::move(*kv));
          else  // the KV could not be had: the engine recomputes the context
            pull_failed(params, job.request, std::get<std::string>(joined));
          job.kv_ticket = {};
          job.kv_parts.clear();
          run(std::move(job), rp);
        };
        auto landed = [a, arrived](pulled_kv* slot) {
          return [a, arrived, slot](pulled_kv kv, std::string why) mutable {
            if (!kv && a->why.empty())
              a->why = std::move(why);
            *slot = std::move(kv);
            arrived();
          };
        };
        for (std::size_t k = 0; k < job_ptr->kv_parts.size(); ++k)
          obtain(job_ptr->kv_parts[k].ticket, landed(&a->runs[k]));
        pull_snapshot(self, params, job_ptr->kv_ticket, landed(&a->rest));
      };
      return {
        [self, params, fetch_and_run, jobs](actors::decode_job& job) {
          // (The requester before the promise: making it takes over the sender.)
          self->state.requesters[job.request] = caf::actor_cast<caf::actor>(self->current_sender());
          if (params.counters)
            ++params.counters->jobs;
          auto rp = self->make_response_promise();
          auto request = job.request;
          auto spec = job.constraint;
          // The constraint sees the context and the token the first step feeds.
          std::vector<std::int32_t> drawn;
          if (!spec.format.empty()) {
            drawn = job.context;
            drawn.push_back(job.next);
          }
          // The KV pull (if any) and the compile (if new here) overlap.
          restore_then(
            self, params, *jobs, request, spec, std::move(drawn),
            [fetch_and_run, rp, job = std::move(job)]() mutable { fetch_and_run(std::move(job), rp); },
            [self, params, rp, request](caf::error err) mutable {
              self->state.requesters.erase(request);
              job_ended(params);
              rp.deliver(std::move(err));
            });
          return rp;
        },
        [self, e, jobs](refused_atom, std::uint64_t request, std::string& why) {
          job_refused(self, *jobs, e, request, std::move(why));
        },
        [self](actors::decode_progress& p) {
          auto it = self->state.requesters.find(p.request);
          if (it != self->state.requesters.end() && it->second)
            self->send(it->second, std::move(p));
        },
        [self, e](actors::engine_stats_atom a) { return self->delegate(e, a); },
        [self, e](actors::drain_atom a, runtime::duration grace) {
          return self->delegate(e, a, grace);
        },
        [self, e](actors::cancel_atom a, std::uint64_t request) { self->send(e, a, request); },
        [self, e](actors::drain_end_atom a) { self->send(e, a); },
        [self, e, params](actors::kept_state_get& g) {
          auto rp = self->make_response_promise();
          offer_kept(self, e, params, g, rp);
          return rp;
        },
        [self, params](actors::kv_part_offered& o) {
          // A run of blocks of a request booked here, offered while its prefill goes on:
          // pulled now, held for its decode job (forgotten after the offers' lifetime).
          const auto id = o.part.ticket.id;
          if (!params.link || id == 0 || self->state.early.count(id) > 0)
            return;
          auto& of = self->state.early_of[o.request];
          of.ids.push_back(id);
          self->delayed_send(self, params.offer_ttl, forget_runs_atom::value, o.request,
                             ++of.count);
          self->state.early[id];
          pull_snapshot(self, params, o.part.ticket, [self, params, id](pulled_kv kv, std::string why) {
            auto it = self->state.early.find(id);
            if (it == self->state.early.end())
              return;
            if (it->second.waiters.empty()) {  // pulled before its job came
              if (kv && params.counters)
                ++params.counters->pulled_early;
              if (kv && params.runs_pulled_early)
                params.runs_pulled_early->inc();
              it->second.done = true;
              it->second.kv = std::move(kv);
              it->second.why = std::move(why);
              return;
            }
            auto waiters = std::move(it->second.waiters);
            self->state.early.erase(it);
            // One job takes a run (its ticket is in that job alone).
            waiters.front()(std::move(kv), std::move(why));
          });
        },
        [self](forget_runs_atom, std::uint64_t request, std::uint64_t count) {
          // Runs whose job never came here (the request went elsewhere, or failed), once no
          // run of it came for offer_ttl.
          auto of = self->state.early_of.find(request);
          if (of == self->state.early_of.end() || of->second.count != count)
            return;
          for (auto id : of->second.ids)
            if (auto it = self->state.early.find(id);
                it != self->state.early.end() && it->second.waiters.empty())
              self->state.early.erase(it);
          self->state.early_of.erase(of);
        },
      };
    });
  return caf::actor_cast<actors::decode_engine_actor>(bridge);
}

} // namespace troupe::cluster
