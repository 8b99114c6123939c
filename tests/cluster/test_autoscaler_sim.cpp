// The autoscaler in the simulated cluster and the `surge` fault: a surge makes the pools grow
// (from the ready inventory first, refilled later) and shrink again afterwards (decode through
// drain, prefill after finishing its work), with nothing lost and every autoscaler invariant
// held; the surge clock itself; the autoscaler invariant checker on planted bad logs; the
// [autoscaler] keys the simulation reads.
#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/invariants.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/surge.hpp"
#include "cluster/sim/workload.hpp"
#include "cluster/topology.hpp"
#include "runtime/random.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>

using namespace troupe::cluster;
using namespace troupe::cluster::sim;
namespace runtime = troupe::runtime;
namespace actors = troupe::actors;
using namespace std::chrono_literals;

namespace {

const std::string root = TROUPE_SOURCE_DIR;

fault surge(runtime::duration at, double factor, runtime::duration duration) {
  fault f;
  f.at = at;
  f.kind = fault_kind::surge;
  f.factor = factor;
  f.duration = duration;
  return f;
}

topology small_autoscale() {
  auto t = load_topology(root + "/examples/topologies/small-autoscale.toml");
  REQUIRE(t.ok());
  return *t.value;
}

std::vector<request_record> chat(double rate, runtime::duration duration) {
  chat_params c;
  c.rate = rate;
  c.duration = duration;
  auto w = generate_chat(c, runtime::rng{7}.split("workload"));
  REQUIRE(w.ok());
  return std::move(w.records);
}

double seconds(runtime::duration d) {
  return runtime::to_seconds(d);
}

} // namespace

TEST_CASE("a surge runs the workload's clock factor times faster while it lasts") {
  surge_clock none{{}, 0s};
  CHECK(none.empty());
  CHECK(none.arrival(123s) == 123s);

  // x4 from 60 s for 30 s: the 120 s of workload after 60 s arrive within 30 s.
  surge_clock s{{surge(60s, 4, 30s)}, 0s};
  CHECK(s.arrival(10s) == 10s);
  CHECK(s.arrival(60s) == 60s);
  CHECK(seconds(s.arrival(100s)) == doctest::Approx(70));  // 60 + 40 / 4
  CHECK(seconds(s.arrival(180s)) == doctest::Approx(90));  // the end of the surge
  CHECK(seconds(s.arrival(200s)) == doctest::Approx(110)); // back to x1, 90 s earlier

  // Overlapping surges multiply: x2 in [0, 20) and x3 in [10, 30).
  surge_clock o{{surge(0s, 2, 20s), surge(10s, 3, 20s)}, 0s};
  CHECK(seconds(o.arrival(20s)) == doctest::Approx(10));  // 10 s at x2
  CHECK(seconds(o.arrival(80s)) == doctest::Approx(20));  // then 10 s at x6
  CHECK(seconds(o.arrival(110s)) == doctest::Approx(30)); // then 10 s at x3
  CHECK(seconds(o.arrival(120s)) == doctest::Approx(40)); // then x1

  // Other kinds are not surges; times count from the workload's start (offset).
  fault drain;
  drain.kind = fault_kind::drain;
  surge_clock later{{drain, surge(70s, 2, 10s)}, 10s};
  CHECK(seconds(later.arrival(80s)) == doctest::Approx(70)); // 60 + 20 / 2
}

TEST_CASE("a surge run: same requests, earlier, reported as injected") {
  auto topo = small_autoscale();
  topo.autoscaler.enabled = false;
  auto records = chat(2, 4min);
  sim_options plain;
  plain.seed = 3;
  auto base = run_simulation(topo, records, plain);
  REQUIRE(base.ok());
  auto o = plain;
  o.faults = {surge(60s, 3, 40s)};
  auto surged = run_simulation(topo, records, o);
  REQUIRE(surged.ok());
  CHECK(surged->report["requests"]["completed"] == base->report["requests"]["completed"]);
  CHECK(surged->report["requests"]["completed"] == records.size());
  CHECK(surged->report["sim"]["virtual_s"].get<double>()
        < base->report["sim"]["virtual_s"].get<double>() - 60);
  CHECK(surged->report["faults"]["injected"] == true);
  CHECK(surged->report["faults"]["timeline"][0]["injected"] == true);
  CHECK(surged->report["faults"]["not_injected_yet"].empty());
  CHECK(surged->invariants.ok());
  // Without the autoscaler the report has no autoscaler section.
  CHECK_FALSE(base->report.contains("autoscaler"));
}

