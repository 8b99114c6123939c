// The simulated cluster end to end: a shipped topology replaying the start of the shipped
// Mooncake trace. Reproducible from the seed, and every request accounted for.
#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/simulation.hpp"
#include "cluster/sim/trace.hpp"
#include "cluster/sim/workload.hpp"
#include "runtime/random.hpp"
#include "cluster/topology.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

using namespace troupe::cluster;
using namespace troupe::cluster::sim;
namespace runtime = troupe::runtime;
using namespace std::chrono_literals;

namespace {

const std::string root = TROUPE_SOURCE_DIR;

struct replay {
  topology topo;
  std::vector<request_record> records;

  explicit replay(std::size_t n, double speedup = 1.0) {
    auto t = load_topology(root + "/examples/topologies/small.toml");
    REQUIRE(t.ok());
    topo = *t.value;
    load_options lo;
    lo.max_records = n;
    lo.speedup = speedup;
    auto loaded = load_mooncake(root + "/examples/traces/mooncake_fast25_conversation_trace.jsonl", lo);
    REQUIRE(loaded.ok);
    records = std::move(loaded.records);
  }

  sim_outcome run(std::uint64_t seed) const {
    sim_options o;
    o.seed = seed;
    auto r = run_simulation(topo, records, o);
    REQUIRE(r.ok());
    return *r;
  }
};

} // namespace

TEST_CASE("every admitted request of a replayed trace completes") {
  replay r{300};
  auto out = r.run(1);
  CHECK(out.finished);
  auto& q = out.report["requests"];
  CHECK(q["admitted"] == 300);
  CHECK(q["completed"] == 300);
  CHECK(q["failed"] == 0);
  CHECK(out.report["latency_ms"]["ttft"]["p50"].get<double>() > 0);
  CHECK(out.report["latency_ms"]["ttft"]["p99"].get<double>()
        >= out.report["latency_ms"]["ttft"]["p50"].get<double>());
  CHECK(out.report["throughput"]["output_tokens_per_s"].get<double>() > 0);
}

TEST_CASE("the same topology, trace and seed give a byte-identical report") {
  replay r{300};
  CHECK(r.run(3).report.dump() == r.run(3).report.dump());
}

TEST_CASE("the report keeps host figures out") {
  replay r{50};
  auto out = r.run(1);
  auto text = out.report.dump();
  CHECK(text.find("wall") == std::string::npos);
  CHECK(text.find("rss") == std::string::npos);
  CHECK(out.run.contains("wall_s"));
  CHECK(out.run.contains("peak_rss_mib"));
  CHECK(out.run.contains("events_per_s"));
}

TEST_CASE("repeated prefixes of the trace hit the cluster KV cache") {
  replay r{1000};
  auto out = r.run(1);
  auto rate = out.report["kv"]["block_hit_rate"].get<double>();
  // The unlimited-cache replay of these records (an upper bound: the simulated cache also
  // sees prefixes only after their prefill finished).
  auto bound = prefix_hit_rate(r.records, block_tokens).block_rate();
  CHECK(rate > 0.5 * bound);
  CHECK(rate <= bound + 0.02);
  CHECK(out.report["kv"]["token_hit_rate"].get<double>() > 0);
}

TEST_CASE("no KV block is served after its TTL; a planted bug that serves expired ones is "
          "caught") {
  // A TTL of 20 s: many of the trace's repeated prefixes come back after their blocks
  // expired, so lookups meet expired entries.
  replay r{400};
  r.topo.storage.ttl["chatbot"] = 20s;
  r.topo.storage.ttl["agent"] = 20s;
  auto clean = r.run(1);
  CHECK(clean.invariants.ok());
  CHECK(clean.report["kv"]["store"]["expirations"].get<std::uint64_t>() > 0);
  CHECK(clean.report["kv"]["store"]["served_expired"] == 0);

  sim_options o;
  o.seed = 1;
  o.params.test_kv_ignore_expiry = true;
  auto bad = run_simulation(r.topo, r.records, o);
  REQUIRE(bad.ok());
  REQUIRE_FALSE(bad->invariants.ok());
  auto served = bad->report["kv"]["store"]["served_expired"].get<std::uint64_t>();
  CHECK(served > 0);
  bool caught = false;
  for (auto& v : bad->invariants.violations)
    caught |= v.about == "kv"
              && v.what == std::to_string(served)
                             + " blocks served as cache hits at or after their TTL expiry";
  CHECK(caught);
  // The bug serves more hits than the clean run.
  CHECK(bad->report["kv"]["block_hit_rate"].get<double>()
        > clean.report["kv"]["block_hit_rate"].get<double>());
}

