// Fault kinds beyond a plain instance failure, each alone on a shipped topology replaying the
// start of the Mooncake trace: EP resize on restart (and staying down), gpu recovery, a pool
// failure, slowdowns, KV store shard failures. Every run must lose nothing.
#include "cluster/sim/expert_placement.hpp"
#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/trace.hpp"
#include "cluster/sim/workload.hpp"
#include "cluster/topology.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <numeric>
#include <tuple>
#include <string>

using namespace troupe::cluster;
using namespace troupe::cluster::sim;
namespace runtime = troupe::runtime;

namespace {

const std::string root = TROUPE_SOURCE_DIR;

struct faulty_run {
  topology topo;
  std::vector<request_record> records;
  runtime::duration horizon{0};

  /// A seeded chat workload at `rate` requests/s for `duration` (busier than the trace's
  /// start: faults catch requests in flight).
  faulty_run(double rate, runtime::duration duration) {
    auto t = load_topology(root + "/examples/topologies/small.toml");
    REQUIRE(t.ok());
    topo = *t.value;
    chat_params cp;
    cp.rate = rate;
    cp.duration = duration;
    records = generate_chat(cp, runtime::rng{7}).records;
    for (auto& r : records)
      horizon = std::max(horizon, r.arrival);
  }

  faulty_run(std::size_t n, double speedup) {
    auto t = load_topology(root + "/examples/topologies/small.toml");
    REQUIRE(t.ok());
    topo = *t.value;
    load_options lo;
    lo.max_records = n;
    lo.speedup = speedup;
    auto loaded =
      load_mooncake(root + "/examples/traces/mooncake_fast25_conversation_trace.jsonl", lo);
    REQUIRE(loaded.ok);
    records = std::move(loaded.records);
    for (auto& r : records)
      horizon = std::max(horizon, r.arrival);
  }

  pool_spec& decode() {
    for (auto& p : topo.pools)
      if (p.role == pool_role::decode)
        return p;
    FAIL("no decode pool");
    return topo.pools.front();
  }

  sim_outcome run(const std::string& plan_text) const {
    sim_options o;
    o.seed = 1;
    if (!plan_text.empty()) {
      auto plan = parse_fault_plan(plan_text, "plan.toml", topo);
      for (auto& d : plan.errors)
        MESSAGE(d.message);
      REQUIRE(plan.ok());
      o.faults = expand(*plan.value, runtime::rng{1}.split("faults"), horizon);
    }
    auto r = run_simulation(topo, records, o);
    REQUIRE(r.ok());
    return *r;
  }
};

/// Every request completed, none failed, the invariant checker clean.
void nothing_lost(const sim_outcome& out, std::size_t n) {
  CHECK(out.finished);
  CHECK(out.report["requests"]["completed"] == n);
  CHECK(out.report["requests"]["failed"] == 0);
  CHECK(out.invariants.ok());
  CHECK(out.report["invariants"]["violations"].empty());
}

/// The timeline events of `kind` on `target`.
std::vector<nlohmann::json> events(const sim_outcome& out, const std::string& kind,
                                   const std::string& target) {
  std::vector<nlohmann::json> found;
  for (auto& e : out.report["timeline"])
    if (e["kind"] == kind && e["target"] == target)
      found.push_back(e);
  return found;
}

} // namespace

TEST_CASE("resized_ep: the healthy GPUs rounded down to a valid EP size, or 0") {
  const std::uint32_t experts = 384; // DeepSeek-V4.1-Flash
  CHECK(resized_ep(128, 128, experts) == 128);
  CHECK(resized_ep(128, 127, experts) == 120); // multiples of 8
  CHECK(resized_ep(128, 120, experts) == 120);
  CHECK(resized_ep(128, 119, experts) == 112);
  CHECK(resized_ep(128, 64, experts) == 64);   // half the configured size: still allowed
  CHECK(resized_ep(128, 63, experts) == 0);    // below half: stays down
  CHECK(resized_ep(16, 15, experts) == 8);
  CHECK(resized_ep(16, 7, experts) == 0);
  CHECK(resized_ep(8, 7, experts) == 4);       // unit n / 2 for small instances
  CHECK(resized_ep(2, 1, experts) == 1);
  CHECK(resized_ep(1, 0, experts) == 0);
  CHECK(resized_ep(1, 1, experts) == 1);
  CHECK(resized_ep(128, 200, experts) == 128); // never above the configured size
  CHECK(resized_ep(128, 128, 100) == 96);      // never more ranks than experts
  CHECK(resized_ep(0, 5, experts) == 0);
}

