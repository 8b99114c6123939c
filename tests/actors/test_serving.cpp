// The serving path end to end on the deterministic scheduler: request → KV match → prefill
// (chunked, fetch of cached blocks) → hand-off → decode (continuous batching) → outcome, with
// simple device costs so that every time can be checked by hand.
#include "actors/instance.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/request/request.hpp"
#include "actors/type_ids.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <map>
#include <memory>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

/// Prefill costs 1 µs per token; a decode step costs 10 ms whatever the batch.
runtime::duration cost(const runtime::device_step& s) {
  if (s.phase == runtime::step_phase::decode)
    return 10ms;
  return std::chrono::microseconds(s.tokens);
}

struct serving {
  runtime::world world{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                              register_actor_types}};
  caf::actor_system& sys = world.system();
  runtime::time_point origin = world.now();
  kv_check_actor kv;
  prefill_lb_actor plb;
  decode_lb_actor dlb;
  caf::actor pools;
  caf::actor sink;
  std::shared_ptr<std::map<std::uint64_t, request_outcome>> outcomes
    = std::make_shared<std::map<std::uint64_t, request_outcome>>();
  std::vector<caf::actor> requests;

  explicit serving(std::uint32_t prefill_instances = 1, std::uint64_t step_tokens = 4096) {
    kv_index_params kvp;
    kvp.capacity_bytes = 1ull << 40;
    kv = spawn_sharded_kv_store(sys, kvp, 2);
    plb = spawn_prefill_lb(sys, prefill_lb_params{});
    dlb = spawn_decode_lb(sys, decode_balancer_params{});
    instance_ports ports;
    ports.device = [](caf::local_actor* self, instance_id, std::uint32_t) {
      return runtime::spawn_sim_device(self->system(), cost);
    };
    // 1 GB/s, no latency: a fetch or hand-off of B bytes takes B ns.
    ports.link = [](caf::local_actor* self, instance_id) {
      return runtime::spawn_sim_link(self->system(), runtime::sim_link_params{1e9, 0s});
    };
    runtime::supervisor_config cfg{"pools", {runtime::strategy::one_for_one, 10, 1h}, {}};
    prefill_engine_params pe;
    pe.step_tokens = step_tokens;
    pe.fetch_layers = 4;
    for (instance_id i = 0; i < prefill_instances; ++i)
      cfg.children.push_back(prefill_instance("prefill", i, 2, pe, ports, plb));
    cfg.children.push_back(decode_instance("decode", 0, 2, decode_engine_params{}, ports, dlb, {}));
    pools = runtime::spawn_supervisor(sys, std::move(cfg));
    auto out = outcomes;
    sink = sys.spawn([out](caf::event_based_actor*) -> caf::behavior {
      return {[out](const request_outcome& o) { (*out)[o.id] = o; }};
    });
    world.driver().run();
  }

  void submit(std::uint64_t id, std::uint64_t input, std::uint64_t output,
              std::uint64_t first_content_key = 1000) {
    request_spec spec;
    spec.id = id;
    spec.input_tokens = input;
    spec.output_tokens = output;
    std::vector<std::uint64_t> contents;
    for (std::uint64_t b = 0; b < input / 128; ++b)
      contents.push_back(first_content_key + b);
    spec.chain = make_chain(std::span<const std::uint64_t>{contents}, input);
    request_services services{kv, plb, dlb, 100, sink, {}};
    sys.spawn([spec, services, this](caf::event_based_actor* self) {
      requests.push_back(spawn_request(self, spec, services));
    });
  }

  double ms(runtime::time_point t) const { return runtime::to_seconds(t - origin) * 1e3; }
};

} // namespace

TEST_CASE("a request is prefilled, handed off and decoded, and reports its times") {
  serving s;
  s.submit(1, 4096, 11);
  s.world.driver().run();
  REQUIRE(s.outcomes->count(1) == 1);
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.failure.empty());
  CHECK(o.hit_blocks == 0);
  // Prefill: 4096 tokens at 1 µs each in one step.
  CHECK(s.ms(o.first_token) == doctest::Approx(4.096));
  // Hand-off of 4096 × 100 bytes at 1 GB/s, then 10 decode steps of 10 ms.
  CHECK(s.ms(o.finished) == doctest::Approx(4.096 + 0.4096 + 100.0));
}

TEST_CASE("chunked prefill splits a long prompt into steps of the token budget") {
  serving s{1, 1024};
  s.submit(1, 4096, 1);
  s.submit(2, 512, 1, 9000);
  s.world.driver().run();
  auto& a = s.outcomes->at(1);
  auto& b = s.outcomes->at(2);
  REQUIRE(a.completed);
  REQUIRE(b.completed);
  // The long prompt's first chunk is already running when the short one arrives; the next
  // step gives each an equal share (512 + 512 tokens), so the short prompt is done after two
  // steps instead of waiting for all 4096 tokens of the long one.
  CHECK(s.ms(b.first_token) == doctest::Approx(2 * 1.024));
  CHECK(s.ms(a.first_token) == doctest::Approx(4.608));
}

TEST_CASE("a repeated prompt hits the KV cache and computes only the bounded replay") {
  serving s;
  s.submit(1, 4096, 1);
  s.world.driver().run();
  s.submit(2, 4096, 1);
  s.world.driver().run();
  auto& first = s.outcomes->at(1);
  auto& second = s.outcomes->at(2);
  REQUIRE(second.completed);
  CHECK(second.hit_blocks == 32);
  CHECK(second.hit_tokens == 4096);
  auto ttft = second.first_token - second.admitted;
  // The KV of 4096 tokens (409,600 bytes) is fetched at 1 GB/s in 4 layers; compute starts
  // after the first layer and recomputes only the last 128 tokens; the job ends when the
  // last layer is in.
  CHECK(runtime::to_seconds(ttft) * 1e3 == doctest::Approx(0.4096));
  CHECK(ttft < first.first_token - first.admitted);
}

TEST_CASE("decode batches requests: two requests decode in the same steps") {
  serving s;
  s.submit(1, 1024, 21);
  s.submit(2, 1024, 21, 5000);
  s.world.driver().run();
  auto& a = s.outcomes->at(1);
  auto& b = s.outcomes->at(2);
  REQUIRE(a.completed);
  REQUIRE(b.completed);
  // a prefills alone in the first step (1024 µs), b in the next; a's KV arrives and starts
  // a decode step, b's joins at a later step boundary: the two then share 19 steps, so b
  // ends one step (10 ms) after a instead of 200 ms after it.
  CHECK(s.ms(a.finished) == doctest::Approx(1.024 + 0.1024 + 200.0));
  CHECK(s.ms(b.finished) - s.ms(a.finished) == doctest::Approx(10.0));
}

TEST_CASE("prefill requests are spread over instances by least outstanding compute") {
  // Five instances over four buckets: the short bucket gets two.
  serving s{5};
  s.submit(1, 8192, 1);
  s.submit(2, 8192, 1, 7000);
  s.world.driver().run();
  CHECK(s.outcomes->at(1).prefill_instance != s.outcomes->at(2).prefill_instance);
}

TEST_CASE("a request with no prefill instance fails with an explicit reason") {
  serving s{0};
  s.submit(1, 1024, 4);
  s.world.driver().run();
  REQUIRE(s.outcomes->count(1) == 1);
  auto& o = s.outcomes->at(1);
  CHECK(!o.completed);
  CHECK(o.failure.find("prefill routing") != std::string::npos);
  CHECK(o.failure.find("unavailable") != std::string::npos);
}
