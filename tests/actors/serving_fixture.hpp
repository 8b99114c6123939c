// A small serving cluster on the deterministic scheduler, with simple device costs so that
// every time can be checked by hand: prefill 1 µs per token, encode 2 µs per token, a decode
// step 10 ms whatever the batch, links at 1 GB/s without latency.
#pragma once

#include "actors/fault_injector.hpp"
#include "actors/instance.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/request/request.hpp"
#include "actors/type_ids.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/errors.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace troupe::actors::testing {

using namespace std::chrono_literals;

inline runtime::duration simple_cost(const runtime::device_step& s) {
  switch (s.phase) {
    case runtime::step_phase::decode:
      return 10ms;
    case runtime::step_phase::encode:
      return std::chrono::microseconds(2 * s.tokens);
    default:
      return std::chrono::microseconds(s.tokens);
  }
}

struct cluster_shape {
  std::uint32_t prefill_instances = 1;
  /// Vision instances; without a vision tier the requests get no vision_lb at all.
  std::uint32_t vision_instances = 0;
  bool vision_tier = true;
  std::uint32_t step_images = 16;
  /// Decode persists the blocks it fills (a block writer per decode instance).
  bool block_writer = false;
  /// The chunked-prefill budget per step of each prefill instance.
  std::uint64_t prefill_step_tokens = 4096;
  std::uint32_t decode_instances = 1;
  /// The pools supervisor's delay before it restarts a failed instance.
  runtime::duration restart_delay{0};
  /// The requests' deadline.
  runtime::duration deadline = std::chrono::minutes(10);
  /// Sliding-window ring bytes a forwarded request carries (request_services).
  std::uint64_t swa_ring_bytes = 0;
  /// The test-only planted bug request_services::test_replay_on_reroute.
  bool test_replay_on_reroute = false;
  /// Decode engines: overlapped scheduling, and the scheduler's time per step it hides.
  bool overlap = false;
  runtime::duration decode_prepare{0};
  /// Prefill engines: an exact rebuild of a hit's window state over this many layers instead
  /// of bounded replay (prefill_engine_params::exact_rebuild_layers).
  std::uint32_t exact_rebuild_layers = 0;
};

/// Asks `dest` once from a fresh actor; the answer is in the result after the driver ran.
template <class T, class Handle, class... Ts>
std::shared_ptr<std::optional<T>> ask(caf::actor_system& sys, const Handle& dest, Ts... xs) {
  auto out = std::make_shared<std::optional<T>>();
  sys.spawn([dest, out, xs...](caf::event_based_actor* self) {
    self->request(dest, caf::infinite, xs...).then([out](T& x) { *out = std::move(x); });
  });
  return out;
}