TEST_CASE("the load balancers' counters are in the report") {
  replay r{200};
  auto out = r.run(1);
  auto& lb = out.report["lb"];
  std::uint64_t routed = 0;
  for (auto& [name, value] : lb["prefill"].items())
    if (name.starts_with("routed_"))
      routed += value.get<std::uint64_t>();
  CHECK(routed == 200);
  CHECK(lb["decode"]["routed_long"].get<std::uint64_t>()
          + lb["decode"]["routed_short"].get<std::uint64_t>()
        == 200);
}

TEST_CASE("a run stopped by its deadline reports the unfinished requests") {
  replay r{300};
  sim_options o;
  o.until = std::chrono::seconds(30);
  auto res = run_simulation(r.topo, r.records, o);
  REQUIRE(res.ok());
  CHECK(!res->finished);
  auto& q = res->report["requests"];
  CHECK(q["unfinished"].get<std::uint64_t>() > 0);
  CHECK(q["completed"].get<std::uint64_t>() + q["failed"].get<std::uint64_t>()
          + q["unfinished"].get<std::uint64_t>()
        == q["admitted"].get<std::uint64_t>());
  CHECK(res->report["sim"]["virtual_s"].get<double>() == doctest::Approx(30.0));
}

TEST_CASE("a topology whose model has no profile is refused with a message") {
  replay r{10};
  auto topo = r.topo;
  topo.cluster.hardware = "cpu";
  auto res = run_simulation(topo, r.records, sim_options{});
  CHECK(!res.ok());
  CHECK(!res.error().empty());
}

TEST_CASE("the report has load and busy share over time for every instance") {
  replay r{300};
  auto out = r.run(1);
  auto& s = out.report["series"];
  auto bins = s["t_s"].size();
  auto bin_s = s["bin_s"].get<double>();
  REQUIRE(bins > 1);
  CHECK(s["pools"] == nlohmann::json::array({"prefill", "decode"}));
  auto& per_instance = out.report["gpus"]["instance_busy_share"];
  // small.toml: 2 prefill instances and 1 decode instance, each with both series, and a vision
  // instance (held, idle: no request has images) with a busy share only.
  CHECK(per_instance.size() == 4);
  CHECK(per_instance["vision/0"] == 0);
  double load_area = 0;
  for (auto& [key, share] : per_instance.items()) {
    CAPTURE(key);
    if (key == "vision/0")
      continue;
    REQUIRE(s["instance_load"].contains(key));
    REQUIRE(s["instance_busy"].contains(key));
    auto& load = s["instance_load"][key];
    auto& busy = s["instance_busy"][key];
    CHECK(load.size() == bins);
    CHECK(busy.size() == bins);
    double busy_s = 0;
    for (auto& b : busy) {
      CHECK(b.get<double>() >= 0);
      CHECK(b.get<double>() <= 1);
      busy_s += b.get<double>() * bin_s;
    }
    for (auto& l : load) {
      CHECK(l.get<double>() >= 0);
      load_area += l.get<double>() * bin_s;
    }
    // The binned busy time adds up to the instance's total (its busy share of the time it
    // was up, which here is the whole run).
    auto up_s = out.report["gpus"]["instance_up_s"][key].get<double>();
    CHECK(up_s == doctest::Approx(out.report["sim"]["virtual_s"].get<double>()));
    auto total_s = share.get<double>() * up_s;
    CHECK(busy_s == doctest::Approx(total_s).epsilon(0.01));
  }
  CHECK(load_area > 0);
}

