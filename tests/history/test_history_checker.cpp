// Tests of cluster/sim/history_checker: hand-built histories with each kind of violation are
// caught, clean ones pass; swarm seeds' recorded histories check clean; and the autoscaler
// invariant that times scale-downs from the decisions' own times (invariants.hpp).
#include "cluster/sim/history_checker.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/swarm.hpp"
#include "runtime/ports/device.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::sim;
using actors::booking_fact;
using actors::kv_act;
using actors::request_fact;
using tc = schemas::traffic_class;

namespace {

const runtime::time_point t0{std::chrono::seconds{1000}};

history_expectations expectations() {
  history_expectations e;
  e.origin = t0;
  e.ttl = {{tc::chatbot, 60s}, {tc::agent, 20s}};
  e.decode_kv_tokens = 1000;
  e.decode_max_requests = 2;
  return e;
}

const actors::block_key k1{1, 11}, k2{2, 22};

void kv(actors::run_history& h, runtime::duration at, actors::block_key k, kv_act act,
        tc c = tc::chatbot) {
  h.kv.push_back({t0 + at, k, act, c});
}

/// A request admitted at t0 that delivered `positions` (the device's tokens at them) and ended.
void request(actors::run_history& h, std::uint64_t id, std::uint64_t output,
             std::vector<std::uint64_t> positions, bool completed = true) {
  const std::uint64_t input = 500;
  h.requests.push_back({t0, id, request_fact::admitted, input, output, false});
  auto at = t0 + 1s;
  for (auto p : positions) {
    h.tokens.push_back({at, id, p, runtime::modelled_token(id, input + p)});
    at += 10ms;
  }
  h.requests.push_back(
    {at, id, completed ? request_fact::completed : request_fact::failed, input, output, false});
}

bool mentions(const history_report& r, const std::string& text) {
  for (const auto& v : r.violations)
    if (v.to_string().find(text) != std::string::npos)
      return true;
  return false;
}

std::string all(const history_report& r) {
  std::string s;
  for (const auto& v : r.violations)
    s += v.to_string() + "\n";
  return s;
}

} // namespace

TEST_CASE("history_checker: a clean history passes") {
  actors::run_history h;
  kv(h, 0s, k1, kv_act::write);
  kv(h, 59s, k1, kv_act::hit);     // just before the chatbot TTL
  kv(h, 59s, k1, kv_act::refresh); // lives to 119 s
  kv(h, 100s, k1, kv_act::hit);
  kv(h, 0s, k2, kv_act::reserve, tc::agent);
  kv(h, 10s, k2, kv_act::commit);  // agent: lives to 30 s
  kv(h, 29s, k2, kv_act::hit);
  kv(h, 40s, k2, kv_act::write, tc::agent); // expired: a new life to 60 s
  kv(h, 59s, k2, kv_act::hit);
  request(h, 1, 3, {0, 1, 2});
  request(h, 2, 4, {0, 1}, false); // failed after two tokens: no gap, fine
  h.bookings = {{t0, 0, booking_fact::join, 0},
                {t0, 0, booking_fact::book, 600},
                {t0, 0, booking_fact::book, 400}, // exactly the capacity
                {t0 + 1s, 0, booking_fact::release, 600},
                {t0 + 1s, 0, booking_fact::leave, 0}, // its bookings end with it
                {t0 + 2s, 0, booking_fact::release, 400},
                {t0 + 3s, 0, booking_fact::join, 0}};
  auto r = check_history(h, expectations());
  CHECK_MESSAGE(r.ok(), all(r));
  CHECK(r.kv_facts == 9);
  CHECK(r.token_facts == 5);
  CHECK(r.to_json()["violations"] == 0);
}

TEST_CASE("history_checker: a block served after its TTL is caught, with its own arithmetic") {
  SUBCASE("at the expiry instant") {
    actors::run_history h;
    kv(h, 0s, k1, kv_act::write);
    kv(h, 60s, k1, kv_act::hit);
    auto r = check_history(h, expectations());
    REQUIRE(r.violations.size() == 1);
    CHECK(r.violations[0].about == "kv");
    CHECK(mentions(r, "after its TTL expired at 60.000000 s"));
  }
  SUBCASE("the agent TTL applies to agent writes") {
    actors::run_history h;
    kv(h, 0s, k1, kv_act::write, tc::agent);
    kv(h, 21s, k1, kv_act::hit);
    CHECK(mentions(check_history(h, expectations()), "class agent"));
  }
  SUBCASE("a refresh of an expired block does not revive it") {
    actors::run_history h;
    kv(h, 0s, k1, kv_act::write);
    kv(h, 61s, k1, kv_act::refresh);
    kv(h, 62s, k1, kv_act::hit);
    CHECK_FALSE(check_history(h, expectations()).ok());
  }
  SUBCASE("a commit does not extend a block already visible") {
    actors::run_history h;
    kv(h, 0s, k1, kv_act::write);
    kv(h, 30s, k1, kv_act::commit);
    kv(h, 70s, k1, kv_act::hit);
    CHECK_FALSE(check_history(h, expectations()).ok());
  }
  SUBCASE("served but never written, or only reserved") {
    actors::run_history h;
    kv(h, 1s, k1, kv_act::hit);
    kv(h, 0s, k2, kv_act::reserve);
    kv(h, 1s, k2, kv_act::hit);
    auto r = check_history(h, expectations());
    CHECK(mentions(r, "never written"));
    CHECK(mentions(r, "reserved but never committed"));
  }
}