struct serving_cluster {
  runtime::world world{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                              register_actor_types}};
  caf::actor_system& sys = world.system();
  runtime::time_point origin = world.now();
  kv_check_actor kv;
  prefill_lb_actor plb;
  decode_lb_actor dlb;
  vision_lb_actor vlb;
  caf::actor pools;
  caf::actor sink;
  std::shared_ptr<std::map<std::uint64_t, request_outcome>> outcomes
    = std::make_shared<std::map<std::uint64_t, request_outcome>>();
  std::shared_ptr<std::uint64_t> persisted = std::make_shared<std::uint64_t>(0);
  /// Request handles, held so that no request actor goes away unreferenced.
  std::shared_ptr<std::vector<caf::actor>> requests = std::make_shared<std::vector<caf::actor>>();
  /// What fault injectors did (inject()).
  std::shared_ptr<std::vector<fault_record>> faults
    = std::make_shared<std::vector<fault_record>>();
  std::vector<caf::actor> injectors;
  runtime::duration deadline;
  std::uint64_t swa_ring_bytes = 0;
  bool test_replay_on_reroute = false;

  explicit serving_cluster(cluster_shape shape = {})
    : deadline(shape.deadline), swa_ring_bytes(shape.swa_ring_bytes),
      test_replay_on_reroute(shape.test_replay_on_reroute) {
    kv_index_params kvp;
    kvp.capacity_bytes = 1ull << 40;
    kv = spawn_sharded_kv_store(sys, kvp, 2);
    plb = spawn_prefill_lb(sys, prefill_lb_params{});
    dlb = spawn_decode_lb(sys, decode_balancer_params{});
    if (shape.vision_tier)
      vlb = spawn_vision_lb(sys);
    instance_ports ports;
    ports.device = [](caf::local_actor* self, instance_id, std::uint32_t, std::uint32_t) {
      return runtime::spawn_sim_device(self->system(), simple_cost);
    };
    ports.link = [](caf::local_actor* self, instance_id) {
      return runtime::spawn_sim_link(self->system(), runtime::sim_link_params{1e9, 0s});
    };
    runtime::supervisor_config cfg{"pools",
                                   {runtime::strategy::one_for_one, 10, 1h, shape.restart_delay,
                                    1.0, std::max<runtime::duration>(shape.restart_delay, 1s)},
                                   {}};
    prefill_engine_params pe;
    pe.step_tokens = shape.prefill_step_tokens;
    pe.fetch_layers = 4;
    pe.exact_rebuild_layers = shape.exact_rebuild_layers;
    for (instance_id i = 0; i < shape.prefill_instances; ++i)
      cfg.children.push_back(prefill_instance("prefill", i, 2, pe, ports, plb));
    block_writer_params writer;
    if (shape.block_writer) {
      writer.kv = kv;
      writer.on_persisted = [p = persisted](std::uint64_t n) { *p += n; };
    }
    decode_engine_params de;
    de.overlap = shape.overlap;
    if (shape.decode_prepare > runtime::duration{0})
      de.prepare_cost = [d = shape.decode_prepare](const runtime::device_step&) { return d; };
    for (instance_id i = 0; i < shape.decode_instances; ++i)
      cfg.children.push_back(decode_instance("decode", i, 2, de, ports, dlb, writer));
    vision_engine_params ve;
    ve.step_images = shape.step_images;
    for (instance_id i = 0; shape.vision_tier && i < shape.vision_instances; ++i)
      cfg.children.push_back(vision_instance("vision", i, 1, ve, ports, vlb));
    pools = runtime::spawn_supervisor(sys, std::move(cfg));
    auto out = outcomes;
    sink = sys.spawn([out](caf::event_based_actor*) -> caf::behavior {
      return {[out](const request_outcome& o) { (*out)[o.id] = o; }};
    });
    world.driver().run();
  }

  /// The prompt chain of a request whose block b has content key first_content_key + b.
  static std::vector<block_key> chain_of(std::uint64_t input, std::uint64_t first_content_key) {
    std::vector<std::uint64_t> contents;
    for (std::uint64_t b = 0; b < input / 128; ++b)
      contents.push_back(first_content_key + b);
    return make_chain(std::span<const std::uint64_t>{contents}, input);
  }

  void submit(std::uint64_t id, std::uint64_t input, std::uint64_t output,
              std::uint64_t first_content_key = 1000, std::uint32_t images = 0,
              std::uint64_t image_tokens = 0) {
    request_spec spec;
    spec.id = id;
    spec.input_tokens = input;
    spec.output_tokens = output;
    spec.chain = chain_of(input, first_content_key);
    spec.images = images;
    spec.image_tokens = image_tokens;
    request_services services{kv, plb, dlb, 100, sink, vlb};
    services.deadline = deadline;
    services.swa_ring_bytes = swa_ring_bytes;
    services.test_replay_on_reroute = test_replay_on_reroute;
    sys.spawn([spec, services, held = requests](caf::event_based_actor* self) {
      held->push_back(spawn_request(self, spec, services));
    });
  }

  void run() { world.driver().run(); }

  /// Kills the child at `path` under the pools supervisor (e.g. {"decode/0", "rank1"}) `at`
  /// from now, with a "gpu failure" reason.
  void inject(runtime::duration at, std::vector<std::string> path) {
    fault_order order;
    order.at = at;
    order.path = std::move(path);
    order.reason = runtime::make_error(runtime::errc::unavailable, "gpu failure");
    injectors.push_back(spawn_fault_injector(sys, pools, {order}, faults));
  }

  /// Gives instance `instance` of `pool` a drain notice `at` from now with `grace` (it is then
  /// stopped through the pools supervisor once its hand-off is done).
  void drain(runtime::duration at, instance_id instance, runtime::duration grace,
             const std::string& pool = "decode") {
    fault_order order;
    order.at = at;
    order.path = {pool + "/" + std::to_string(instance)};
    order.drain = grace;
    injectors.push_back(spawn_fault_injector(sys, pools, {order}, faults));
  }

  /// The pools supervisor's lifecycle events, recorded as they happen (subscribe()).
  std::shared_ptr<std::vector<runtime::supervisor_event>> events
    = std::make_shared<std::vector<runtime::supervisor_event>>();

  void subscribe() {
    auto out = events;
    auto rec = sys.spawn([out](caf::event_based_actor*) -> caf::behavior {
      return {[out](const runtime::supervisor_event& e) { out->push_back(e); }};
    });
    injectors.push_back(rec);
    caf::anon_send(pools, runtime::subscribe_atom::value, rec);
    run();
  }

  /// The pools supervisor's children now.
  std::vector<runtime::child_info> children() {
    auto rows = ask<std::vector<runtime::child_info>>(sys, pools,
                                                      runtime::which_children_atom::value);
    run();
    return rows->value_or(std::vector<runtime::child_info>{});
  }

  double ms(runtime::time_point t) const { return runtime::to_seconds(t - origin) * 1e3; }
};

} // namespace troupe::actors::testing