TEST_CASE("a decode rank failure: every request completes, rerouted, none lost") {
  replay r{500};
  auto plan = load_fault_plan(root + "/examples/faults/decode-rank-failure.toml", r.topo);
  REQUIRE(plan.ok());
  runtime::duration horizon{0};
  for (auto& rec : r.records)
    horizon = std::max(horizon, rec.arrival);
  sim_options o;
  o.seed = 1;
  o.faults = expand(*plan.value, runtime::rng{1}.split("faults"), horizon);
  REQUIRE(o.faults.size() == 1); // the recovery at 32 min is past the horizon
  auto out = run_simulation(r.topo, r.records, o);
  REQUIRE(out.ok());
  CHECK(out->finished);
  auto& q = out->report["requests"];
  CHECK(q["completed"] == 500);
  CHECK(q["failed"] == 0);
  CHECK(q["rerouted"].get<std::uint64_t>() > 0);
  CHECK(out->invariants.ok());
  CHECK(out->report["invariants"]["violations"].empty());
  auto& f = out->report["faults"];
  CHECK(f["injected"] == true);
  CHECK(f["timeline"][0]["injected"] == true);
}

TEST_CASE("a decode instance drains: nothing lost, requests forwarded with their KV") {
  // small.toml starts one decode instance (max 2): start two, so that the drained one has
  // somewhere to hand its requests. The trace slowed to 0.4x its speed: arrivals until
  // ~410 s, past the drain at 5 min. The shipped plan's 90 s grace outlasts every request
  // (it leaves when empty, forwarding nothing); a 1 s grace at 100 s forwards the requests in flight (3).
  replay r{500, 0.4};
  for (auto& p : r.topo.pools)
    if (p.role == pool_role::decode)
      p.instances.initial = 2;
  runtime::duration horizon{0};
  for (auto& rec : r.records)
    horizon = std::max(horizon, rec.arrival);
  auto shipped = root + "/examples/faults/drain-one-decode.toml";
  auto short_grace = (std::filesystem::temp_directory_path() / "troupe-drain-1s.toml").string();
  {
    std::ofstream f{short_grace};
    f << "[[fault]]\nat = \"100s\"\nkind = \"drain\"\ninstance = \"decode/0\"\n"
         "grace = \"1s\"\n";
  }
  for (auto path : {shipped, short_grace}) {
    CAPTURE(path);
    auto plan = load_fault_plan(path, r.topo);
    REQUIRE(plan.ok());
    sim_options o;
    o.seed = 1;
    o.faults = expand(*plan.value, runtime::rng{1}.split("faults"), horizon);
    REQUIRE(o.faults.size() == 1);
    auto out = run_simulation(r.topo, r.records, o);
    REQUIRE(out.ok());
    CHECK(out->finished);
    auto& q = out->report["requests"];
    CHECK(q["completed"] == 500);
    CHECK(q["failed"] == 0);
    CHECK(q["rerouted"] == 0);
    CHECK(out->invariants.ok());
    CHECK(out->report["invariants"]["violations"].empty());
    auto& f = out->report["faults"];
    CHECK(f["injected"] == true);
    CHECK(f["timeline"][0]["injected"] == true);
    CHECK(f["not_injected_yet"].empty());
    CHECK(f["timeline"][0]["forwarded"] == q["forwarded"]);
    MESSAGE("forwarded ", q["forwarded"]);
    if (path == shipped)
      CHECK(q["forwarded"] == 0);
    else
      CHECK(q["forwarded"].get<std::uint64_t>() > 0);
  }
  std::filesystem::remove(short_grace);
}

