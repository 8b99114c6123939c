// vision_engine: the scheduler of one vision instance (the image encoder of multimodal prompts).
//
// A request that carries images must have them encoded into image tokens before its prompt
// can be prefilled. Encoding runs on its own pool so that a burst of images does not stall
// text prefill, and a device step costs roughly the tokens it encodes; so the engine batches
// images from several requests into one device step of phase `encode`, up to `step_images`
// images per step, taking images from jobs in arrival order. A job with more images than the
// budget spans several steps. The step's cost is left to the device (the perf model in the
// simulated world).
//
// Protocol: a `vision_job` request is answered with `vision_done` when the job's last image
// is encoded. A job without images is answered at once. When the device fails, the engine
// exits with the device's error (its instance goes down with it; waiting jobs get that error).
#pragma once

#include "actors/engine/prefill_engine.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>

namespace troupe::actors {

/// Encode the `images` images of a request, `image_tokens` tokens of encoder work in all
/// (spread evenly over the images).
struct vision_job {
  std::uint64_t request = 0;
  std::uint32_t images = 0;
  std::uint64_t image_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vision_job& x) {
  return f(caf::meta::type_name("vision_job"), x.request, x.images, x.image_tokens);
}

struct vision_done {
  std::uint64_t request = 0;
  instance_id instance = 0;
  /// When the job's first image started encoding, and when its last one was done.
  runtime::time_point started{};
  runtime::time_point finished{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vision_done& x) {
  return f(caf::meta::type_name("vision_done"), x.request, x.instance, x.started, x.finished);
}

using vision_engine_actor
  = caf::typed_actor<caf::replies_to<vision_job>::with<vision_done>,
                     caf::replies_to<engine_stats_atom>::with<engine_stats>>;

struct vision_engine_params {
  instance_id instance = 0;
  /// Images per device step, over the whole instance (≥ 1; 0 counts as 1).
  std::uint32_t step_images = 16;
};

/// Spawns a vision engine that runs its steps on `device` (the instance's leader rank). Its
/// stats count encoded image tokens as `tokens`.
vision_engine_actor spawn_vision_engine(caf::local_actor* parent, vision_engine_params params,
                                        runtime::device_port device);

} // namespace troupe::actors