TEST_CASE("history_checker: token streams are positions 0..n-1 once each, the device's tokens") {
  SUBCASE("a position delivered twice") {
    actors::run_history h;
    request(h, 7, 4, {0, 1, 1, 2, 3});
    auto r = check_history(h, expectations());
    CHECK(mentions(r, "request 7: history: delivered position 1 again"));
  }
  SUBCASE("a gap") {
    actors::run_history h;
    request(h, 7, 4, {0, 2, 3});
    CHECK(mentions(check_history(h, expectations()), "before position 1 (a gap)"));
  }
  SUBCASE("a completed request short of its output") {
    actors::run_history h;
    request(h, 7, 4, {0, 1, 2});
    CHECK(mentions(check_history(h, expectations()), "positions 0..2 of its 4 output tokens"));
  }
  SUBCASE("beyond the output") {
    actors::run_history h;
    request(h, 7, 2, {0, 1, 2});
    CHECK(mentions(check_history(h, expectations()), "beyond its 2 output tokens"));
  }
  SUBCASE("the right position count, the wrong token (a forward that re-sent one)") {
    actors::run_history h;
    request(h, 7, 3, {0, 1, 2});
    h.tokens[2].token = runtime::modelled_token(7, 500 + 1);
    if (h.tokens[2].token != runtime::modelled_token(7, 500 + 2))
      CHECK(mentions(check_history(h, expectations()), "where the device generates"));
  }
  SUBCASE("a token after the end") {
    actors::run_history h;
    request(h, 7, 2, {0, 1});
    h.tokens[1].at = h.requests.back().at + 1s;
    CHECK(mentions(check_history(h, expectations()), "after it ended"));
  }
}

TEST_CASE("history_checker: requests end exactly once") {
  actors::run_history h;
  request(h, 1, 1, {0});
  h.requests.push_back({t0 + 9s, 1, request_fact::failed, 500, 1, false});
  h.requests.push_back({t0, 2, request_fact::admitted, 500, 1, false});
  h.requests.push_back({t0, 3, request_fact::completed, 500, 1, false});
  auto r = check_history(h, expectations());
  CHECK(mentions(r, "request 1: history: ended twice"));
  CHECK(mentions(r, "request 2: history: admitted but never ended"));
  CHECK(mentions(r, "request 3: history: completed at 0.000000 s without having been admitted"));
  auto e = expectations();
  e.run_finished = false; // stopped at a deadline: an unfinished request is no violation
  CHECK_FALSE(mentions(check_history(h, e), "never ended"));
}

TEST_CASE("history_checker: decode bookings stay within the instance's KV and batch") {
  SUBCASE("KV above capacity") {
    actors::run_history h;
    h.bookings = {{t0, 3, booking_fact::join, 0},
                  {t0, 3, booking_fact::book, 600},
                  {t0 + 1s, 3, booking_fact::book, 401}};
    auto r = check_history(h, expectations());
    CHECK(mentions(r, "decode_lb: history: decode instance 3 booked 1001 KV tokens at 1.000000 s, "
                      "above its capacity of 1000"));
  }
  SUBCASE("requests above the batch") {
    actors::run_history h;
    h.bookings = {{t0, 3, booking_fact::join, 0}};
    for (int i = 0; i < 3; ++i)
      h.bookings.push_back({t0, 3, booking_fact::book, 10});
    CHECK(mentions(check_history(h, expectations()), "held 3 requests"));
  }
  SUBCASE("a booking on an instance outside the routing; a release of nothing; a leak") {
    actors::run_history h;
    h.bookings = {{t0, 1, booking_fact::book, 10},
                  {t0, 2, booking_fact::join, 0},
                  {t0, 2, booking_fact::release, 10},
                  {t0, 2, booking_fact::book, 20}};
    auto r = check_history(h, expectations());
    CHECK(mentions(r, "decode instance 1, which is not in the routing"));
    CHECK(mentions(r, "released at 0.000000 s on decode instance 2, which holds no such booking"));
    CHECK(mentions(r, "KV leaked: decode instance 2 still books 1 requests"));
  }
}

