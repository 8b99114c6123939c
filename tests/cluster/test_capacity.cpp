// Tests of cluster/sim/capacity and the perf model's memory of an instance: whether a
// topology's instances can hold the model, and the KV a decode instance holds.
#include "cluster/sim/capacity.hpp"
#include "cluster/sim/perf_model.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

using namespace troupe::cluster;
using namespace troupe::cluster::sim;

namespace {

const std::filesystem::path source_dir{TROUPE_SOURCE_DIR};

model_profile model(const char* name) {
  auto m = resolve_model(name, source_dir / "examples" / "models");
  REQUIRE(m.ok());
  return *m;
}

hardware_profile hardware(const char* name) {
  auto h = hardware_by_name(name);
  REQUIRE(h.ok());
  return *h;
}

topology example(const char* name) {
  auto t = load_topology(source_dir / "examples" / "topologies" / name);
  REQUIRE(t.ok());
  return *t.value;
}

} // namespace

TEST_CASE("an instance's KV is its HBM left after weights and workspace") {
  auto m = model("deepseek-v4.1-flash");
  auto h = hardware("H200");
  auto mem = memory_of_instance(m, h, 16, 16);
  INFO(mem.error());
  REQUIRE(mem.ok());
  CHECK(mem->hbm_bytes == doctest::Approx(16 * h.hbm_bytes));
  CHECK(mem->workspace_bytes == doctest::Approx(mem->hbm_bytes * workspace_share));
  CHECK(mem->kv_bytes
        == doctest::Approx(mem->hbm_bytes - mem->weight_bytes - mem->workspace_bytes));
  CHECK(mem->kv_tokens == static_cast<std::uint64_t>(mem->kv_bytes / m.kv_bytes_per_token));
  // The weights without the Engram tables (host memory / SSD) are below the total parameters'
  // bytes at one byte each, and above their FP4 bytes.
  auto engram = m.engram_table_rows * m.engram_head_dim;
  CHECK(mem->weight_bytes / 16 < m.total_params - engram);
  CHECK(mem->weight_bytes / 16 > (m.total_params - engram) * 0.5 / 16);
  // More EP spreads the experts thinner: more room for KV per GPU.
  auto wider = memory_of_instance(m, h, 32, 32);
  REQUIRE(wider.ok());
  CHECK(wider->kv_tokens > 2 * mem->kv_tokens);
  CHECK(kv_capacity_tokens(m, h, 16, 16) == mem->kv_tokens);
}

TEST_CASE("an instance whose weights do not fit its GPUs has no KV capacity and says why") {
  // DeepSeek-V3 (671B parameters in FP8) on one 80 GB H800.
  auto m = model("deepseek-v3");
  auto mem = memory_of_instance(m, hardware("H800"), 1, 1);
  REQUIRE_FALSE(mem.ok());
  CHECK(mem.error().find("leaves no room for KV") != std::string::npos);
  CHECK(kv_capacity_tokens(m, hardware("H800"), 1, 1) == fallback_kv_tokens);
  CHECK_FALSE(memory_of_instance(m, hardware("H800"), 0, 1).ok());
}

TEST_CASE("every example topology's instances can start, and the larger ones hold the model") {
  for (auto name : {"small.toml", "v4flash-1k.toml", "v4flash-trace.toml", "local-cpu.toml"}) {
    CAPTURE(name);
    auto problems = check_capacity(example(name));
    for (auto& p : problems)
      INFO(p.pool << ": " << p.message);
    CHECK(problems.empty());
  }
  // small-autoscale.toml's instances of 1 and 2 H200s cannot hold DeepSeek-V4.1-Flash's
  // weights: warned about, not fatal (the autoscaler examples run on them).
  auto problems = check_capacity(example("small-autoscale.toml"));
  REQUIRE(problems.size() == 2);
  for (auto& p : problems) {
    CHECK_FALSE(p.fatal);
    CHECK(p.message.find("leaves no room for KV") != std::string::npos);
  }
}

TEST_CASE("a decode EP group larger than the model's experts cannot start") {
  auto t = example("small.toml");
  for (auto& p : t.pools)
    if (p.role == pool_role::decode)
      p.gpus_per_instance = p.ep_size = 1024;
  auto problems = check_capacity(t);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].fatal);
  CHECK(problems[0].pool == "decode");
  CHECK(problems[0].message.find("cannot form an EP group") != std::string::npos);
  CHECK(problems[0].message.find("384 routed experts") != std::string::npos);
}