TEST_CASE("balanced_placement: every expert placed once, ranks differ by at most one") {
  for (std::uint32_t ranks : {1u, 7u, 8u, 120u, 128u, 384u, 500u}) {
    CAPTURE(ranks);
    auto p = balanced_placement(384, ranks);
    REQUIRE(p.size() == ranks);
    CHECK(std::accumulate(p.begin(), p.end(), 0u) == 384);
    auto [lo, hi] = std::minmax_element(p.begin(), p.end());
    CHECK(*hi - *lo <= 1);
    CHECK(*hi == max_experts_per_rank(384, ranks));
    CHECK(std::is_sorted(p.rbegin(), p.rend())); // the extra experts on the first ranks
  }
  auto p = balanced_placement(384, 120); // 384 = 120 × 3 + 24
  CHECK(std::count(p.begin(), p.end(), 4u) == 24);
  CHECK(std::count(p.begin(), p.end(), 3u) == 96);
  CHECK(balanced_placement(10, 0).empty());
}

TEST_CASE("a rank of an EP-128 decode instance fails: down, rerouted, back at EP 120; "
          "recovered, it regains 128 at its next restart") {
  faulty_run r{2.0, std::chrono::minutes{12}};
  auto& d = r.decode();
  d.gpus_per_instance = 128;
  d.ep_size = 128;
  auto out = r.run(R"(
[[fault]]
at = "60s"
kind = "fail"
gpu = "decode/0/5"
[[fault]]
at = "300s"
kind = "recover"
gpu = "decode/0/5"
[[fault]]
at = "400s"
kind = "fail"
instance = "decode/0"
)");
  nothing_lost(out, r.records.size());
  MESSAGE("rerouted ", out.report["requests"]["rerouted"], " of ", r.records.size());
  CHECK(out.report["requests"]["rerouted"].get<std::uint64_t>() > 0);
  // Down from 60 s to 60 s + the restart time (3 min), then back with 120 ranks.
  auto restarts = events(out, "restart", "decode/0");
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[0]["at_s"] == 240.0);
  CHECK(restarts[0]["ep"] == 120);
  CHECK(restarts[1]["at_s"] == 580.0);
  CHECK(restarts[1]["ep"] == 128);
  auto resizes = events(out, "ep_resize", "decode/0");
  REQUIRE(resizes.size() == 2);
  CHECK(resizes[0]["from"] == 128);
  CHECK(resizes[0]["to"] == 120);
  CHECK(resizes[0]["experts_per_rank_max"] == 4);
  CHECK(resizes[0]["experts_per_rank_min"] == 3);
  CHECK(resizes[1]["from"] == 120);
  CHECK(resizes[1]["to"] == 128);
  // The faults are on the timeline too, in time order.
  auto& tl = out.report["timeline"];
  REQUIRE(tl.size() >= 7);
  CHECK(tl[0]["kind"] == "fail");
  CHECK(tl[0]["target"] == "gpu decode/0/5");
  for (std::size_t i = 1; i < tl.size(); ++i)
    CHECK(tl[i - 1]["at_s"].get<double>() <= tl[i]["at_s"].get<double>());
}

TEST_CASE("too few healthy GPUs: the instance stays down until enough recover") {
  faulty_run r{500, 0.2};
  auto& d = r.decode();
  d.instances.initial = 2; // 16 GPUs each: a re-formed group needs 8
  std::string plan;
  for (int g = 0; g < 9; ++g) // 7 healthy left
    plan += "[[fault]]\nat = \"60s\"\nkind = \"fail\"\ngpu = \"decode/0/" + std::to_string(g)
            + "\"\n";
  plan += "[[fault]]\nat = \"300s\"\nkind = \"recover\"\ngpu = \"decode/0/4\"\n";
  auto out = r.run(plan);
  nothing_lost(out, 500);
  auto down = events(out, "stays_down", "decode/0");
  REQUIRE(down.size() == 1);
  CHECK(down[0]["at_s"] == 240.0);
  CHECK(down[0]["healthy_gpus"] == 7);
  // The supervisor tries again a restart time later: 8 healthy GPUs, EP 8 on them.
  auto restarts = events(out, "restart", "decode/0");
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0]["at_s"] == 420.0);
  CHECK(restarts[0]["ep"] == 8);
  // Only the first of the nine failures hit a running rank; the rest found the instance down
  // (and still marked their GPU failed).
  std::size_t injected = 0;
  for (auto& e : out.report["faults"]["timeline"]) {
    injected += e["injected"].get<bool>() ? 1 : 0;
    if (!e["injected"].get<bool>()) {
      CHECK(e["skipped"] == "target down");
      CHECK(e["gpu_marked_failed"] == true);
    }
  }
  CHECK(injected == 2); // the first failure and the recovery
}

