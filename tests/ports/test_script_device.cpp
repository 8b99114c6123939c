// The script device: scripted tokens per sequence, position validation, hand-off, delay.
#include "device_fixture.hpp"

#include "ports/script_device.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;
using runtime::device_errc;

namespace {

/// One decode token (id 0: the script device does not read it) for each (sequence, position).
runtime::device_step decode(std::vector<std::pair<std::uint64_t, std::uint64_t>> seqs) {
  std::vector<runtime::step_sequence> batch;
  for (auto [id, pos] : seqs)
    batch.push_back(seq(id, pos, {0}));
  return step(std::move(batch));
}

std::vector<std::int32_t> tokens_of(const runtime::device_result& r) {
  std::vector<std::int32_t> out;
  for (const auto& t : r.sampled)
    out.push_back(t.token);
  return out;
}

} // namespace

TEST_CASE_FIXTURE(
  device_fixture,
  "a script device answers each sequence its script in order, then its last token") {
  auto dev = keep(ports::spawn_script_device(sys, {.script = {10, 11, 12}}));
  // Sequence 1 starts with a 4-token prompt, sequence 2 joins a step later.
  auto r = run(dev, step({seq(1, 0, {5, 6, 7, 8})}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{10});
  r = run(dev, step({seq(1, 4, {10}), seq(2, 0, {1, 2}, false)}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{11}); // 2 asked for none
  r = run(dev, step({seq(2, 2, {3}), seq(1, 5, {11})}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{10, 12});
  CHECK(r->sampled[0].sequence == 2);
  r = run(dev, decode({{1, 6}, {2, 3}}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{12, 11}); // 1's script is used up
}

TEST_CASE_FIXTURE(device_fixture, "a script device cycles its script when told to") {
  auto dev = keep(ports::spawn_script_device(
    sys, {.script = {7, 8}, .at_end = ports::script_end::cycle}));
  std::vector<std::int32_t> got;
  got.push_back(token(dev, step({seq(1, 0, {1})})));
  for (std::uint64_t pos = 1; pos < 5; ++pos)
    got.push_back(token(dev, decode({{1, pos}})));
  CHECK(got == std::vector<std::int32_t>{7, 8, 7, 8, 7});
}

TEST_CASE_FIXTURE(device_fixture, "a script device gives a sequence its own script") {
  auto dev = keep(ports::spawn_script_device(sys, {.script = {1}, .scripts = {{9, {90, 91}}}}));
  auto r = run(dev, step({seq(8, 0, {3}), seq(9, 0, {3})}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{1, 90});
  r = run(dev, decode({{8, 1}, {9, 1}}));
  REQUIRE(r);
  CHECK(tokens_of(*r) == std::vector<std::int32_t>{1, 91});
}

TEST_CASE_FIXTURE(device_fixture, "a script device refuses a wrong position and changes nothing") {
  auto dev = keep(ports::spawn_script_device(sys, {.script = {10, 11, 12}}));
  REQUIRE(token(dev, step({seq(1, 0, {1, 2, 3})})) == 10);
  auto refused = [&](runtime::device_step s) {
    auto r = run(dev, std::move(s));
    return !r && runtime::is(r.error(), device_errc::invalid_step);
  };
  CHECK(refused(decode({{1, 2}})));
  CHECK(refused(decode({{2, 0}, {1, 4}}))); // 2 is valid, 1 is not: nothing runs
  CHECK(refused(decode({{3, 1}})));         // a new sequence starts at 0
  CHECK(refused(decode({{1, 3}, {1, 4}}))); // twice in one batch
  // Neither sequence 1's position nor its place in the script moved; 2 was not opened.
  CHECK(token(dev, decode({{1, 3}})) == 11);
  CHECK(refused(decode({{2, 1}})));
  CHECK(token(dev, decode({{2, 0}})) == 10);
  // A released sequence starts again at position 0 and at the script's start.
  self->send(dev, runtime::device_release{1});
  CHECK(refused(decode({{1, 4}})));
  CHECK(token(dev, decode({{1, 0}})) == 10);
}

TEST_CASE_FIXTURE(device_fixture,
                  "a script device's snapshot continues the script on another script device") {
  auto a = keep(ports::spawn_script_device(sys, {.script = {10, 11, 12, 13}}));
  auto b = keep(ports::spawn_script_device(sys, {.script = {10, 11, 12, 13}}));
  REQUIRE(token(a, step({seq(1, 0, {1, 2, 3})})) == 10);
  REQUIRE(token(a, decode({{1, 3}})) == 11);
  auto snap = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1});
  REQUIRE(snap);
  CHECK((*snap)->length == 4);
  REQUIRE(ask<caf::ok_atom>(b, runtime::kv_import{1, *snap}));
  CHECK(token(b, decode({{1, 4}})) == 12);
  // Another device's snapshot, a corrupted one and an unknown sequence are refused.
  auto foreign = std::make_shared<const runtime::kv_snapshot>(runtime::kv_snapshot{"sim", 4});
  auto r = ask<caf::ok_atom>(b, runtime::kv_import{2, foreign});
  CHECK((!r && runtime::is(r.error(), device_errc::snapshot_rejected)));
  auto corrupt = **snap;
  corrupt.state.bytes[0] ^= 1;
  r = ask<caf::ok_atom>(b, runtime::kv_import{
                             3, std::make_shared<const runtime::kv_snapshot>(corrupt)});
  CHECK((!r && runtime::is(r.error(), device_errc::snapshot_rejected)));
  CHECK(token(b, decode({{3, 0}})) == 10); // nothing was left under 3
  auto none = ask<runtime::kv_snapshot_ptr>(b, runtime::kv_export{99});
  CHECK((!none && runtime::is(none.error(), device_errc::unknown_sequence)));
}

TEST_CASE_FIXTURE(device_fixture, "a script device's steps take its delay, one after another") {
  auto dev = keep(ports::spawn_script_device(sys, {.script = {4}, .step_delay = 20ms}));
  auto first = self->request(dev, 10s, step({seq(1, 0, {1})}, 1));
  auto second = self->request(dev, 10s, step({seq(2, 0, {1})}, 2));
  runtime::device_result a, b;
  first.receive([&](runtime::device_result& r) { a = r; }, [](caf::error&) { FAIL("first"); });
  second.receive([&](runtime::device_result& r) { b = r; }, [](caf::error&) { FAIL("second"); });
  CHECK(a.id == 1);
  CHECK(b.id == 2);
  CHECK(a.finished - a.started == 20ms);
  CHECK(b.started == a.finished);
  CHECK(b.finished - b.started == 20ms);
}
