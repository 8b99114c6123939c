// instance: an EP group (its ranks and its engine) as a supervisor.
//
// An instance's ranks form one communication domain: if one fails, the collective steps of
// the others cannot go on. So an instance is a one_for_all supervisor with intensity 0: any
// child's failure escalates, the instance stops as a whole, and its pool's supervisor decides
// when it comes back (after the modelled restart time). Its children start in order: the
// ranks, (for decode) the KV block writer, then the engine, which announces itself to its
// load balancer; the balancer monitors the engine, so a stopped instance leaves the balancer
// by itself.
//
// Elasticity: the instance's child spec builds its supervisor anew at every start, on the
// GPUs `instance_ports::gpus` gives it then — so an instance restarted after a GPU failure
// re-forms its EP group on the healthy GPUs (fewer ranks, each named after its GPU), or
// stays down when too few are healthy (the start fails and its pool supervisor retries after
// the restart delay).
//
// Where a rank's device and an instance's link come from is the world's business: the
// caller passes factories (simulated ports in the simulated world).
#pragma once

#include "actors/engine/decode_engine.hpp"
#include "actors/engine/prefill_engine.hpp"
#include "actors/engine/vision_engine.hpp"
#include "actors/kv/block_writer.hpp"
#include "actors/lb/decode_lb.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/lb/vision_lb.hpp"
#include "runtime/supervisor.hpp"

#include <functional>
#include <string>
#include <vector>

namespace troupe::actors {

/// How an instance gets its ports.
struct instance_ports {
  /// The device of the rank at position `rank` (0: the leader, which runs the instance's
  /// steps) of an incarnation of instance `id` with `size` ranks.
  std::function<runtime::device_port(caf::local_actor*, instance_id id, std::uint32_t rank,
                                     std::uint32_t size)>
    device;
  /// The instance's KV link: store → device for prefill, prefill → device for decode. May
  /// return an invalid handle (no transfer time).
  std::function<runtime::link_port(caf::local_actor*, instance_id id)> link;
  /// Elasticity: the GPUs (indices below the instance's configured `ranks`, ascending) an
  /// incarnation of instance `id` runs on, asked at every start and restart; the rank on GPU g
  /// is the child "rank<g>". An empty list means too few GPUs are healthy: the start fails
  /// and the pool's supervisor tries again after its restart delay, so the instance stays
  /// down until enough recover. Unset: every configured GPU, every time.
  std::function<std::vector<std::uint32_t>(instance_id id)> gpus;
};

/// The child spec of prefill instance `id` with `ranks` ranks (named "<pool>/<id>"). An
/// incarnation with fewer ranks (`ports.gpus`) scales its engine's per-step budget (prefill
/// tokens, decode batch) by its share of `ranks`. With `report_kept`, the engine tells `lb`
/// the window states its device keeps (prefill_kept).
runtime::child_spec prefill_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                     prefill_engine_params engine, instance_ports ports,
                                     prefill_lb_actor lb, bool report_kept = true);

/// The child spec of decode instance `id` with `ranks` ranks (named "<pool>/<id>"). With a
/// valid `writer.kv`, a block writer child (started before the engine) persists every block
/// the engine fills; with an invalid one, filled blocks are not persisted. With a valid
/// `kept_to` as well (real world: the prefill balancer, or a relay to it), the engine keeps
/// window states at the block boundaries its steps end on and reports them there
/// (prefill_kept, decode_engine_params::kept).
runtime::child_spec decode_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    decode_engine_params engine, instance_ports ports,
                                    decode_lb_actor lb, block_writer_params writer,
                                    caf::actor kept_to = {});

/// The child spec of vision instance `id` with `ranks` ranks (named "<pool>/<id>"); it uses
/// `ports.device` only (an encoder has no KV link).
runtime::child_spec vision_instance(std::string pool, instance_id id, std::uint32_t ranks,
                                    vision_engine_params engine, instance_ports ports,
                                    vision_lb_actor lb);

} // namespace troupe::actors