TEST_CASE("a whole pool fails: every instance restarts, nothing lost") {
  faulty_run r{300, 0.5};
  auto out = r.run("[[fault]]\nat = \"30s\"\nkind = \"fail\"\npool = \"prefill\"\n");
  nothing_lost(out, 300);
  CHECK(events(out, "restart", "prefill/0").size() == 1);
  CHECK(events(out, "restart", "prefill/1").size() == 1);
  CHECK(events(out, "restart", "prefill/0")[0]["ep"] == 8);
  CHECK(out.report["faults"]["timeline"][0]["injected"] == true);
}

TEST_CASE("a slow decode instance: steps take longer for the duration, nothing lost") {
  faulty_run r{300, 0.5};
  auto base = r.run("");
  auto out = r.run("[[fault]]\nat = \"0s\"\nkind = \"slow\"\ninstance = \"decode/0\"\n"
                   "factor = 4.0\nduration = \"10min\"\n");
  nothing_lost(out, 300);
  auto tbt = [](const sim_outcome& o) {
    return o.report["latency_ms"]["tbt"]["p50"].get<double>();
  };
  MESSAGE("tbt p50 ", tbt(base), " ms -> ", tbt(out), " ms");
  CHECK(tbt(out) > 3.0 * tbt(base));
  // A slowdown that ends while the run goes on is on the timeline, at its end.
  auto short_one = r.run("[[fault]]\nat = \"10s\"\nkind = \"slow\"\ngpu = \"decode/0/2\"\n"
                         "factor = 2.0\nduration = \"30s\"\n");
  nothing_lost(short_one, 300);
  auto ends = events(short_one, "slow_end", "gpu decode/0/2");
  REQUIRE(ends.size() == 1);
  CHECK(ends[0]["at_s"] == 40.0);
}

TEST_CASE("KV store shards fail: their metadata is lost, the hit rate drops, results do not "
          "change") {
  faulty_run r{500, 1.0};
  auto base = r.run("");
  std::string plan;
  for (int s = 0; s < 8; ++s)
    plan += "[[fault]]\nat = \"60s\"\nkind = \"store_fail\"\nshard = " + std::to_string(s)
            + "\nduration = \"30s\"\n";
  auto out = r.run(plan);
  nothing_lost(out, 500);
  auto hits = [](const sim_outcome& o) { return o.report["kv"]["block_hit_rate"].get<double>(); };
  MESSAGE("block hit rate ", hits(base), " -> ", hits(out));
  CHECK(hits(out) < hits(base) - 0.02);
  // The same requests completed, each with exactly its output delivered (nothing_lost: the
  // invariant checker), and the prompts that missed were prefilled in full.
  CHECK(out.report["requests"]["completed"] == base.report["requests"]["completed"]);
  CHECK(events(out, "recover", "shard 3").size() == 1);
}

TEST_CASE("slow KV store shards: every lookup waits factor times the store latency") {
  faulty_run r{300, 0.5};
  auto base = r.run("");
  // Every shard 1000 times slower (200 us -> 200 ms a lookup) for the whole run: each request
  // waits for its match before it is routed, so its first token comes ~200 ms later.
  std::string plan;
  for (int s = 0; s < 8; ++s)
    plan += "[[fault]]\nat = \"0s\"\nkind = \"store_slow\"\nshard = " + std::to_string(s)
            + "\nfactor = 1000.0\nduration = \"1h\"\n";
  auto out = r.run(plan);
  nothing_lost(out, 300);
  CHECK(out.report["faults"]["timeline"][0]["injected"] == true);
  CHECK(out.report["faults"]["not_injected_yet"].empty());
  auto ttft = [](const sim_outcome& o) { return o.report["latency_ms"]["ttft"]["p50"].get<double>(); };
  MESSAGE("ttft p50 ", ttft(base), " ms -> ", ttft(out), " ms");
  CHECK(ttft(out) > ttft(base) + 150);
  CHECK(ttft(out) < ttft(base) + 1000);
  // A slowdown that ends within the run is on the timeline at its end.
  auto brief = r.run("[[fault]]\nat = \"10s\"\nkind = \"store_slow\"\nshard = 2\n"
                     "factor = 10.0\nduration = \"20s\"\n");
  nothing_lost(brief, 300);
  auto ends = events(brief, "slow_end", "shard 2");
  REQUIRE(ends.size() == 1);
  CHECK(ends[0]["at_s"] == 30.0);
}

