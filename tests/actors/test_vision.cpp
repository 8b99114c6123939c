// The vision tier: requests with images are encoded on a vision instance (chosen by least
// outstanding encoder work) before their prompt is matched and prefilled.
#include "serving_fixture.hpp"

#include "actors/lb/vision_lb.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::testing;

namespace {

/// The counter `name` of `c` (fails the test when absent).
std::uint64_t counter(const lb_counters& c, const std::string& name) {
  for (std::size_t i = 0; i < c.names.size(); ++i)
    if (c.names[i] == name)
      return c.values[i];
  FAIL("no counter " << name);
  return 0;
}

} // namespace

TEST_CASE("a request with images is encoded on the least loaded vision instance before prefill") {
  serving_cluster s{cluster_shape{1, 2}};
  s.submit(1, 4096, 1, 1000, 4, 4 * 576);
  s.submit(2, 1024, 1, 9000, 1, 576);
  s.run();
  REQUIRE(s.outcomes->size() == 2);
  auto& a = s.outcomes->at(1);
  auto& b = s.outcomes->at(2);
  REQUIRE(a.completed);
  REQUIRE(b.completed);
  // Both instances are idle when a arrives: the lowest id wins. b comes while a's 2304
  // image tokens are booked on instance 0, so it goes to the idle instance 1.
  CHECK(a.vision_instance == 0);
  CHECK(b.vision_instance == 1);
  // a's four images are one encoder step of 2304 tokens at 2 µs, b's one image 576 tokens.
  CHECK(s.ms(a.vision_started) == doctest::Approx(0.0));
  CHECK(s.ms(a.encoded) == doctest::Approx(4.608));
  CHECK(s.ms(b.encoded) == doctest::Approx(1.152));
  // Prefill starts only when the images are encoded: b prefills 1024 tokens from 1.152 ms,
  // a its 4096 tokens from 4.608 ms (the prefill instance is idle again by then).
  CHECK(s.ms(b.prefill_started) == doctest::Approx(1.152));
  CHECK(s.ms(b.first_token) == doctest::Approx(1.152 + 1.024));
  CHECK(s.ms(a.prefill_started) == doctest::Approx(4.608));
  CHECK(s.ms(a.first_token) == doctest::Approx(4.608 + 4.096));
}

TEST_CASE("a request without images does not touch the vision tier") {
  serving_cluster s{cluster_shape{1, 1}};
  s.submit(1, 1024, 1);
  s.run();
  auto& o = s.outcomes->at(1);
  REQUIRE(o.completed);
  CHECK(o.encoded == o.admitted);
  CHECK(s.ms(o.first_token) == doctest::Approx(1.024));
  auto stats = ask<lb_counters>(s.sys, s.vlb, lb_stats_atom::value);
  s.run();
  REQUIRE(*stats);
  CHECK(counter(**stats, "routed") == 0);
}

TEST_CASE("images beyond the per-step budget are encoded over several steps") {
  cluster_shape shape{1, 1};
  shape.step_images = 2;
  serving_cluster s{shape};
  // Five images of 100 tokens: steps of 2, 2 and 1 images (0.4 + 0.4 + 0.2 ms).
  s.submit(1, 1024, 1, 1000, 5, 500);
  s.run();
  auto& o = s.outcomes->at(1);
  REQUIRE(o.completed);
  CHECK(s.ms(o.encoded) == doctest::Approx(1.0));
  CHECK(s.ms(o.first_token) == doctest::Approx(1.0 + 1.024));
}

TEST_CASE("a request with images and no vision tier fails with an explicit reason") {
  cluster_shape shape;
  shape.vision_tier = false;
  serving_cluster s{shape};
  s.submit(1, 1024, 4, 1000, 1, 576);
  s.run();
  REQUIRE(s.outcomes->count(1) == 1);
  auto& o = s.outcomes->at(1);
  CHECK(!o.completed);
  CHECK(o.failure == "vision routing: no vision tier");
}

TEST_CASE("a request with images and no vision instance up fails as unavailable") {
  serving_cluster s{cluster_shape{1, 0}};
  s.submit(1, 1024, 4, 1000, 1, 576);
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(!o.completed);
  CHECK(o.failure.find("vision routing") != std::string::npos);
  CHECK(o.failure.find("unavailable") != std::string::npos);
}

TEST_CASE("vision_lb picks the instance with the least outstanding image tokens") {
  serving_cluster s{cluster_shape{1, 3}};
  // One client sends everything in order; the balancer handles it in that order.
  auto chosen = std::make_shared<std::map<std::uint64_t, instance_id>>();
  auto vlb = s.vlb;
  s.sys.spawn([vlb, chosen](caf::event_based_actor* self) {
    auto route = [&](std::uint64_t request, std::uint64_t tokens) {
      self->request(vlb, caf::infinite, vision_route{request, tokens})
        .then([chosen, request](const vision_assignment& a) { (*chosen)[request] = a.instance; });
    };
    route(1, 1000); // all idle: 0
    route(2, 100);  // 0 has 1000: 1
    route(3, 100);  // 2 is idle: 2
    route(4, 50);   // 1 and 2 have 100 each: the lower id, 1 (now 150)
    self->send(vlb, vision_release{0, 1000});
    route(5, 10); // 0 is idle again: 0
  });
  s.run();
  REQUIRE(chosen->size() == 5);
  CHECK(chosen->at(1) == 0);
  CHECK(chosen->at(2) == 1);
  CHECK(chosen->at(3) == 2);
  CHECK(chosen->at(4) == 1);
  CHECK(chosen->at(5) == 0);
  auto stats = ask<lb_counters>(s.sys, s.vlb, lb_stats_atom::value);
  s.run();
  REQUIRE(*stats);
  CHECK((*stats)->lb == "vision");
  CHECK(counter(**stats, "routed") == 5);
  CHECK(counter(**stats, "released") == 1);
  CHECK(counter(**stats, "instances") == 3);
  CHECK(counter(**stats, "outstanding_tokens") == 150 + 100 + 10);
}
