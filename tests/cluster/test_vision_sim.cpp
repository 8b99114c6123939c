// The simulated cluster with multimodal chat traffic: images go through the vision tier of the
// topology, and decode persists the blocks it fills.
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/workload.hpp"
#include "cluster/topology.hpp"
#include "runtime/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::sim;

namespace {

const std::string root = TROUPE_SOURCE_DIR;

topology small_topology() {
  auto t = load_topology(root + "/examples/topologies/small.toml");
  REQUIRE(t.ok());
  return *t.value;
}

std::vector<request_record> chat_with_images() {
  chat_params p;
  p.rate = 2;
  p.duration = std::chrono::seconds(30);
  p.image_chance = 0.5;
  auto w = generate_chat(p, runtime::rng{5}.split("workload"));
  REQUIRE(w.ok());
  return w.records;
}

std::uint64_t with_images(const std::vector<request_record>& records) {
  return static_cast<std::uint64_t>(std::count_if(
    records.begin(), records.end(), [](const request_record& r) { return r.images > 0; }));
}

} // namespace

TEST_CASE("a chat workload with images completes on a topology with a vision pool") {
  auto records = chat_with_images();
  auto images = with_images(records);
  REQUIRE(images > 0);
  REQUIRE(images < records.size());
  sim_options o;
  o.seed = 1;
  auto r = run_simulation(small_topology(), records, o);
  REQUIRE(r.ok());
  auto& report = r->report;
  CHECK(r->finished);
  CHECK(report["requests"]["completed"] == records.size());
  CHECK(report["requests"]["failed"] == 0);
  auto& vision = report["lb"]["vision"];
  CHECK(vision["routed"] == images);
  CHECK(vision["released"] == images);
  CHECK(vision["instances"] == 1);
  CHECK(vision["outstanding_tokens"] == 0);
  CHECK(report["kv"]["persisted_blocks"].get<std::uint64_t>() > 0);
  CHECK(report["gpus"]["total"] == 33);
}

TEST_CASE("without a vision pool, requests with images fail with an explicit reason") {
  auto topo = small_topology();
  std::erase_if(topo.pools, [](const pool_spec& p) { return p.role == pool_role::vision; });
  auto records = chat_with_images();
  auto images = with_images(records);
  sim_options o;
  o.seed = 1;
  auto r = run_simulation(topo, records, o);
  REQUIRE(r.ok());
  auto& q = r->report["requests"];
  CHECK(q["failed"] == images);
  CHECK(q["completed"] == records.size() - images);
  CHECK(q["failures"]["vision routing: no vision tier"] == images);
  CHECK(!r->report["lb"].contains("vision"));
}