TEST_CASE("a planted bug that replays delivered tokens after a reroute: the count is right, the "
          "stream check catches it") {
  // Two decode instances, each failing once while busy: the rerouted requests resume at once
  // on the other one.
  faulty_run r{4.0, std::chrono::minutes{3}};
  r.decode().instances.initial = 2;
  auto plan = "[[fault]]\nat = \"60s\"\nkind = \"fail\"\ngpu = \"decode/0/3\"\n"
              "[[fault]]\nat = \"100s\"\nkind = \"fail\"\ngpu = \"decode/1/3\"\n";
  auto clean = r.run(plan);
  nothing_lost(clean, r.records.size());
  REQUIRE(clean.report["requests"]["rerouted"].get<std::uint64_t>() > 0);
  sim_options o;
  o.seed = 1;
  auto parsed = parse_fault_plan(plan, "plan.toml", r.topo);
  REQUIRE(parsed.ok());
  o.faults = expand(*parsed.value, runtime::rng{1}.split("faults"), r.horizon);
  o.params.test_replay_on_reroute = true;
  auto buggy = run_simulation(r.topo, r.records, o);
  REQUIRE(buggy.ok());
  MESSAGE("rerouted ", buggy->report["requests"]["rerouted"], ", violations ",
          buggy->invariants.violations.size());
  CHECK(buggy->report["requests"]["completed"] == r.records.size());
  REQUIRE(!buggy->invariants.ok());
  for (auto& v : buggy->invariants.violations) {
    CAPTURE(v.to_string());
    // Only the stream check fires: every count is right.
    CHECK(v.what.find("differs from its fault-free run's") != std::string::npos);
  }
}

TEST_CASE("a partition cuts a decode instance's KV link: hand-offs wait it out, nothing lost") {
  faulty_run r{300, 0.5};
  auto base = r.run("");
  auto out = r.run("[[fault]]\nat = \"30s\"\nkind = \"partition\"\n"
                   "link = [\"prefill\", \"decode/0\"]\nduration = \"60s\"\n");
  nothing_lost(out, 300);
  CHECK(out.report["requests"]["rerouted"] == 0);
  CHECK(out.report["faults"]["timeline"][0]["injected"] == true);
  CHECK(events(out, "partition_end", "link prefill <-> decode/0").size() == 1);
  // Requests admitted during the cut wait for it to heal before decoding: their first-to-last
  // token span stays, their end-to-end grows by up to the minute.
  auto p99 = [](const sim_outcome& o) { return o.report["latency_ms"]["e2e"]["p99"].get<double>(); };
  MESSAGE("e2e p99 ", p99(base), " ms -> ", p99(out), " ms");
  CHECK(p99(out) > p99(base) + 10'000);
  // A partition with no modelled transfer (prefill <-> prefill) is not injected.
  auto none = r.run("[[fault]]\nat = \"30s\"\nkind = \"partition\"\n"
                    "link = [\"prefill/0\", \"prefill/1\"]\nduration = \"60s\"\n");
  CHECK(none.report["faults"]["timeline"][0]["injected"] == false);
}

/// small.toml with nodes: decode/0's 16 GPUs sit on d0 (0-7) and d1 (8-15), the prefill
/// instances on p0, vision on v0.
topology small_with_nodes() {
  std::ifstream in{root + "/examples/topologies/small.toml"};
  std::string text{std::istreambuf_iterator<char>{in}, {}};
  int port = 4000;
  for (auto [name, gpus, role] : {std::tuple{"p0", 16, "prefill"}, std::tuple{"d0", 8, "decode"},
                                  std::tuple{"d1", 8, "decode"}, std::tuple{"v0", 1, "vision"}})
    text += std::string{"\n[[node]]\nname = \""} + name + "\"\nhost = \"10.0.0.1\"\nport = "
            + std::to_string(++port) + "\ngpus = " + std::to_string(gpus) + "\nroles = [\""
            + role + "\"]\n";
  auto t = parse_topology(text, "small-nodes.toml");
  for (auto& d : t.errors)
    MESSAGE(d.message);
  REQUIRE(t.ok());
  return *t.value;
}

TEST_CASE("a node fails: every instance it hosts goes down and re-forms on the GPUs it has left") {
  faulty_run r{2.0, std::chrono::minutes{6}};
  r.topo = small_with_nodes();
  auto out = r.run("[[fault]]\nat = \"60s\"\nkind = \"fail\"\nnode = \"d1\"\n"
                   "[[fault]]\nat = \"5min\"\nkind = \"recover\"\nnode = \"d1\"\n");
  nothing_lost(out, r.records.size());
  CHECK(out.report["faults"]["timeline"][0]["injected"] == true);
  CHECK(out.report["faults"]["timeline"][1]["injected"] == true);
  auto restarts = events(out, "restart", "decode/0");
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0]["at_s"] == 240.0);
  CHECK(restarts[0]["ep"] == 8); // GPUs 0-7 on d0
  CHECK(events(out, "restart", "prefill/0").empty());
}

