#include "actors/gpu_rank.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace troupe::actors {

namespace {

struct gpu_rank_state {
  gpu_rank_params params;
  runtime::device_port device;
  static inline const char* name = "gpu_rank";
};

runtime::device_port::behavior_type
gpu_rank_fn(runtime::device_port::stateful_pointer<gpu_rank_state> self, gpu_rank_params params,
            runtime::device_port device) {
  self->state.params = params;
  self->state.device = device;
  self->monitor(device);
  self->set_down_handler([self](caf::down_msg& msg) { self->quit(msg.reason); });
  return {
    // Moved on, not copied: a step carries its whole batch.
    [self](runtime::device_step& step) {
      return self->delegate(self->state.device, std::move(step));
    },
    [self](const runtime::device_release& r) { self->send(self->state.device, r); },
    [self](const runtime::kv_export& x) { return self->delegate(self->state.device, x); },
    [self](const runtime::kv_import& x) { return self->delegate(self->state.device, x); },
    [self](const runtime::kv_keep& x) { self->send(self->state.device, x); },
    [self](const runtime::kv_kept_export& x) { return self->delegate(self->state.device, x); },
    [self](runtime::kv_restore& x) {
      return self->delegate(self->state.device, std::move(x));
    },
  };
}

} // namespace

runtime::device_port spawn_gpu_rank(caf::local_actor* parent, gpu_rank_params params,
                                    runtime::device_port device) {
  return parent->spawn(gpu_rank_fn, params, std::move(device));
}

} // namespace troupe::actors
