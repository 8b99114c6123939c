// The serving path end to end on the deterministic scheduler: request → KV match → prefill
// (chunked, fetch of cached blocks) → hand-off → decode (continuous batching) → outcome, with
// simple device costs so that every time can be checked by hand.
#include "serving_fixture.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using testing::cluster_shape;

namespace {

using serving = testing::serving_cluster;

cluster_shape prefill(std::uint32_t instances, std::uint64_t step_tokens = 4096) {
  cluster_shape shape;
  shape.prefill_instances = instances;
  shape.prefill_step_tokens = step_tokens;
  return shape;
}

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
  serving s{prefill(1, 1024)};
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

TEST_CASE("an exact rebuild of the window state costs its receptive field's token-layers") {
  // Layer l of L recomputes the last min(cached, (L − l + 1) · W) tokens: over L layers that
  // many token-layers / L tokens through the whole model.
  CHECK(exact_rebuild_tokens(4096, 4, 128) == (4 + 3 + 2 + 1) * 128 / 4);
  CHECK(exact_rebuild_tokens(200, 4, 128) == (200 + 200 + 200 + 128) / 4);
  CHECK(exact_rebuild_tokens(201, 4, 128) == (201 + 201 + 201 + 128 + 3) / 4);  // rounded up
  CHECK(exact_rebuild_tokens(0, 4, 128) == 0);
  CHECK(exact_rebuild_tokens(4096, 0, 128) == 0);
  // V4.1-Flash's 43 layers over a long prefix: 22 windows' worth, against bounded replay's one.
  CHECK(exact_rebuild_tokens(1'000'000, 43, 128) == 128 * 44 / 2);
  // The repeated prompt of the test above, rebuilt exactly over the fixture's 4 layers: 320
  // tokens computed from the first fetched layer on (0.1024 ms), past the last one's arrival.
  cluster_shape shape;
  shape.exact_rebuild_layers = 4;
  serving s{shape};
  s.submit(1, 4096, 1);
  s.run();
  s.submit(2, 4096, 1);
  s.run();
  auto& second = s.outcomes->at(2);
  REQUIRE(second.completed);
  CHECK(second.hit_tokens == 4096);
  CHECK(runtime::to_seconds(second.first_token - second.admitted) * 1e3
        == doctest::Approx(0.1024 + 0.320));
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

TEST_CASE("overlapped decode: the device never waits for the scheduler, and the tokens are the "
          "same") {
  // The scheduler takes 1 ms per step. Unoverlapped, the device waits for it before every
  // step: 20 steps of 11 ms. Overlapped, each step is built while the previous one runs: only
  // the first waits (nothing ran before it), 1 + 20 × 10 ms.
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    testing::cluster_shape shape;
    shape.overlap = overlap;
    shape.decode_prepare = 1ms;
    serving s{shape};
    s.submit(1, 1024, 21);
    s.submit(2, 1024, 21, 5000);
    s.run();
    auto& a = s.outcomes->at(1);
    auto& b = s.outcomes->at(2);
    REQUIRE(a.completed);
    REQUIRE(b.completed);
    CHECK(a.delivered_tokens == 21);
    CHECK(b.delivered_tokens == 21);
    CHECK(a.token_digest == modelled_digest(0, 1, 1024, 0, 21));
    CHECK(b.token_digest == modelled_digest(0, 2, 1024, 0, 21));
    const double decode_ms = overlap ? 1.0 + 200.0 : 220.0;
    CHECK(s.ms(a.finished) == doctest::Approx(1.024 + 0.1024 + decode_ms));
    // b's KV arrives during a's first step. Unoverlapped, it joins the next step (a step after
    // a); overlapped, that step was already built, so it joins the one after (two steps).
    CHECK(s.ms(b.finished) - s.ms(a.finished) == doctest::Approx(overlap ? 20.0 : 11.0));
  }
}

TEST_CASE("prefill requests are spread over instances by least outstanding compute") {
  // Five instances over four buckets: the short bucket gets two.
  serving s{prefill(5)};
  s.submit(1, 8192, 1);
  s.submit(2, 8192, 1, 7000);
  s.world.driver().run();
  CHECK(s.outcomes->at(1).prefill_instance != s.outcomes->at(2).prefill_instance);
}

TEST_CASE("a request with no prefill instance fails with an explicit reason") {
  serving s{prefill(0)};
  s.submit(1, 1024, 4);
  s.world.driver().run();
  REQUIRE(s.outcomes->count(1) == 1);
  auto& o = s.outcomes->at(1);
  CHECK(!o.completed);
  CHECK(o.failure.find("prefill routing") != std::string::npos);
  CHECK(o.failure.find("unavailable") != std::string::npos);
}

TEST_CASE("an instance whose engine dies restarts as a whole and its new engine serves") {
  serving s;
  // The pools supervisor's children: prefill/0, then decode/0. Kill prefill/0's engine.
  auto pools = testing::ask<std::vector<runtime::child_info>>(s.sys, s.pools,
                                                              runtime::which_children_atom::value);
  s.run();
  REQUIRE(pools->has_value());
  auto instance = (**pools)[0].handle;
  REQUIRE((**pools)[0].id == "prefill/0");
  auto children
    = testing::ask<std::vector<runtime::child_info>>(s.sys, instance,
                                                     runtime::which_children_atom::value);
  s.run();
  REQUIRE(children->has_value());
  auto engine = (**children).back();
  REQUIRE(engine.id == "engine");
  caf::anon_send_exit(engine.handle, caf::exit_reason::kill);
  s.run();
  // The instance went down as a whole and came back; its new engine announced itself.
  auto after = testing::ask<std::vector<runtime::child_info>>(s.sys, s.pools,
                                                              runtime::which_children_atom::value);
  s.run();
  REQUIRE(after->has_value());
  CHECK((**after)[0].restarts == 1);
  s.submit(1, 2048, 2);
  s.run();
  REQUIRE(s.outcomes->count(1) == 1);
  CHECK(s.outcomes->at(1).completed);
  CHECK(s.outcomes->at(1).failure.empty());
}

TEST_CASE("decode_lb counts the KV a request appends while it decodes, and frees it at the end") {
  serving s;
  s.submit(1, 1024, 1000);
  auto held_kv = [&] {
    auto stats = testing::ask<lb_counters>(s.sys, s.dlb, lb_stats_atom::value);
    s.world.driver().run_until(s.world.now());
    REQUIRE(*stats);
    auto& c = **stats;
    auto i = std::find(c.names.begin(), c.names.end(), "held_kv_tokens");
    REQUIRE(i != c.names.end());
    return c.values[static_cast<std::size_t>(i - c.names.begin())];
  };
  // Prefill (~1 ms) and the hand-off, then 10 ms steps: at 5 s about 499 tokens are out, and
  // the request has reported all but the last few (it reports 64 at a time) to the balancer.
  s.world.driver().run_until(s.origin + 1s);
  auto early = held_kv();
  CHECK(early > 1024);
  s.world.driver().run_until(s.origin + 5s);
  auto mid = held_kv();
  CHECK(mid >= 1024 + 499 - 64);
  CHECK(mid <= 1024 + 500);
  CHECK(mid > early);
  s.world.driver().run();
  REQUIRE(s.outcomes->at(1).completed);
  CHECK(held_kv() == 0);
}