TEST_CASE("speculative decoding: every request completes exactly, fixed-length and DSpark verify "
          "drafts and cut time between tokens") {
  replay r{200};
  auto with = [&](troupe::actors::speculation spec) {
    sim_options o;
    o.seed = 3;
    o.params.speculation = spec;
    auto out = run_simulation(r.topo, r.records, o);
    REQUIRE(out.ok());
    // Completed, each with its exact stream: the invariants check every request's tokens,
    // position by position, against what it should have generated.
    CHECK(out->report["requests"]["completed"] == 200);
    CHECK(out->report["invariants"]["checked"] == 200);
    CHECK(out->report["invariants"]["violations"].size() == 0);
    return out->report;
  };
  const auto off = with(troupe::actors::speculation::off);
  const auto fixed = with(troupe::actors::speculation::fixed);
  const auto dspark = with(troupe::actors::speculation::dspark);
  CHECK_FALSE(off.contains("speculation"));
  for (const auto* rep : {&fixed, &dspark}) {
    const auto& s = (*rep)["speculation"];
    CHECK(s["drafts_verified"].get<std::uint64_t>() > 0);
    CHECK(s["drafts_accepted"].get<std::uint64_t>() > 0);
    CHECK(s["drafts_accepted"].get<std::uint64_t>() <= s["drafts_verified"].get<std::uint64_t>());
    CHECK(s["tokens_per_verify"].get<double>() > 1.0);
    CHECK((*rep)["latency_ms"]["tbt"]["p50"].get<double>()
          < off["latency_ms"]["tbt"]["p50"].get<double>());
  }
  CHECK(fixed["speculation"]["drafts_per_verify"].get<double>() > 4.5);
  // DSpark verifies fewer drafts where they are unlikely to be accepted: a higher share of
  // what it verifies is accepted.
  CHECK(dspark["speculation"]["acceptance"].get<double>()
        > fixed["speculation"]["acceptance"].get<double>());
}

/// The report of seed 5 on the 200 requests of `r` with a share of them under a structured-output
/// constraint whose masks and compile take `mask_s` and `compile_s`: every request completed.
nlohmann::json structured_report(const replay& r, double share, double mask_s, double compile_s) {
  sim_options o;
  o.seed = 5;
  o.params.structured_share = share;
  o.params.structured_mask_s = mask_s;
  o.params.structured_compile_s = compile_s;
  auto out = run_simulation(r.topo, r.records, o);
  REQUIRE(out.ok());
  CHECK(out->report["requests"]["completed"] == 200);
  CHECK(out->report["invariants"]["violations"].size() == 0);
  return out->report;
}

TEST_CASE("structured output: constrained requests' masks are built while the forward runs, and "
          "a step waits for them only when they take longer") {
  replay r{200};
  auto with = [&](double share, double mask_s) { return structured_report(r, share, mask_s, 1.5e-3); };
  const auto none = with(0.0, 10e-6);
  const auto half = with(0.5, 10e-6);
  const auto slow = with(1.0, 20e-3);
  CHECK_FALSE(none.contains("structured"));
  // The same requests for a seed, about the share asked for.
  const auto constrained = half["structured"]["requests"].get<std::uint64_t>();
  CHECK(constrained > 70);
  CHECK(constrained < 130);
  CHECK(with(0.5, 10e-6)["structured"]["requests"] == constrained);
  CHECK(slow["structured"]["requests"] == 200);
  // 10 µs masks hide behind a decode forward of milliseconds: the same time between tokens.
  const auto tbt = [](const nlohmann::json& rep) { return rep["latency_ms"]["tbt"]["p50"].get<double>(); };
  CHECK(tbt(half) == tbt(none));
  // 20 ms masks do not: every step takes at least a GPU's sequences' masks.
  CHECK(tbt(slow) >= 20.0);
  CHECK(tbt(slow) > tbt(none));
}