TEST_CASE("the autoscaler grows the pools for a surge and shrinks them after, losing nothing") {
  auto topo = small_autoscale();
  // A short grace: the decode instances the autoscaler drains still hold requests when it
  // ends, so they are forwarded with their KV.
  for (auto& p : topo.pools)
    if (p.role == pool_role::decode)
      p.grace = 500ms;
  auto records = chat(4, 8min);
  sim_options o;
  o.seed = 1;
  o.faults = {surge(1min, 5, 1min)};
  auto out = run_simulation(topo, records, o);
  REQUIRE(out.ok());
  auto& r = out->report;
  CHECK(out->finished);
  CHECK(r["requests"]["completed"] == records.size());
  CHECK(r["requests"]["failed"] == 0);
  // Nothing was restarted from scratch: prefill left after its work, decode through drain.
  CHECK(r["requests"]["rerouted"] == 0);
  CHECK(r["requests"]["forwarded"].get<std::uint64_t>() > 0);
  CHECK(out->invariants.ok());
  CHECK(r["invariants"]["violations"].empty());

  REQUIRE(r.contains("autoscaler"));
  auto& a = r["autoscaler"];
  REQUIRE(a["decisions"].size() > 10);
  // Decode grew beyond its initial 2 during the surge, and came back down afterwards.
  std::uint64_t peak = 0, last = 0;
  for (auto& d : a["decisions"]) {
    auto t = d["pools"]["decode"]["target"].get<std::uint64_t>();
    peak = std::max(peak, t);
    last = t;
    CHECK(t <= 4);
    CHECK(t >= 1);
  }
  CHECK(peak == 4);
  CHECK(last < peak);

  // Events: growth from the inventory (joining within the join delay), the inventory
  // refilled later; decode instances left through drain (removed with their requests
  // forwarded), a prefill instance left after finishing.
  std::map<std::string, int> kinds;
  double first_refill = -1, first_ready = -1;
  bool decode_removed_with_forwards = false, prefill_removed = false;
  std::map<std::uint64_t, double> ordered_from_inventory;
  for (auto& e : a["events"]) {
    auto kind = e["kind"].get<std::string>();
    ++kinds[kind];
    auto t = e["t_s"].get<double>();
    if (kind == "refill" && first_refill < 0)
      first_refill = t;
    if (kind == "ready" && first_ready < 0)
      first_ready = t;
    if (kind == "ordered" && e["detail"] == "inventory")
      ordered_from_inventory[e["instance"].get<std::uint64_t>() * 10
                             + (e["pool"] == "decode" ? 1 : 0)] = t;
    if (kind == "joined") {
      auto key = e["instance"].get<std::uint64_t>() * 10 + (e["pool"] == "decode" ? 1 : 0);
      if (auto i = ordered_from_inventory.find(key); i != ordered_from_inventory.end())
        CHECK(t - i->second == doctest::Approx(seconds(topo.autoscaler.inventory_join)));
    }
    if (kind == "removed" && e["pool"] == "decode" && e.contains("detail"))
      decode_removed_with_forwards |= e["detail"].get<std::string>() != "0 forwarded";
    if (kind == "removed" && e["pool"] == "prefill")
      prefill_removed = true;
  }
  CHECK(ordered_from_inventory.size() >= 2);
  CHECK(kinds["joined"] >= 3);
  CHECK(first_refill >= 0);
  CHECK(first_ready - first_refill == doctest::Approx(seconds(topo.autoscaler.inventory_refill)));
  CHECK(kinds["leaving"] >= 3);
  CHECK(decode_removed_with_forwards);
  CHECK(prefill_removed);

  // The same run again is byte-identical.
  auto again = run_simulation(topo, records, o);
  REQUIRE(again.ok());
  CHECK(again->report.dump() == r.dump());
}

