// Rank / instance failure and reroute on the deterministic scheduler: a rank is killed under
// a request (the fault injector walks the supervision tree), its instance goes down as a
// whole, and the request goes elsewhere — re-prefilled, or resumed on another decode
// instance from the tokens already delivered — or waits for the restart, or fails at its
// deadline. The fixture's costs: prefill 1 µs per token, a decode step 10 ms, 1 GB/s links.
#include "serving_fixture.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using testing::cluster_shape;

namespace {

using serving = testing::serving_cluster;

cluster_shape shape(std::uint32_t prefill, std::uint32_t decode, runtime::duration restart) {
  cluster_shape s;
  s.prefill_instances = prefill;
  s.decode_instances = decode;
  s.restart_delay = restart;
  return s;
}

/// The outcome of request 1 (`input`, `output`) on `s` without faults.
request_outcome fault_free(cluster_shape sh, std::uint64_t input, std::uint64_t output) {
  serving s{sh};
  s.submit(1, input, output);
  s.run();
  REQUIRE(s.outcomes->count(1) == 1);
  return s.outcomes->at(1);
}

} // namespace

TEST_CASE("a decode rank killed mid-decode: the request resumes on another decode instance") {
  auto sh = shape(1, 2, 10s);
  auto base = fault_free(sh, 1024, 101);
  REQUIRE(base.completed);
  serving s{sh};
  s.submit(1, 1024, 101);
  // 100 decode steps of 10 ms from ~1.1 ms: at 500 ms, 49 tokens are decoded and 48 of them
  // reported (progress every 16), so the client has 49 tokens.
  s.inject(500ms, {"decode/" + std::to_string(base.decode_instance), "rank1"});
  s.run();
  REQUIRE(s.faults->size() == 1);
  CHECK(s.faults->at(0).injected);
  REQUIRE(s.outcomes->count(1) == 1);
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.failure.empty());
  CHECK(o.reroutes == 1);
  CHECK(o.decode_instance != base.decode_instance);
  // Exactly its output length: the 49 delivered before are not delivered again.
  CHECK(o.delivered_tokens == o.output_tokens);
  // Deterministic decoding: the very tokens of the fault-free run, in order, once each.
  CHECK(o.token_digest == base.token_digest);
  CHECK(o.token_digest == modelled_digest(0, 1, 1024, 0, 101));
  CHECK(o.first_token == base.first_token);
  // Resumed at 500 ms: re-prefill of the 48 decoded tokens (the prompt's 8 blocks hit), the
  // hand-off, then the remaining 52 tokens: it ends about 520 ms after the failure, where the
  // fault-free run ended at ~1001 ms.
  CHECK(s.ms(o.finished) > s.ms(base.finished));
  CHECK(s.ms(o.finished) == doctest::Approx(500 + 520).epsilon(0.01));
}

TEST_CASE("a decode rank killed before any progress: no token but the first was delivered") {
  auto sh = shape(1, 2, 10s);
  auto base = fault_free(sh, 1024, 101);
  serving s{sh};
  s.submit(1, 1024, 101);
  // At 50 ms, 4 tokens are decoded but none reported yet: all are decoded again elsewhere.
  s.inject(50ms, {"decode/" + std::to_string(base.decode_instance), "rank0"});
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.reroutes == 1);
  CHECK(o.delivered_tokens == 101);
  CHECK(o.token_digest == base.token_digest);
}

TEST_CASE("a prefill instance killed mid-prefill: the request is re-prefilled elsewhere") {
  cluster_shape sh = shape(2, 1, 10s);
  auto base = fault_free(sh, 100000, 5);
  REQUIRE(base.completed);
  serving s{sh};
  s.submit(1, 100000, 5);
  // 100,000 tokens in chunks of 4096 at 1 µs a token: about 100 ms of prefill.
  s.inject(50ms, {"prefill/" + std::to_string(base.prefill_instance), "rank1"});
  s.run();
  REQUIRE(s.faults->size() == 1);
  CHECK(s.faults->at(0).injected);
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.reroutes == 1);
  CHECK(o.prefill_instance != base.prefill_instance);
  CHECK(o.delivered_tokens == 5);
  // Nothing was persisted before the failure: the whole prompt is prefilled again.
  CHECK(s.ms(o.first_token) == doctest::Approx(50 + 100).epsilon(0.02));
}

TEST_CASE("the only decode instance fails: requests wait for its restart and it serves again") {
  serving s{shape(1, 1, 30s)};
  s.submit(1, 1024, 101);
  s.inject(500ms, {"decode/0", "rank1"});
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.reroutes == 1);
  CHECK(o.decode_instance == 0);
  CHECK(o.delivered_tokens == 101);
  // Back 30 s after the failure (the restart delay), within a retry interval of 1 s.
  CHECK(s.ms(o.finished) > 30500);
  CHECK(s.ms(o.finished) < 32500);
  // The instance restarted once, and a new request is served by it at once.
  auto pools = testing::ask<std::vector<runtime::child_info>>(s.sys, s.pools,
                                                              runtime::which_children_atom::value);
  s.run();
  REQUIRE(pools->has_value());
  CHECK((**pools)[1].id == "decode/0");
  CHECK((**pools)[1].restarts == 1);
  auto before = s.world.now();
  s.submit(2, 1024, 11, 7000);
  s.run();
  auto& second = s.outcomes->at(2);
  CHECK(second.completed);
  CHECK(second.reroutes == 0);
  CHECK(runtime::to_seconds(second.finished - before) < 0.2);
}

TEST_CASE("a request that cannot be served within its deadline fails with the reason") {
  auto sh = shape(1, 1, 20min);
  sh.deadline = 2min;
  serving s{sh};
  s.submit(1, 1024, 101);
  s.inject(500ms, {"decode/0", "rank0"});
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(!o.completed);
  CHECK(o.reroutes == 1);
  CHECK(o.failure.find("decode routing") != std::string::npos);
  CHECK(o.failure.find("deadline") != std::string::npos);
  // 49 before the fault, and the one the re-prefill (prompt + those 49) drew before decode
  // routing found no instance.
  CHECK(o.delivered_tokens == 50);
  CHECK(s.ms(o.finished) <= 120000);
}

TEST_CASE("a fault on a target that is down is skipped and logged") {
  serving s{shape(1, 1, 1min)};
  s.inject(1s, {"decode/0", "rank0"});
  s.inject(2s, {"decode/0", "rank1"});
  s.inject(3s, {"decode/7", "rank1"});
  s.run();
  REQUIRE(s.faults->size() == 3);
  CHECK(s.faults->at(0).injected);
  CHECK(!s.faults->at(1).injected);
  CHECK(s.faults->at(1).skipped == "target down");
  CHECK(s.faults->at(2).skipped == "no child 'decode/7'");
}

TEST_CASE("the planted replay bug: the right count, but not the fault-free token stream") {
  // As above (killed at 500 ms with 49 tokens delivered), with the test-only bug that makes
  // the request forget what it delivered: it streams positions 1-48 again and still ends
  // with exactly 101 tokens, so only the stream digest tells.
  auto sh = shape(1, 2, 10s);
  auto base = fault_free(sh, 1024, 101);
  sh.test_replay_on_reroute = true;
  serving s{sh};
  s.submit(1, 1024, 101);
  s.inject(500ms, {"decode/" + std::to_string(base.decode_instance), "rank1"});
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.reroutes == 1);
  CHECK(o.delivered_tokens == 101);
  CHECK(o.token_digest != base.token_digest);
  CHECK(base.token_digest == modelled_digest(0, 1, 1024, 0, 101));
}
