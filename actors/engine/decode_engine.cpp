#include "actors/engine/decode_engine.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <deque>
#include <map>

namespace troupe::actors {

namespace {

constexpr std::uint64_t block_size = 128;

struct running {
  decode_job job;
  runtime::time_point arrived{};
  runtime::time_point joined{};
  std::uint64_t generated = 0;
  std::uint64_t blocks = 0;
  caf::typed_response_promise<decode_done> rp;
  /// Where progress notices go (the job's sender), when the job asks for them.
  caf::actor progress_to;
};

struct decode_engine_state {
  decode_engine_params params;
  runtime::device_port device;
  runtime::link_port ingress;
  block_sink persist;
  std::deque<running> waiting; // KV arrived, batch full
  std::map<std::uint64_t, running> batch;
  std::uint64_t batch_kv = 0;
  std::uint64_t in_transfer = 0;
  bool stepping = false;
  std::uint64_t next_step = 1;
  engine_stats stats;
  static inline const char* name = "decode_engine";
};

using engine_ptr = decode_engine_actor::stateful_pointer<decode_engine_state>;

void admit(engine_ptr self) {
  auto& st = self->state;
  auto now = self->clock().now();
  while (!st.waiting.empty() && st.batch.size() < st.params.max_batch) {
    auto r = std::move(st.waiting.front());
    st.waiting.pop_front();
    r.joined = now;
    st.batch_kv += r.job.context_tokens;
    st.batch.emplace(r.job.request, std::move(r));
  }
}

void step(engine_ptr self) {
  auto& st = self->state;
  if (st.stepping)
    return;
  admit(self);
  if (st.batch.empty())
    return;
  st.stepping = true;
  runtime::device_step ds{st.next_step++, runtime::step_phase::decode, st.batch.size(),
                          static_cast<std::uint32_t>(st.batch.size()), st.batch_kv};
  self->request(st.device, caf::infinite, ds)
    .then(
      [self](const runtime::device_result& r) {
        auto& st = self->state;
        st.stepping = false;
        ++st.stats.steps;
        st.stats.busy += r.finished - r.started;
        st.stats.tokens += st.batch.size();
        std::vector<filled_blocks> filled;
        for (auto i = st.batch.begin(); i != st.batch.end();) {
          auto& run = i->second;
          ++run.generated;
          ++st.batch_kv;
          auto length = run.job.context_tokens + run.generated;
          auto done = run.generated >= run.job.output_tokens;
          bool full = length % block_size == 0;
          if (full)
            ++run.blocks;
          if (full || (done && run.blocks > 0))
            filled.push_back(filled_blocks{i->first, run.job.parent, run.job.parent_blocks,
                                           length / block_size - 1, full ? 1u : 0u,
                                           run.job.traffic, done});
          if (!done && run.job.progress_every > 0 && run.generated % run.job.progress_every == 0
              && run.progress_to)
            caf::anon_send(run.progress_to,
                           decode_progress{i->first, st.params.instance, run.generated});
          if (done) {
            run.rp.deliver(decode_done{i->first, st.params.instance, run.arrived, run.joined,
                                       r.finished, run.generated, run.blocks});
            st.batch_kv -= length;
            ++st.stats.jobs_done;
            i = st.batch.erase(i);
          } else {
            ++i;
          }
        }
        if (!filled.empty() && st.persist)
          st.persist(filled);
        step(self);
      },
      [self](const caf::error& err) { self->quit(err); });
}

decode_engine_actor::behavior_type decode_engine_fn(engine_ptr self, decode_engine_params params,
                                                     runtime::device_port device,
                                                     runtime::link_port ingress,
                                                     block_sink persist) {
  auto& st = self->state;
  st.params = params;
  st.device = std::move(device);
  st.ingress = std::move(ingress);
  st.persist = std::move(persist);
  st.stats.instance = params.instance;
  return {
    [self](const decode_job& job) -> caf::typed_response_promise<decode_done> {
      auto& st = self->state;
      running r;
      r.job = job;
      // (Before the promise is made: making it takes over the current message's sender.)
      if (job.progress_every > 0)
        r.progress_to = caf::actor_cast<caf::actor>(self->current_sender());
      r.rp = self->make_response_promise<decode_done>();
      auto rp = r.rp;
      if (job.output_tokens == 0) {
        auto now = self->clock().now();
        r.rp.deliver(decode_done{job.request, st.params.instance, now, now, now, 0, 0});
        return rp;
      }
      auto arrive = [self](running&& run) {
        run.arrived = self->clock().now();
        self->state.waiting.push_back(std::move(run));
        step(self);
      };
      if (job.kv_bytes == 0 || st.ingress == nullptr) {
        arrive(std::move(r));
        return rp;
      }
      ++st.in_transfer;
      auto holder = std::make_shared<running>(std::move(r));
      self->request(st.ingress, caf::infinite, runtime::link_transfer{job.request, job.kv_bytes})
        .then([self, holder, arrive](const runtime::link_delivery&) {
          --self->state.in_transfer;
          arrive(std::move(*holder));
        });
      return rp;
    },
    [self](engine_stats_atom) {
      auto s = self->state.stats;
      s.jobs_in_flight = self->state.batch.size() + self->state.waiting.size()
                         + self->state.in_transfer;
      return s;
    },
  };
}

} // namespace

decode_engine_actor spawn_decode_engine(caf::local_actor* parent, decode_engine_params params,
                                        runtime::device_port device, runtime::link_port ingress,
                                        block_sink persist) {
  return parent->spawn(decode_engine_fn, params, std::move(device), std::move(ingress),
                       std::move(persist));
}

} // namespace troupe::actors