TEST_CASE("a decode instance that stays down is replaced from the inventory and retired") {
  // decode/0 has one GPU: once it fails the instance can never re-form (it stays down). The
  // autoscaler must see the lost capacity (not count it as starting), order a replacement
  // from the ready inventory, and retire the down instance so it never comes back on top.
  auto topo = small_autoscale();
  for (auto& p : topo.pools)
    if (p.role == pool_role::decode)
      p.instances.min = 2; // two wanted whatever the demand: one lost must be replaced
  auto records = chat(2, 5min);
  auto plan = parse_fault_plan("[[fault]]\nat = \"60s\"\nkind = \"fail\"\n"
                               "gpu = \"decode/0/0\"\n"
                               "[[fault]]\nat = \"144s\"\nkind = \"drain\"\n"
                               "instance = \"decode/1\"\ngrace = \"20s\"\n",
                               "plan.toml", topo);
  for (auto& d : plan.errors)
    MESSAGE(d.message);
  REQUIRE(plan.ok());
  sim_options o;
  o.seed = 1;
  o.faults = expand(*plan.value, runtime::rng{1}.split("faults"), 5min);
  auto out = run_simulation(topo, records, o);
  REQUIRE(out.ok());
  auto& r = out->report;
  CHECK(out->finished);
  CHECK(r["requests"]["completed"] == records.size());
  CHECK(r["requests"]["failed"] == 0);
  CHECK(out->invariants.ok());
  CHECK(r["invariants"]["violations"].empty());

  // The first decision after the failure counts decode/0 as down, not starting, and orders
  // one instance from the inventory.
  double first_down = -1;
  bool drained_counted_leaving = false;
  for (auto& d : r["autoscaler"]["decisions"]) {
    auto& dp = d["pools"]["decode"];
    auto t = d["t_s"].get<double>();
    if (dp["instances_down"] == 1 && first_down < 0) {
      first_down = t;
      CHECK(dp["online"] == 1);
      CHECK(dp["starting"] == 0);
      CHECK(dp["up"] == 1);
      CHECK(dp["from_inventory"] == 1);
    }
    // The fault injector's drain of decode/1 (grace 20 s): leaving, not starting, at the
    // first decision after the notice.
    if (t > 144 && t < 164 && !drained_counted_leaving) {
      CHECK(dp["draining"] == 1);
      CHECK(dp["starting"] == 0);
      drained_counted_leaving = true;
    }
  }
  REQUIRE(first_down >= 60);
  CHECK(first_down <= 70);
  CHECK(drained_counted_leaving);

  double ordered = -1, retired = -1, joined = -1;
  for (auto& e : r["autoscaler"]["events"]) {
    if (e["pool"] != "decode")
      continue;
    auto t = e["t_s"].get<double>();
    if (e["kind"] == "ordered" && ordered < 0) {
      ordered = t;
      CHECK(e["detail"] == "inventory");
      CHECK(e["instance"] == 2);
    }
    if (e["kind"] == "retired") {
      CHECK(retired < 0); // once
      retired = t;
      CHECK(e["instance"] == 0);
      CHECK(e["detail"] == "down; replaced by 2");
    }
    if (e["kind"] == "joined" && e["instance"] == 2)
      joined = t;
  }
  CHECK(ordered == first_down);
  CHECK(retired == doctest::Approx(first_down));
  CHECK(joined - ordered == doctest::Approx(seconds(topo.autoscaler.inventory_join)));
  // Retired before its restart fell due: no restart and no stays_down on the timeline.
  for (auto& e : r["timeline"])
    if (e["target"] == "decode/0") {
      CHECK(e["kind"] != "restart");
      CHECK(e["kind"] != "stays_down");
    }
}

TEST_CASE("a planted autoscaler bug fails the run's invariants") {
  // The test-only switch makes every scale-up order one instance more than decided.
  auto topo = small_autoscale();
  auto records = chat(4, 8min);
  sim_options o;
  o.seed = 1;
  o.faults = {surge(1min, 5, 1min)};
  o.params.test_autoscaler_order_one_more = true;
  auto out = run_simulation(topo, records, o);
  REQUIRE(out.ok());
  REQUIRE_FALSE(out->invariants.ok());
  bool mismatch = false;
  for (auto& v : out->invariants.violations) {
    CHECK(v.about == "autoscaler");
    mismatch |= v.what.find("but ordered 2 and told 0 to leave") != std::string::npos;
  }
  CHECK(mismatch);
  CHECK(out->report["invariants"]["violations"][0]["about"] == "autoscaler");
}

