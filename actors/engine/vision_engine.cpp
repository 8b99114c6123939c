#include "actors/engine/vision_engine.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <vector>

namespace troupe::actors {

namespace {

struct job_state {
  vision_job job;
  std::uint32_t images_left = 0;
  std::uint64_t tokens_left = 0;
  bool started = false;
  runtime::time_point started_at{};
  caf::typed_response_promise<vision_done> rp;
};

/// Images and tokens of one job taken into a step.
struct take {
  std::uint64_t request = 0;
  std::uint32_t images = 0;
  std::uint64_t tokens = 0;
};

struct vision_engine_state {
  vision_engine_params params;
  runtime::device_port device;
  std::map<std::uint64_t, job_state> jobs;
  std::deque<std::uint64_t> order;
  bool stepping = false;
  std::uint64_t next_step = 1;
  engine_stats stats;
  static inline const char* name = "vision_engine";
};

using engine_ptr = vision_engine_actor::stateful_pointer<vision_engine_state>;

void step(engine_ptr self) {
  auto& st = self->state;
  if (st.stepping || st.order.empty())
    return;
  // Images in arrival order up to the step's budget; a job's last image takes whatever is
  // left of its tokens, so a job's tokens add up exactly.
  std::uint32_t budget = std::max<std::uint32_t>(1, st.params.step_images);
  std::vector<take> batch;
  runtime::device_step ds{st.next_step, runtime::step_phase::encode, 0, 0, 0};
  for (auto id : st.order) {
    if (budget == 0)
      break;
    auto& j = st.jobs.at(id);
    auto n = std::min(budget, j.images_left);
    auto tokens = n == j.images_left ? j.tokens_left : n * (j.job.image_tokens / j.job.images);
    batch.push_back(take{id, n, tokens});
    budget -= n;
    ds.tokens += tokens;
    ds.sequences += n;
  }
  // An image attends within itself: the context summed over images is its tokens.
  ds.context_tokens = ds.tokens;
  st.stepping = true;
  ++st.next_step;
  auto now = self->clock().now();
  for (auto& t : batch) {
    auto& j = st.jobs.at(t.request);
    if (!j.started) {
      j.started = true;
      j.started_at = now;
    }
  }
  self->request(st.device, caf::infinite, ds)
    .then(
      [self, batch](const runtime::device_result& r) {
        auto& st = self->state;
        st.stepping = false;
        ++st.stats.steps;
        st.stats.busy += r.finished - r.started;
        for (auto& t : batch) {
          auto i = st.jobs.find(t.request);
          if (i == st.jobs.end())
            continue;
          auto& j = i->second;
          j.images_left -= t.images;
          j.tokens_left -= t.tokens;
          st.stats.tokens += t.tokens;
          if (j.images_left > 0)
            continue;
          j.rp.deliver(vision_done{t.request, st.params.instance, j.started_at, r.finished});
          st.jobs.erase(i);
          std::erase(st.order, t.request);
          ++st.stats.jobs_done;
        }
        step(self);
      },
      [self](const caf::error& err) {
        // The device is gone (its rank failed): so is this instance.
        self->quit(err);
      });
}

vision_engine_actor::behavior_type vision_engine_fn(engine_ptr self, vision_engine_params params,
                                                     runtime::device_port device) {
  auto& st = self->state;
  st.params = params;
  st.device = std::move(device);
  st.stats.instance = params.instance;
  return {
    [self](const vision_job& job) -> caf::typed_response_promise<vision_done> {
      auto& st = self->state;
      auto rp = self->make_response_promise<vision_done>();
      if (job.images == 0) {
        auto now = self->clock().now();
        rp.deliver(vision_done{job.request, st.params.instance, now, now});
        return rp;
      }
      job_state j;
      j.job = job;
      j.images_left = job.images;
      j.tokens_left = job.image_tokens;
      j.rp = rp;
      st.jobs.emplace(job.request, std::move(j));
      st.order.push_back(job.request);
      step(self);
      return rp;
    },
    [self](engine_stats_atom) {
      auto s = self->state.stats;
      s.jobs_in_flight = self->state.jobs.size();
      return s;
    },
  };
}

} // namespace

vision_engine_actor spawn_vision_engine(caf::local_actor* parent, vision_engine_params params,
                                        runtime::device_port device) {
  return parent->spawn(vision_engine_fn, params, std::move(device));
}

} // namespace troupe::actors
