// Tests of cluster/sim/invariants: the end-of-run "nothing lost" checks.
#include "cluster/sim/invariants.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/trace.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::sim;

namespace {

const runtime::time_point t0{std::chrono::seconds{100}};

// A request that completed cleanly: admitted at t0, first token 1 s later, done at 5 s.
actors::request_outcome completed(std::uint64_t id, std::uint64_t output = 10) {
  actors::request_outcome o;
  o.id = id;
  o.completed = true;
  o.admitted = t0;
  o.first_token = t0 + 1s;
  o.finished = t0 + 5s;
  o.input_tokens = 100;
  o.output_tokens = output;
  o.delivered_tokens = output;
  o.token_digest = actors::modelled_digest(0, id, 100, 0, output);
  return o;
}

actors::request_outcome failed(std::uint64_t id, std::string reason) {
  actors::request_outcome o;
  o.id = id;
  o.completed = false;
  o.failure = std::move(reason);
  o.admitted = t0;
  o.finished = t0 + 2s;
  o.output_tokens = 10;
  return o;
}

// The report has exactly one violation, about `id`, containing `text`.
void expect_one(const invariant_report& r, std::uint64_t id, std::string_view text) {
  std::string all;
  for (auto& v : r.violations)
    all += v.to_string() + "\n";
  INFO(all);
  REQUIRE(r.violations.size() == 1);
  CHECK(r.violations[0].request == id);
  CHECK(r.violations[0].what.find(text) != std::string::npos);
}

} // namespace

TEST_CASE("clean outcomes break no invariant") {
  auto r = check_invariants({1, 2, 3}, {completed(2), completed(1), failed(3, "decode: boom")},
                            true);
  CHECK(r.ok());
  CHECK(r.checked == 3);
  CHECK(r.to_json().dump() == R"({"checked":3,"violations":[]})");
}

TEST_CASE("an admitted request without an outcome is lost when the run finished") {
  expect_one(check_invariants({1, 2}, {completed(1)}, true), 2,
             "admitted but never reached a terminal state");
}

TEST_CASE("a run stopped by its deadline may leave requests unfinished") {
  CHECK(check_invariants({1, 2}, {completed(1)}, false).ok());
}

TEST_CASE("a request that ended twice is caught") {
  auto r = check_invariants({4}, {completed(4), failed(4, "decode: lost")}, true);
  expect_one(r, 4, "ended 2 times (completed, failed ('decode: lost'))");
}

TEST_CASE("an outcome for a request never admitted is caught") {
  expect_one(check_invariants({1}, {completed(1), completed(9)}, true), 9,
             "completed without having been admitted");
}

TEST_CASE("a completed request that carries a failure is caught") {
  auto o = completed(5);
  o.failure = "prefill: gone";
  expect_one(check_invariants({5}, {o}, true), 5,
             "completed, yet carries the failure reason 'prefill: gone'");
}

TEST_CASE("a completed request short of its output is caught") {
  auto o = completed(6, 10);
  o.delivered_tokens = 7;
  expect_one(check_invariants({6}, {o}, true), 6,
             "completed after delivering 7 of its 10 output tokens");
}

TEST_CASE("a token delivered twice is caught, on completed and failed requests") {
  auto o = completed(7, 10);
  o.delivered_tokens = 11;
  expect_one(check_invariants({7}, {o}, true), 7,
             "delivered 11 tokens for an output of 10: a token was delivered twice");
  auto f = failed(8, "decode: x");
  f.first_token = t0 + 1s;
  f.delivered_tokens = 12;
  expect_one(check_invariants({8}, {f}, true), 8, "a token was delivered twice");
}

TEST_CASE("a failure without a reason is caught") {
  expect_one(check_invariants({3}, {failed(3, "")}, true), 3,
             "failed without a reason the client sees");
}

TEST_CASE("outcome times out of order are caught") {
  auto early = completed(10);
  early.first_token = t0 - 1s;
  expect_one(check_invariants({10}, {early}, true), 10,
             "first token 1000.000 ms before it was admitted");
  auto late = completed(11);
  late.first_token = t0 + 6s;
  expect_one(check_invariants({11}, {late}, true), 11,
             "first token at 6000.000 ms, after it finished at 5000.000 ms");
  auto backwards = failed(12, "x");
  backwards.finished = t0 - 2s;
  expect_one(check_invariants({12}, {backwards}, true), 12,
             "finished 2000.000 ms before it was admitted");
}

TEST_CASE("violations print as 'request <id>: <what>' and come out ordered by id") {
  auto r = check_invariants({2, 1}, {failed(2, ""), failed(1, "")}, true);
  REQUIRE(r.violations.size() == 2);
  CHECK(r.violations[0].to_string() == "request 1: failed without a reason the client sees");
  CHECK(r.violations[1].request == 2);
  auto j = r.to_json();
  CHECK(j["violations"][0]["request"] == 1);
}

TEST_CASE("a replayed trace keeps every invariant and reports the check") {
  auto t = load_topology(std::string{TROUPE_SOURCE_DIR} + "/examples/topologies/small.toml");
  REQUIRE(t.ok());
  load_options lo;
  lo.max_records = 200;
  auto loaded = load_mooncake(
    std::string{TROUPE_SOURCE_DIR} + "/examples/traces/mooncake_fast25_conversation_trace.jsonl",
    lo);
  REQUIRE(loaded.ok);
  auto r = run_simulation(*t.value, loaded.records, sim_options{});
  REQUIRE(r.ok());
  CHECK(r->invariants.ok());
  CHECK(r->invariants.checked == 200);
  CHECK(r->report["invariants"]["checked"] == 200);
  CHECK(r->report["invariants"]["violations"].empty());
}

TEST_CASE("a stream that differs from the fault-free run's is caught, even with the right count") {
  // Tokens 0-5, then a resumed job that starts again at 4 (4 and 5 twice) and stops at 10
  // tokens in all: the count is right, the stream is not.
  auto o = completed(7, 10);
  o.token_digest = actors::modelled_digest(0, 7, 100, 0, 6);
  for (std::uint64_t k = 0; k < 4; ++k)
    o.token_digest = actors::digest_token(o.token_digest, 6 + k,
                                          runtime::modelled_token(7, 100 + 4 + k));
  expect_one(check_invariants({7}, {o}, true), 7, "differs from its fault-free run's");
  // The same positions delivered in two pieces, in order, are the same stream.
  auto split = completed(8, 10);
  split.token_digest =
      actors::modelled_digest(actors::modelled_digest(0, 8, 100, 0, 3), 8, 100, 3, 10);
  CHECK(check_invariants({8}, {split}, true).ok());
  // The stream depends on the request: another request's tokens are not this one's.
  auto other = completed(9, 10);
  other.token_digest = actors::modelled_digest(0, 10, 100, 0, 10);
  expect_one(check_invariants({9}, {other}, true), 9, "differs from its fault-free run's");
}