TEST_CASE("history_checker: a failed instance comes back no sooner than the restart time") {
  auto e = expectations();
  e.restart_time = 180s;
  actors::run_history h;
  h.instances = {{t0, "decode/0", true},   {t0 + 10s, "decode/0", false},
                 {t0 + 190s, "decode/0", true}, {t0, "prefill/1", true},
                 {t0 + 5s, "prefill/1", false},  {t0 + 6s, "prefill/1", true}};
  auto r = check_history(h, e);
  REQUIRE(r.violations.size() == 1);
  CHECK(r.violations[0].to_string()
        == "supervisor: history: instance prefill/1 came back at 6.000000 s, 1.000000 s after "
           "it went down; a restart takes 180.000000 s");
}

TEST_CASE("history_checker: one check lists its first violations, then counts the rest") {
  actors::run_history h;
  for (std::uint64_t i = 0; i < shown_per_check + 5; ++i)
    kv(h, 1s, actors::block_key{i, i}, kv_act::hit);
  auto r = check_history(h, expectations());
  CHECK(r.violations.size() == shown_per_check + 1);
  CHECK(mentions(r, "history: 5 more kv violations"));
}

TEST_CASE("history_checker: the TTLs of a topology, with the documented defaults") {
  auto t = ttl_of_classes({{"agent", 5s}, {"other", 1s}});
  CHECK(t.at(tc::agent) == 5s);
  CHECK(t.at(tc::chatbot) == std::chrono::hours{24 * 7});
  CHECK(t.at(tc::batch) == std::chrono::hours{24});
}

TEST_CASE("history_checker: swarm seeds record a history that checks clean") {
  auto topo = load_topology(std::string{TROUPE_SOURCE_DIR} + "/examples/topologies/small.toml");
  REQUIRE(topo.ok());
  // Seeds whose draw has short TTLs and tight decode limits, so every check has facts to read.
  int short_ttl = 0, tight = 0;
  for (std::uint64_t seed = 0; seed < 40 && (short_ttl == 0 || tight == 0); ++seed) {
    auto c = draw_swarm_case(*topo.value, seed);
    CHECK(c.options.check_history);
    bool s = !c.options.params.kv_ttl.empty(), d = c.options.params.decode_kv_tokens > 0;
    if (!(s && short_ttl == 0) && !(d && tight == 0))
      continue;
    short_ttl += s ? 1 : 0;
    tight += d ? 1 : 0;
    auto out = run_simulation(*topo.value, c.records, c.options);
    REQUIRE(out.ok());
    INFO("seed " << seed);
    CHECK(out->invariants.ok());
    auto& hist = out->report["invariants"]["history"];
    CHECK(hist["facts"]["tokens"].get<std::uint64_t>() > 0);
    CHECK(hist["facts"]["bookings"].get<std::uint64_t>() > 0);
    CHECK(hist["facts"]["kv"].get<std::uint64_t>() > 0);
    CHECK(hist["violations"] == 0);
  }
  CHECK(short_ttl > 0);
  CHECK(tight > 0);
}

TEST_CASE("check_autoscaler: a scale-down waits scale_down_after of decisions wanting fewer") {
  actors::scale_limits l;
  l.max_step_up = 1;
  l.max_step_down = 1;
  l.occupancy_limit = 0.8;
  l.quota = 100;
  l.scale_down_after = 30s;
  runtime::time_point origin{};
  auto decision = [&](runtime::duration at, std::uint32_t desired, std::uint32_t down) {
    actors::scale_record r;
    r.at = origin + at;
    actors::scale_pool_input in;
    in.pool = "decode";
    in.min = 1;
    in.max = 3;
    in.online = 2;
    r.inputs.pools.push_back(in);
    actors::scale_pool_decision d;
    d.pool = "decode";
    d.desired = desired;
    d.current = 2;
    d.down = down;
    d.target = 2 - down;
    r.decision.pools.push_back(d);
    r.decision.occupancy = 0.5;
    return r;
  };
  actors::autoscaler_log log;
  // Wanted fewer at 10 s, not at 20 s, again from 30 s: the scale-down at 50 s is early.
  log.decisions = {decision(10s, 1, 0), decision(20s, 2, 0), decision(30s, 1, 0),
                   decision(50s, 1, 1)};
  log.events.push_back({origin + 50s, "decode", 0, "leaving", ""});
  auto early = check_autoscaler(log, l, origin);
  REQUIRE(early.size() == 1);
  CHECK(early[0].to_string()
        == "autoscaler: at 50.000 s, pool decode: scaled down after wanting fewer instances for "
           "20.000 s, before scale_down_after 30.000 s");
  log.decisions[3].at = origin + 60s;
  log.events.back().at = origin + 60s;
  CHECK(check_autoscaler(log, l, origin).empty());
}