TEST_CASE("structured output: a constraint compiles while its request is routed and prefilled; "
          "its first token waits only for what is left of the compile") {
  replay r{200};
  auto with = [&](double share, double compile_s) { return structured_report(r, share, 10e-6, compile_s); };
  const auto ttft = [](const nlohmann::json& rep, const char* q) {
    return rep["latency_ms"]["ttft"][q].get<double>();
  };
  const auto none = with(0.0, 1.5e-3);
  const auto quick = with(1.0, 1.5e-3);
  const auto slow = with(1.0, 0.5);
  CHECK(quick["structured"]["compile_s"] == 1.5e-3);
  // A compile of 1.5 ms hides behind a prefill step of V4.1-Flash: the same first tokens.
  CHECK(ttft(quick, "p50") == ttft(none, "p50"));
  CHECK(ttft(quick, "p99") == ttft(none, "p99"));
  // One of 500 ms does not: no first token before it ends (the compile starts no later than
  // the prefill engine takes the job, after the request's arrival), nor much after.
  CHECK(ttft(slow, "p50") >= 500.0);
  CHECK(ttft(slow, "p50") < ttft(none, "p50") + 500.0 + 100.0);
}

TEST_CASE("GPU figures count the GPU time held: an autoscaled cluster is never over 100% busy") {
  // `troupe sim small-autoscale.toml --workload mixed --rate 20`, shortened: a load well
  // above the initial size, so the autoscaler grows both pools and the GPU time held exceeds
  // the initial GPUs' (this run read 169.8% "utilization" against the initial GPUs).
  auto t = load_topology(root + "/examples/topologies/small-autoscale.toml");
  REQUIRE(t.ok());
  mixed_params mp;
  mp.rate = 20;
  mp.duration = 2min;
  runtime::rng root_rng{0};
  auto rng = root_rng.split("workload");
  auto w = generate_mixed(mp, rng);
  REQUIRE(w.ok());
  sim_options o;
  o.params.image_tokens = mp.chat.image_tokens;
  auto r = run_simulation(*t.value, w.records, o);
  REQUIRE(r.ok());
  auto& g = r->report["gpus"];
  auto virtual_s = r->report["sim"]["virtual_s"].get<double>();
  auto initial_gpu_hours = g["total"].get<double>() * virtual_s / 3600;
  CAPTURE(g.dump());
  CHECK(g["gpu_hours_held"].get<double>() > initial_gpu_hours * 1.2);
  CHECK(g["busy_share"].get<double>() > 0);
  CHECK(g["busy_share"].get<double>() <= 1.0);
  for (auto& [pool, p] : g["pools"].items()) {
    CHECK(p["busy_share"].get<double>() <= 1.0);
    CHECK(p["gpu_hours_held"].get<double>() > 0);
  }
  for (auto& [key, share] : g["instance_busy_share"].items())
    CHECK(share.get<double>() <= 1.0);
  // Tokens per GPU-second: the completed output over the GPU time held.
  auto out_tokens = r->report["throughput"]["output_tokens_per_s"].get<double>();
  CHECK(g["output_tokens_per_gpu_s"].get<double>() > 0);
  CHECK(g["output_tokens_per_gpu_hour"].get<double>()
        == doctest::Approx(g["output_tokens_per_gpu_s"].get<double>() * 3600).epsilon(1e-4));
  CHECK(out_tokens > 0);
}

TEST_CASE("decode batch and KV occupancy are reported against the instance's capacity") {
  replay r{300};
  auto out = r.run(1);
  auto& d = out.report["gpus"]["pools"]["decode"];
  CAPTURE(d.dump());
  // small.toml: one decode instance of 16 GPUs, 128 requests per GPU.
  auto per_step = d["sequences_per_step"].get<double>();
  CHECK(per_step >= 1);
  CHECK(d["batch_occupancy"].get<double>() == doctest::Approx(per_step / 2048).epsilon(1e-3));
  CHECK(d["kv_occupancy"].get<double>() > 0);
  CHECK(d["kv_occupancy"].get<double>() <= d["kv_occupancy_peak"].get<double>());
  CHECK(d["kv_occupancy_peak"].get<double>() < 1);
  CHECK(d["decode_steps"].get<std::uint64_t>() > 0);
  CHECK(!out.report["gpus"]["pools"]["prefill"].contains("batch_occupancy"));
  // MFU and HBM-bandwidth share per pool: within (0, 1), and decode (one token per sequence
  // per step, reading every weight and the batch's KV) is bound by memory, not arithmetic.
  for (auto pool : {"prefill", "decode"}) {
    auto& p = out.report["gpus"]["pools"][pool];
    CAPTURE(pool);
    CHECK(p["mfu"].get<double>() > 0);
    CHECK(p["mfu"].get<double>() < 1);
    CHECK(p["hbm_bandwidth_share"].get<double>() > 0);
    CHECK(p["hbm_bandwidth_share"].get<double>() < 1);
  }
  CHECK(d["hbm_bandwidth_share"].get<double>() > d["mfu"].get<double>());
  CHECK(out.report["gpus"]["pools"]["prefill"]["mfu"].get<double>() > d["mfu"].get<double>());
  CHECK(out.report["gpus"]["pools"]["prefill"]["input_tokens_per_node_s"].get<double>() > 0);
}

