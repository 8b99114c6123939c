// Tests of cluster/sim/swarm: seeded fault plans and workloads, the verdict, the planted bug.
#include "cluster/sim/sim_command.hpp"
#include "cluster/sim/swarm.hpp"

#include <doctest/doctest.h>

#include <map>
#include <sstream>
#include <string>
#include <thread>

using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::sim;

namespace {

const std::string small = std::string{TROUPE_SOURCE_DIR} + "/examples/topologies/small.toml";

topology load_small() {
  auto t = load_topology(small);
  REQUIRE(t.ok());
  return *t.value;
}

// The first seed from `from` whose planted-bug run fails (a request was rerouted).
std::uint64_t first_caught_seed(const topology& topo, std::uint64_t from) {
  for (std::uint64_t s = from; s < from + 60; ++s)
    if (!run_swarm_seed(topo, s, true).passed())
      return s;
  FAIL("no seed in 60 rerouted a request");
  return 0;
}

} // namespace

TEST_CASE("a swarm seed draws the same workload and plan every time, another seed another") {
  auto topo = load_small();
  for (std::uint64_t seed : {0u, 1u, 7u, 123456u}) {
    CAPTURE(seed);
    auto a = draw_swarm_case(topo, seed);
    auto b = draw_swarm_case(topo, seed);
    CHECK(a.records == b.records);
    CHECK(to_json(a.options.faults) == to_json(b.options.faults));
    CHECK(a.drawn == b.drawn);
    CHECK(a.options.seed == seed);
    CHECK_FALSE(a.records.empty());
    CHECK_FALSE(a.options.params.test_drop_on_reroute);
  }
  CHECK(draw_swarm_case(topo, 1).records != draw_swarm_case(topo, 2).records);
}

TEST_CASE("swarm plans draw only injectable kinds, on targets that exist, and vary") {
  auto topo = load_small();
  std::size_t faults = 0, drains = 0, gpus = 0, instances = 0, empty = 0, slows = 0, shards = 0,
              pools = 0, blips = 0, prefill_drains = 0, links = 0, surges = 0, store_slows = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    auto c = draw_swarm_case(topo, seed);
    empty += c.options.faults.empty() ? 1 : 0;
    runtime::duration last{0};
    for (auto& f : c.options.faults) {
      ++faults;
      CHECK(f.at >= last); // ordered by time
      last = f.at;
      if (f.kind == fault_kind::surge) { // no target: the whole workload
        ++surges;
        CHECK(f.factor > 1);
        REQUIRE(f.duration);
        CHECK(*f.duration > runtime::duration{0});
        continue;
      }
      if (f.kind == fault_kind::store_fail) {
        ++shards;
        CHECK(f.target.kind == target_kind::shard);
        CHECK(f.target.shard < c.options.params.kv_shards);
        continue;
      }
      if (f.kind == fault_kind::store_slow) {
        ++store_slows;
        CHECK(f.target.kind == target_kind::shard);
        CHECK(f.target.shard < c.options.params.kv_shards);
        CHECK(f.factor > 1);
        CHECK(f.factor <= 1000);
        REQUIRE(f.duration);
        CHECK(*f.duration > runtime::duration{0});
        continue;
      }
      if (f.target.kind == target_kind::link) {
        ++links;
        CHECK((f.kind == fault_kind::partition || f.kind == fault_kind::slow));
        REQUIRE(f.duration);
        CHECK(f.target.peer.instance);
        continue;
      }
      if (f.target.kind == target_kind::pool) {
        ++pools;
        CHECK(f.kind == fault_kind::fail);
        continue;
      }
      REQUIRE(f.target.place.instance);
      const pool_spec* pool = nullptr;
      for (auto& p : topo.pools)
        if (p.name == f.target.place.pool)
          pool = &p;
      REQUIRE(pool != nullptr);
      CHECK(*f.target.place.instance < pool->instances.initial);
      if (f.kind == fault_kind::drain) {
        ++(pool->role == pool_role::decode ? drains : prefill_drains);
        CHECK(pool->role != pool_role::vision);
        CHECK(f.target.kind == target_kind::instance);
        if (pool->role == pool_role::decode)
          CHECK(f.grace > runtime::duration{0});
      } else if (f.kind == fault_kind::slow) {
        ++slows;
        CHECK(f.factor > 1);
        REQUIRE(f.duration);
        if (f.target.kind == target_kind::gpu)
          CHECK(*f.target.place.rank < pool->gpus_per_instance);
      } else {
        REQUIRE(f.kind == fault_kind::fail);
        if (f.target.kind == target_kind::gpu) {
          ++(f.duration ? blips : gpus);
          REQUIRE(f.target.place.rank);
          CHECK(*f.target.place.rank < pool->gpus_per_instance);
        } else {
          ++instances;
          CHECK(f.target.kind == target_kind::instance);
        }
      }
    }
  }
  CHECK(faults > 200);
  CHECK(drains > 0);
  CHECK(gpus > 0);
  CHECK(instances > 0);
  CHECK(surges > 0);
  CHECK(slows > 0);
  CHECK(shards > 0);
  CHECK(pools > 0);
  CHECK(blips > 0);
  CHECK(prefill_drains > 0);
  CHECK(links > 0);
  CHECK(store_slows > 0);
  CHECK(empty > 0); // some seeds run fault-free
}

