#include "actors/engine/prefill_engine.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>

namespace troupe::actors {

namespace {

struct job_state {
  prefill_job job;
  std::uint64_t remaining = 0;
  /// Tokens the device's cache of this sequence holds (the next chunk's position).
  std::uint64_t computed = 0;
  std::uint64_t position = 0;
  /// The token drawn by the last chunk.
  runtime::sampled_token next;
  bool ready = false;
  bool fetched = false;
  /// Its KV is being exported (the answer waits for it).
  bool exporting = false;
  bool started = false;
  runtime::time_point started_at{};
  caf::typed_response_promise<prefill_done> rp;
};

struct prefill_engine_state {
  prefill_engine_params params;
  runtime::device_port device;
  runtime::link_port link;
  std::map<std::uint64_t, job_state> jobs;
  std::deque<std::uint64_t> order;
  bool stepping = false;
  std::uint64_t next_step = 1;
  engine_stats stats;
  /// Drain: the callback that has the balancer exclude the instance, and the drain request,
  /// answered when the last job is done.
  std::function<void()> leave;
  std::optional<caf::typed_response_promise<std::uint64_t>> drain;
  static inline const char* name = "prefill_engine";
};

using engine_ptr = prefill_engine_actor::stateful_pointer<prefill_engine_state>;

/// Answers a finished job (with its KV, when exported) and forgets it.
void deliver(engine_ptr self, std::uint64_t request, runtime::kv_snapshot_ptr kv) {
  auto& st = self->state;
  auto i = st.jobs.find(request);
  if (i == st.jobs.end())
    return;
  auto& j = i->second;
  j.rp.deliver(prefill_done{request, st.params.instance, j.started_at, self->clock().now(),
                            std::move(j.next), j.job.cached_tokens, std::move(kv)});
  // The KV has been handed on with the answer: the device forgets the sequence.
  self->send(st.device, runtime::device_release{request});
  st.jobs.erase(i);
  std::erase(st.order, request);
  ++st.stats.jobs_done;
  // A draining instance leaves once its work is done.
  if (st.drain && st.jobs.empty()) {
    st.drain->deliver(std::uint64_t{0});
    st.drain.reset();
  }
}

void try_finish(engine_ptr self, std::uint64_t request) {
  auto& st = self->state;
  auto i = st.jobs.find(request);
  if (i == st.jobs.end() || i->second.remaining > 0 || !i->second.fetched || i->second.exporting)
    return;
  if (i->second.job.tokens.empty()) {
    deliver(self, request, nullptr);  // the simulated world: the KV moves by the link model
    return;
  }
  i->second.exporting = true;
  self->request(st.device, caf::infinite, runtime::kv_export{request})
    .then([self, request](runtime::kv_snapshot_ptr kv) { deliver(self, request, std::move(kv)); },
          // Without a snapshot the decode instance recomputes the context.
          [self, request](const caf::error&) { deliver(self, request, nullptr); });
}

void step(engine_ptr self) {
  auto& st = self->state;
  if (st.stepping)
    return;
  // Each ready job first gets an equal share of the budget (at least one block), so a short
  // prompt is not held behind a long one; budget left over goes to jobs in arrival order.
  std::vector<std::uint64_t> ready;
  for (auto id : st.order) {
    auto& j = st.jobs.at(id);
    if (j.ready && j.remaining > 0)
      ready.push_back(id);
  }
  if (ready.empty())
    return;
  std::map<std::uint64_t, std::uint64_t> take;
  auto budget = st.params.step_tokens;
  auto share = std::max<std::uint64_t>(budget / ready.size(), 128);
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (auto id : ready) {
      if (budget == 0)
        break;
      auto& j = st.jobs.at(id);
      auto left = j.remaining - take[id];
      auto n = std::min({budget, left, pass == 0 ? share : left});
      take[id] += n;
      budget -= n;
    }
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> batch; // request, tokens taken
  runtime::device_step ds{st.next_step, runtime::step_phase::prefill, 0, 0, 0, {}};
  for (auto id : ready) {
    auto n = take[id];
    if (n == 0)
      continue;
    auto& j = st.jobs.at(id);
    batch.emplace_back(id, n);
    ds.tokens += n;
    ds.sequences += 1;
    // Attention of this chunk covers everything before it in the prompt.
    ds.context_tokens += j.job.input_tokens - j.remaining + n;
    runtime::step_sequence seq{id, j.position, static_cast<std::uint32_t>(n), {},
                               n == j.remaining, j.job.sampling};
    if (!j.job.tokens.empty()) {
      auto from = j.job.tokens.begin() + static_cast<std::ptrdiff_t>(j.position);
      seq.tokens.assign(from, from + static_cast<std::ptrdiff_t>(n));
    }
    ds.batch.push_back(std::move(seq));
  }
  if (batch.empty())
    return;
  st.stepping = true;
  ++st.next_step;
  auto now = self->clock().now();
  for (auto& [id, take] : batch) {
    auto& j = st.jobs.at(id);
    if (!j.started) {
      j.started = true;
      j.started_at = now;
    }
  }
  self->request(st.device, caf::infinite, ds)
    .then(
      [self, batch](runtime::device_result& r) {
        auto& st = self->state;
        st.stepping = false;
        ++st.stats.steps;
        st.stats.busy += r.finished - r.started;
        for (auto& s : r.sampled)
          if (auto i = st.jobs.find(s.sequence); i != st.jobs.end())
            i->second.next = std::move(s);
        for (auto& [id, take] : batch) {
          auto i = st.jobs.find(id);
          if (i == st.jobs.end())
            continue;
          i->second.remaining -= take;
          i->second.computed += take;
          i->second.position += take;
          st.stats.tokens += take;
          try_finish(self, id);
        }
        step(self);
      },
      [self](const caf::error& err) {
        // The device is gone (its rank failed): so is this instance.
        self->quit(err);
      });
}

prefill_engine_actor::behavior_type prefill_engine_fn(engine_ptr self,
                                                       prefill_engine_params params,
                                                       runtime::device_port device,
                                                       runtime::link_port link,
                                                       std::function<void()> leave) {
  auto& st = self->state;
  st.leave = std::move(leave);
  st.params = params;
  st.device = std::move(device);
  st.link = std::move(link);
  st.stats.instance = params.instance;
  return {
    [self](const prefill_job& job) -> caf::typed_response_promise<prefill_done> {
      auto& st = self->state;
      // A real job computes its whole context (no block fetch path yet: prefill_engine.hpp).
      auto cached = job.tokens.empty() ? std::min(job.cached_tokens, job.input_tokens) : 0;
      auto replay = std::min(job.input_tokens, st.params.replay_tokens);
      job_state j;
      j.job = job;
      if (!job.tokens.empty()) {
        j.job.cached_tokens = 0;
        j.job.fetch_bytes = 0;
      }
      j.remaining = std::max(job.input_tokens - cached, replay);
      j.position = job.input_tokens - j.remaining;
      j.rp = self->make_response_promise<prefill_done>();
      auto rp = j.rp;
      auto id = job.request;
      if (!job.tokens.empty() && job.tokens.size() != job.input_tokens) {
        j.rp.deliver(caf::make_error(caf::sec::invalid_argument,
                                     "prefill_job: tokens do not match input_tokens"));
        return rp;
      }
      if (j.remaining == 0) {
        // Nothing to compute (an empty context): nothing to draw a token from either.
        j.rp.deliver(caf::make_error(caf::sec::invalid_argument, "prefill_job: empty context"));
        return rp;
      }
      if (j.job.fetch_bytes == 0 || st.link == nullptr) {
        j.ready = true;
        j.fetched = true;
      } else {
        // Two transfers back to back on the fetch path: the first layer (compute may start
        // when it is there) and the rest (the job cannot finish before it is there).
        auto layers = std::max<std::uint32_t>(1, st.params.fetch_layers);
        auto first = job.fetch_bytes / layers;
        self->request(st.link, caf::infinite, runtime::link_transfer{id, first})
          .then([self, id](const runtime::link_delivery&) {
            auto i = self->state.jobs.find(id);
            if (i == self->state.jobs.end())
              return;
            i->second.ready = true;
            step(self);
          });
        self->request(st.link, caf::infinite,
                      runtime::link_transfer{id, job.fetch_bytes - first})
          .then([self, id](const runtime::link_delivery&) {
            auto i = self->state.jobs.find(id);
            if (i == self->state.jobs.end())
              return;
            i->second.fetched = true;
            try_finish(self, id);
          });
      }
      st.jobs.emplace(id, std::move(j));
      st.order.push_back(id);
      step(self);
      return rp;
    },
    [self](drain_atom, runtime::duration) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (st.leave) {
        st.leave();
        st.leave = nullptr;
      }
      if (st.jobs.empty())
        return std::uint64_t{0};
      st.drain = self->make_response_promise<std::uint64_t>();
      return *st.drain;
    },
    [self](engine_stats_atom) {
      auto s = self->state.stats;
      s.jobs_in_flight = self->state.jobs.size();
      return s;
    },
    [self](cancel_atom, std::uint64_t request) {
      auto& st = self->state;
      auto i = st.jobs.find(request);
      if (i == st.jobs.end())
        return;
      i->second.rp.deliver(caf::make_error(caf::sec::request_receiver_down, "cancelled"));
      st.jobs.erase(i);
      std::erase(st.order, request);
      // A step in flight may still hold a chunk of it: its result finds no job and is dropped.
      self->send(st.device, runtime::device_release{request});
      if (st.drain && st.jobs.empty()) {
        st.drain->deliver(std::uint64_t{0});
        st.drain.reset();
      }
    },
  };
}

} // namespace

prefill_engine_actor spawn_prefill_engine(caf::local_actor* parent, prefill_engine_params params,
                                          runtime::device_port device,
                                          runtime::link_port fetch_link,
                                          std::function<void()> leave) {
  return parent->spawn(prefill_engine_fn, params, std::move(device), std::move(fetch_link),
                       std::move(leave));
}

} // namespace troupe::actors