namespace {

/// `records` on `r`'s topology with --kv-stream on or off and a hand-off link of `bandwidth`
/// bytes/s: every request completes, its invariants checked and none broken; the report.
nlohmann::json kv_stream_run(const replay& r, const std::vector<request_record>& records,
                             std::uint64_t seed, double bandwidth, bool stream) {
  sim_options o;
  o.seed = seed;
  o.params.stream_kv = stream;
  o.params.handoff_bandwidth = bandwidth;
  auto out = run_simulation(r.topo, records, o);
  REQUIRE(out.ok());
  CHECK(out->report["requests"]["completed"] == records.size());
  CHECK(out->report["invariants"]["checked"] == records.size());
  CHECK(out->report["invariants"]["violations"].size() == 0);
  return out->report;
}

} // namespace

TEST_CASE("--kv-stream: a prompt's blocks cross the hand-off link while it prefills: decode "
          "starts sooner, but never before every byte crossed") {
  // One 16,384-token prompt and a 100 MB/s hand-off link, slower than the prefill: the streamed
  // blocks occupy the link from the first chunk on, so the request ends sooner than with one
  // transfer after the prefill, yet no sooner than the whole KV takes on the link (which the
  // run without streaming shows: the time from its first token to its second).
  replay r{1};
  request_record one;
  one.input_tokens = 131072;
  one.output_tokens = 2;
  for (std::uint64_t b = 0; b < 1024; ++b)
    one.blocks.push_back(0x5eed0000 + b);
  const auto off = kv_stream_run(r, {one}, 1, 100e6, false);
  const auto on = kv_stream_run(r, {one}, 1, 100e6, true);
  const auto ms = [](const nlohmann::json& rep, const char* what) {
    return rep["latency_ms"][what]["p50"].get<double>();
  };
  const double handoff = ms(off, "e2e") - ms(off, "ttft");  // the whole KV, then one step
  MESSAGE("ttft " << ms(off, "ttft") << " ms; e2e " << ms(off, "e2e") << " ms one transfer, "
                  << ms(on, "e2e") << " ms streamed");
  CHECK(ms(on, "ttft") == ms(off, "ttft"));
  CHECK(ms(on, "e2e") < ms(off, "e2e"));
  CHECK(ms(on, "e2e") >= handoff);
}

TEST_CASE("--kv-stream over a trace: every request completes exactly, and the slowest finish "
          "sooner") {
  replay r{200};
  // A 2 GB/s hand-off takes time to move a prompt's KV.
  REQUIRE(r.records.size() == 200);
  const auto off = kv_stream_run(r, r.records, 3, 2e9, false);
  const auto on = kv_stream_run(r, r.records, 3, 2e9, true);
  // The median barely moves (the streamed blocks take the same link time, and an early
  // booking picks its decode instance one prefill sooner); the tail gains.
  const auto e2e = [](const nlohmann::json& rep, const char* p) {
    return rep["latency_ms"]["e2e"][p].get<double>();
  };
  MESSAGE("e2e p50 " << e2e(off, "p50") << " -> " << e2e(on, "p50") << " ms, p99 "
                     << e2e(off, "p99") << " -> " << e2e(on, "p99") << " ms");
  CHECK(e2e(on, "p99") < e2e(off, "p99"));
}