TEST_CASE("a swarm seed gives the same report on parallel threads as alone") {
  auto topo = load_small();
  std::vector<std::string> alone, parallel(4);
  for (std::uint64_t s = 0; s < 4; ++s) {
    auto c = draw_swarm_case(topo, s);
    auto out = run_simulation(topo, c.records, c.options);
    REQUIRE(out.ok());
    alone.push_back(out->report.dump());
  }
  std::vector<std::thread> threads;
  for (std::uint64_t s = 0; s < 4; ++s)
    threads.emplace_back([&, s] {
      auto c = draw_swarm_case(topo, s);
      auto out = run_simulation(topo, c.records, c.options);
      parallel[s] = out.ok() ? out->report.dump() : out.error();
    });
  for (auto& t : threads)
    t.join();
  for (std::uint64_t s = 0; s < 4; ++s) {
    CAPTURE(s);
    CHECK(alone[s] == parallel[s]);
  }
}

TEST_CASE("seed ranges parse") {
  std::uint64_t a = 0, b = 0;
  std::string e;
  CHECK(parse_seed_range("3..17", a, b, e));
  CHECK(a == 3);
  CHECK(b == 17);
  CHECK(parse_seed_range("5", a, b, e));
  CHECK(a == 5);
  CHECK(b == 5);
  CHECK_FALSE(parse_seed_range("9..2", a, b, e));
  CHECK_FALSE(parse_seed_range("x..2", a, b, e));
  CHECK_FALSE(parse_seed_range("1..", a, b, e));
}

TEST_CASE("the planted bug is caught by the checker and the swarm, and its seed replays it") {
  auto topo = load_small();
  auto seed = first_caught_seed(topo, 0);
  CAPTURE(seed);

  // Without the bug the same seed passes; with it, the checker names the dropped requests.
  CHECK(run_swarm_seed(topo, seed, false).passed());
  auto c = draw_swarm_case(topo, seed, true);
  auto out = run_simulation(topo, c.records, c.options);
  REQUIRE(out.ok());
  REQUIRE_FALSE(out->invariants.ok());
  auto problems = swarm_problems(out);
  CHECK(problems.front().find("completed") != std::string::npos);

  // The swarm over a range holding the seed reports it with its replay command.
  swarm_command_options so;
  so.topology = small;
  so.seeds = std::to_string(seed) + ".." + std::to_string(seed + 1);
  so.jobs = 2;
  so.plant_bug = true;
  so.quiet = true;
  std::ostringstream sout, serr;
  CHECK(run_swarm_command(so, sout, serr) == 2);
  auto replay = "troupe sim " + small + " --swarm-seed " + std::to_string(seed) + " --plant-bug";
  CHECK(sout.str().find(" failed") != std::string::npos);
  CHECK(sout.str().find(replay) != std::string::npos);

  // The replay (what that command runs) reproduces the same violations exactly, twice.
  for (int i = 0; i < 2; ++i) {
    sim_command_options r;
    r.topology = small;
    r.swarm_seed = seed;
    r.plant_bug = true;
    r.quiet = true;
    std::ostringstream rout, rerr;
    CHECK(run_sim_command(r, rout, rerr) == 2);
    for (auto& p : problems)
      CHECK(rerr.str().find(p + "\n") != std::string::npos);
  }
}

TEST_CASE("a clean swarm over a few seeds passes") {
  swarm_command_options so;
  so.topology = small;
  so.seeds = "0..5";
  so.jobs = 2;
  so.quiet = true;
  std::ostringstream out, err;
  CHECK(run_swarm_command(so, out, err) == 0);
  CHECK(out.str().rfind("6 passed, 0 failed", 0) == 0);
}

TEST_CASE("swarm coverage counts the paths a run took, from its report") {
  auto report = nlohmann::json::parse(R"({
    "requests": {"forwards": 3, "reroutes": 0, "failed": 2, "total": 9},
    "lb": {"decode": {"spilled": 5}},
    "kv": {"store": {"expirations": 7, "evictions": 0}},
    "timeline": [{"kind": "fail"}, {"kind": "restart"}, {"kind": "ep_resize"}, {"kind": "fail"}]})");
  auto c = swarm_coverage(report);
  const std::map<std::string, std::uint64_t> want{
    {"forwards", 3},      {"failed requests", 2}, {"decode spills", 5},         {"KV expirations", 7},
    {"timeline fail", 2}, {"timeline restart", 1}, {"timeline ep_resize", 1}};
  CHECK(c == want); // paths not taken (reroutes 0, evictions 0) are absent
  CHECK(swarm_coverage(nlohmann::json::object()).empty());
}

TEST_CASE("the swarm prints which paths its seeds took, the same for every --jobs") {
  swarm_command_options so;
  so.topology = small;
  so.seeds = "0..9";
  so.quiet = true;
  std::ostringstream one, two, err;
  so.jobs = 1;
  CHECK(run_swarm_command(so, one, err) == 0);
  so.jobs = 2;
  CHECK(run_swarm_command(so, two, err) == 0);
  CHECK(one.str() == two.str());
  auto at = one.str().find("coverage (seeds that took each path, of 10; times in all):\n");
  REQUIRE(at != std::string::npos);
  // Ten seeds with faults drawn: some GPU failed and some request was rerouted.
  CHECK(one.str().find("  timeline fail ", at) != std::string::npos);
  CHECK(one.str().find("  reroutes ", at) != std::string::npos);
}