TEST_CASE("the autoscaler invariants catch a decision out of bounds, over a step or above 0.8") {
  actors::scale_limits l;
  l.max_step_up = 1;
  l.max_step_down = 1;
  l.occupancy_limit = 0.8;
  l.quota = 100;
  runtime::time_point origin{};
  auto record = [&](double occupancy, std::uint32_t online, std::uint32_t up,
                    std::uint32_t down) {
    actors::scale_record r;
    r.at = origin + 10s;
    actors::scale_pool_input in;
    in.pool = "decode";
    in.min = 1;
    in.max = 3;
    in.online = online;
    r.inputs.pools.push_back(in);
    actors::scale_pool_decision d;
    d.pool = "decode";
    d.current = online;
    d.up = up;
    d.down = down;
    d.target = online + up - down;
    r.decision.pools.push_back(d);
    r.decision.occupancy = occupancy;
    return r;
  };
  auto acted = [&](actors::autoscaler_log& log, std::uint32_t up, std::uint32_t down) {
    for (std::uint32_t i = 0; i < up; ++i)
      log.events.push_back({origin + 10s, "decode", i, "ordered", "quota"});
    for (std::uint32_t i = 0; i < down; ++i)
      log.events.push_back({origin + 10s, "decode", i, "leaving", ""});
  };
  auto check = [&](actors::scale_record r, std::uint32_t up, std::uint32_t down) {
    actors::autoscaler_log log;
    log.decisions.push_back(std::move(r));
    acted(log, up, down);
    return check_autoscaler(log, l, origin);
  };
  CHECK(check(record(0.5, 2, 1, 0), 1, 0).empty());
  CHECK(check(record(0.5, 2, 0, 1), 0, 1).empty());

  auto v = check(record(0.5, 1, 2, 0), 2, 0);
  REQUIRE(v.size() == 1);
  CHECK(v[0].about == "autoscaler");
  CHECK(v[0].to_string() == "autoscaler: at 10.000 s, pool decode: added 2 instances, above "
                            "max_step_up 1");
  v = check(record(0.85, 2, 0, 1), 0, 1);
  REQUIRE(v.size() == 1);
  CHECK(v[0].what.find("scaled down at occupancy 0.85 above the limit 0.8") != std::string::npos);
  v = check(record(0.5, 3, 1, 0), 1, 0);
  REQUIRE(v.size() == 1);
  CHECK(v[0].what.find("target 4 above max 3") != std::string::npos);
  v = check(record(0.5, 1, 0, 1), 0, 1);
  REQUIRE(v.size() == 1);
  CHECK(v[0].what.find("scaled down to 0, below min 1") != std::string::npos);
  // The actor doing something else than it decided.
  v = check(record(0.5, 2, 1, 0), 0, 1);
  REQUIRE(v.size() == 1);
  CHECK(v[0].what.find("decided +1 / -0 but ordered 0 and told 1 to leave") != std::string::npos);
  // In the report's JSON an autoscaler violation names what it is about.
  invariant_report rep;
  rep.violations = v;
  CHECK(rep.to_json()["violations"][0]["about"] == "autoscaler");
}

TEST_CASE("[autoscaler] enabled and the inventory delays are read strictly") {
  auto base = std::string{"[cluster]\nname = \"x\"\nmodel = \"deepseek-v4.1-flash\"\n"
                          "hardware = \"H200\"\n[storage]\ncapacity = \"1TB\"\n"
                          "[[pool]]\nname = \"p\"\nrole = \"prefill\"\ninstances = 1\n"
                          "gpus_per_instance = 8\n[[pool]]\nname = \"d\"\nrole = \"decode\"\n"
                          "instances = 1\ngpus_per_instance = 8\n"};
  auto t = parse_topology(base, "a.toml");
  REQUIRE(t.ok());
  CHECK_FALSE(t.value->autoscaler.enabled);
  CHECK(t.value->autoscaler.inventory_join == 10s);
  CHECK(t.value->autoscaler.inventory_refill == 5min);
  t = parse_topology(base + "[autoscaler]\nenabled = true\ninventory_join = \"5s\"\n"
                            "inventory_refill = \"3min\"\n",
                     "b.toml");
  REQUIRE(t.ok());
  CHECK(t.value->autoscaler.enabled);
  CHECK(t.value->autoscaler.inventory_join == 5s);
  CHECK(t.value->autoscaler.inventory_refill == 3min);
  t = parse_topology(base + "[autoscaler]\nenabled = \"true\"\n", "c.toml");
  REQUIRE_FALSE(t.ok());
  CHECK(t.errors[0].path == "autoscaler.enabled");
  CHECK(t.errors[0].hint.find("without quotes") != std::string::npos);
  t = parse_topology(base + "[autoscaler]\ninventory_refill = \"0s\"\n", "d.toml");
  REQUIRE_FALSE(t.ok());
  CHECK(t.errors[0].path == "autoscaler.inventory_refill");
}
