// gpu_rank: a rank forwards its device port's messages, the hand-off included.
#include "actors/gpu_rank.hpp"
#include "runtime/ports/device.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>

using namespace troupe;

TEST_CASE("a gpu rank forwards steps, KV exports and KV imports to its device") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto dev = runtime::spawn_sim_device(sys, [](const runtime::device_step&) {
    return runtime::duration{0};
  });
  auto rank = actors::spawn_gpu_rank(self.ptr(), {0, 0}, dev);
  runtime::device_step step;
  step.id = 3;
  runtime::step_sequence s;
  s.sequence = 5;
  s.count = 2;
  s.sample = true;
  step.batch.push_back(s);
  self->request(rank, std::chrono::seconds(10), step)
    .receive(
      [&](runtime::device_result& r) {
        CHECK(r.id == 3);
        REQUIRE(r.sampled.size() == 1);
        CHECK(r.sampled[0].token == runtime::modelled_token(5, 2));
      },
      [](caf::error&) { FAIL("step"); });
  self->request(rank, std::chrono::seconds(10), runtime::kv_export{5})
    .receive([](runtime::kv_snapshot_ptr& s) { CHECK(s->model == "sim"); },
             [](caf::error&) { FAIL("kv_export"); });
  self->request(rank, std::chrono::seconds(10), runtime::kv_import{5, nullptr})
    .receive([](caf::ok_atom) {}, [](caf::error&) { FAIL("kv_import"); });
  self->send_exit(rank, caf::exit_reason::user_shutdown);
  self->send_exit(dev, caf::exit_reason::user_shutdown);
}