TEST_CASE("a slow node slows the EP groups it hosts; a partitioned node cuts their KV links") {
  faulty_run r{300, 0.5};
  r.topo = small_with_nodes();
  auto base = r.run("");
  // d1 holds half of decode/0's GPUs: its whole EP group steps at the slow ranks' pace.
  auto slow = r.run("[[fault]]\nat = \"0s\"\nkind = \"slow\"\nnode = \"d1\"\n"
                    "factor = 4.0\nduration = \"10min\"\n");
  nothing_lost(slow, 300);
  CHECK(slow.report["faults"]["timeline"][0]["injected"] == true);
  auto tbt = [](const sim_outcome& o) {
    return o.report["latency_ms"]["tbt"]["p50"].get<double>();
  };
  MESSAGE("tbt p50 ", tbt(base), " ms -> ", tbt(slow), " ms");
  CHECK(tbt(slow) > 3.0 * tbt(base));

  // Cutting d1 cuts decode/0's KV link: hand-offs into it wait the minute out.
  auto cut = r.run("[[fault]]\nat = \"30s\"\nkind = \"partition\"\nnode = \"d1\"\n"
                   "duration = \"60s\"\n");
  nothing_lost(cut, 300);
  CHECK(cut.report["requests"]["rerouted"] == 0);
  CHECK(cut.report["faults"]["timeline"][0]["injected"] == true);
  CHECK(events(cut, "partition_end", "node d1").size() == 1);
  auto p99 = [](const sim_outcome& o) { return o.report["latency_ms"]["e2e"]["p99"].get<double>(); };
  MESSAGE("e2e p99 ", p99(base), " ms -> ", p99(cut), " ms");
  CHECK(p99(cut) > p99(base) + 10'000);

  // The vision node hosts nothing with modelled steps or KV links: not injected.
  auto vision = r.run("[[fault]]\nat = \"30s\"\nkind = \"partition\"\nnode = \"v0\"\n"
                      "duration = \"60s\"\n");
  CHECK(vision.report["faults"]["timeline"][0]["injected"] == false);
}

TEST_CASE("the sliding-window rings a drain forwards: every windowed layer's window + 6 tokens") {
  auto v3 = resolve_model("deepseek-v3", default_models_dir());
  auto v41 = resolve_model("deepseek-v4.1-flash", default_models_dir());
  REQUIRE(v3.ok());
  REQUIRE(v41.ok());
  CHECK(v3->swa_ring_bytes() == 0); // MLA keeps no window
  std::size_t windowed = 0;
  for (auto& l : v41->layers)
    windowed += l.attention != attention_kind::mla ? 1 : 0;
  REQUIRE(windowed == v41->layers.size());
  REQUIRE(v41->sliding_window == 128);
  CHECK(v41->swa_ring_bytes()
        == doctest::Approx(static_cast<double>(windowed) * 134 * v41->swa_entry_bytes));
  MESSAGE("V4.1-Flash SWA rings: ", v41->swa_ring_bytes(), " bytes (", windowed, " layers x 134 x ",
          v41->swa_entry_bytes, ")");
}

TEST_CASE("a slow link: the KV hand-offs into its decode end take factor times longer") {
  faulty_run r{300, 0.5};
  auto base = r.run("");
  auto out = r.run("[[fault]]\nat = \"0s\"\nkind = \"slow\"\nlink = [\"prefill\", \"decode/0\"]\n"
                   "factor = 1000.0\nduration = \"100s\"\n");
  nothing_lost(out, 300);
  CHECK(out.report["faults"]["timeline"][0]["injected"] == true);
  REQUIRE(events(out, "slow_end", "link prefill <-> decode/0").size() == 1);
  CHECK(events(out, "slow_end", "link prefill <-> decode/0")[0]["at_s"] == 100.0);
  auto p = [](const sim_outcome& o, const char* q) {
    return o.report["latency_ms"]["e2e"][q].get<double>();
  };
  MESSAGE("e2e p50 ", p(base, "p50"), " -> ", p(out, "p50"), " ms, p90 ", p(base, "p90"), " -> ",
          p(out, "p90"), " ms");
  CHECK(p(out, "p90") > p(base, "p90"));
  // TTFT ends with prefill, before the hand-off: unchanged.
  CHECK(out.report["latency_ms"]["ttft"] == base.report["latency_ms"]["ttft"]);
}
