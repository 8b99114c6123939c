// Tests of cluster/topology: loading, validating and describing topology files.
#include "cluster/topology.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

using namespace std::chrono_literals;
using namespace troupe::cluster;

namespace {

const std::filesystem::path source_dir{TROUPE_SOURCE_DIR};

load_result load_example(const char* name) {
  return load_topology(source_dir / "examples" / "topologies" / name);
}

load_result load_bad(const char* name) {
  return load_topology(source_dir / "tests" / "cluster" / "topologies" / "bad" / name);
}

std::string all_errors(const load_result& r) {
  std::string out;
  for (const auto& d : r.errors)
    out += d.to_string() + "\n";
  return out;
}

// The file is invalid, and one of its errors is on `line` and contains `text`.
void expect_error(const char* file, std::uint32_t line, std::string_view text) {
  auto r = load_bad(file);
  INFO("file: ", file, "\nerrors:\n", all_errors(r));
  REQUIRE_FALSE(r.ok());
  auto found = std::any_of(r.errors.begin(), r.errors.end(), [&](const diagnostic& d) {
    return d.line == line && d.to_string().find(text) != std::string::npos;
  });
  CHECK(found);
}

const pool_spec& pool_named(const topology& t, std::string_view name) {
  auto it = std::find_if(t.pools.begin(), t.pools.end(),
                         [&](const pool_spec& p) { return p.name == name; });
  REQUIRE(it != t.pools.end());
  return *it;
}

constexpr std::string_view minimal = R"(
[cluster]
name = "inline"
model = "DeepSeek-V3"
hardware = "h100"

[storage]
capacity = 4096

[[pool]]
name = "p"
role = "prefill"
instances = { min = 1, max = 3 }
gpus_per_instance = 8

[[pool]]
name = "d"
role = "decode"
instances = 2
gpus_per_instance = 16
ep_size = 4
)";

} // namespace

// -- valid files ------------------------------------------------------------------------------

TEST_CASE("every example topology is valid") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(source_dir / "examples" / "topologies"))
    if (entry.path().extension() == ".toml")
      files.push_back(entry.path());
  CHECK(files.size() >= 3);
  for (const auto& file : files) {
    auto r = load_topology(file);
    INFO("file: ", file.string(), "\nerrors:\n", all_errors(r));
    CHECK(r.ok());
  }
}

TEST_CASE("the 1k example holds about a thousand GPUs at initial size") {
  auto r = load_example("v4flash-1k.toml");
  REQUIRE(r.ok());
  auto s = summarize(*r.value);
  CHECK(s.initial_gpus >= 900);
  CHECK(s.initial_gpus <= 1100);
  CHECK(pool_named(*r.value, "decode").gpus_per_instance == 128);
  CHECK(pool_named(*r.value, "prefill").gpus_per_instance == 8);
  CHECK(r.value->storage.capacity_bytes == 100ULL << 50);
  CHECK(r.value->storage.ttl.at("agent") == 72h);
  CHECK(r.value->storage.ttl.at("chatbot") == 168h);
}

TEST_CASE("the small example has the pools the tests rely on") {
  auto r = load_example("small.toml");
  REQUIRE(r.ok());
  const auto& t = *r.value;
  REQUIRE(t.pools.size() == 3);
  CHECK(pool_named(t, "prefill").instances.initial == 2);
  CHECK(pool_named(t, "prefill").gpus_per_instance == 8);
  CHECK(pool_named(t, "decode").gpus_per_instance == 16);
  CHECK(pool_named(t, "vision").gpus_per_instance == 1);
  CHECK(summarize(t).initial_gpus == 33);
}

TEST_CASE("defaults are filled in for keys a valid file leaves out") {
  auto r = parse_topology(minimal, "inline.toml");
  INFO(all_errors(r));
  REQUIRE(r.ok());
  const auto& t = *r.value;
  CHECK(t.storage.backend == storage_backend::sim);
  CHECK(t.storage.ttl.at("agent") == 72h);
  CHECK(t.storage.ttl.at("chatbot") == 168h);
  const auto& p = pool_named(t, "p");
  CHECK(p.instances.initial == 1); // initial defaults to min
  CHECK(p.ep_size == 8);           // ep_size defaults to gpus_per_instance
  CHECK(p.buckets == std::vector<std::uint64_t>{16384, 65536, 262144});
  CHECK(pool_named(t, "d").grace == 60s);
  CHECK(t.autoscaler.scale_down_occupancy_limit == doctest::Approx(0.8));
  CHECK(t.autoscaler.quota == 3 * 8 + 2 * 16); // all pools at max
  CHECK(t.autoscaler.interval == 30s);
}

TEST_CASE("model and hardware names are matched case-insensitively and stored canonically") {
  auto r = parse_topology(minimal, "inline.toml");
  REQUIRE(r.ok());
  CHECK(r.value->cluster.model == "deepseek-v3");
  CHECK(r.value->cluster.hardware == "H100");
}

TEST_CASE("a topology selects the H200 and B200 profiles by name") {
  for (auto [spelled, canonical] : {std::pair{"h200", "H200"}, std::pair{"b200", "B200"}}) {
    std::string text(minimal);
    text.replace(text.find("\"h100\""), 6, std::string("\"") + spelled + "\"");
    auto r = parse_topology(text, "inline.toml");
    REQUIRE(r.ok());
    CHECK(r.value->cluster.hardware == canonical);
  }
}

TEST_CASE("an integer instance count fixes min, initial and max") {
  auto r = parse_topology(minimal, "inline.toml");
  REQUIRE(r.ok());
  const auto& d = pool_named(*r.value, "d").instances;
  CHECK(d.min == 2);
  CHECK(d.initial == 2);
  CHECK(d.max == 2);
}

TEST_CASE("an ep_size that divides gpus_per_instance is accepted") {
  auto r = parse_topology(minimal, "inline.toml");
  REQUIRE(r.ok());
  CHECK(pool_named(*r.value, "d").ep_size == 4);
}

TEST_CASE("the summary counts GPUs per pool and in total at min, initial and max") {
  auto r = load_example("small.toml");
  REQUIRE(r.ok());
  auto s = summarize(*r.value);
  REQUIRE(s.pools.size() == 3);
  CHECK(s.pools[0].min == 8);
  CHECK(s.pools[0].initial == 16);
  CHECK(s.pools[0].max == 32);
  CHECK(s.min_gpus == 8 + 16 + 1);
  CHECK(s.max_gpus == 32 + 32 + 1);
  CHECK(s.quota == 64);
  CHECK(s.initial_occupancy == doctest::Approx(33.0 / 64.0));
}

TEST_CASE("describe shows pools, human sizes, TTLs and the occupancy at initial size") {
  auto r = load_example("v4flash-1k.toml");
  REQUIRE(r.ok());
  auto text = describe(*r.value);
  CHECK(text.find("100 PiB") != std::string::npos);
  CHECK(text.find("agent 3d, chatbot 7d") != std::string::npos);
  CHECK(text.find("[0,16K) [16K,64K) [64K,256K) [256K,inf)") != std::string::npos);
  CHECK(text.find("grace 1m") != std::string::npos);
  CHECK(text.find("1040 / 1344 GPUs") != std::string::npos);
}

TEST_CASE("a file that cannot be read is one error naming the file") {
  auto r = load_topology(source_dir / "no-such-topology.toml");
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].to_string().find("no-such-topology.toml:1:1: cannot read")
        != std::string::npos);
}

// -- malformed files: each names its line and says what is wrong ------------------------------

TEST_CASE("a TOML syntax error is reported with its line") {
  expect_error("syntax-error.toml", 3, "TOML syntax error");
}

TEST_CASE("an unknown pool key is an error with a did-you-mean") {
  expect_error("unknown-pool-key.toml", 21,
               "pool[1].ep_szie: unknown key (did you mean 'ep_size'?)");
}

TEST_CASE("an unknown section is an error with a did-you-mean") {
  expect_error("unknown-section.toml", 22, "autoscalar: unknown key (did you mean 'autoscaler'?)");
}

TEST_CASE("an unknown node key is an error with a did-you-mean") {
  expect_error("unknown-node-key.toml", 27, "node[0].role: unknown key (did you mean 'roles'?)");
}

TEST_CASE("a missing required key is reported at its section") {
  expect_error("missing-model.toml", 2, "cluster.model: missing required key");
}

TEST_CASE("an unknown model is an error with a did-you-mean") {
  expect_error("unknown-model.toml", 4, "did you mean 'deepseek-v4.1-flash'?");
}

TEST_CASE("an unsupported hardware name is an error with a did-you-mean") {
  expect_error("unknown-hardware.toml", 5,
               "unknown hardware 'Ascend910' (did you mean 'Ascend950'?)");
}

TEST_CASE("an unknown pool role is an error with a did-you-mean") {
  expect_error("unknown-role.toml", 18, "unknown pool role 'decoder' (did you mean 'decode'?)");
}

TEST_CASE("initial instances outside min and max are an error") {
  expect_error("initial-outside-bounds.toml", 13, "initial (2) is outside [min, max] = [4, 8]");
}

TEST_CASE("min instances above max are an error") {
  expect_error("min-above-max.toml", 13, "min (5) is above max (2)");
}

TEST_CASE("an ep_size unrelated to gpus_per_instance is an error") {
  expect_error("ep-size-mismatch.toml", 15,
               "neither divides nor is a multiple of gpus_per_instance 8");
}

TEST_CASE("instance counts of a pool whose EP group spans instances must be whole groups") {
  expect_error("ep-span-not-whole.toml", 13, "max = 3 is not a multiple of 2");
}

TEST_CASE("duplicate pool names are an error pointing at the first definition") {
  expect_error("duplicate-pool-name.toml", 17,
               "duplicate pool name 'prefill' (first defined on line 11");
}

TEST_CASE("bucket bounds that do not increase strictly are an error at the offending bound") {
  expect_error("buckets-not-increasing.toml", 17,
               "pool[0].buckets[2]: bucket bounds must increase strictly");
}

TEST_CASE("buckets on a decode pool are an error") {
  expect_error("buckets-on-decode.toml", 21, "pool[1].buckets: applies only to prefill pools");
}

TEST_CASE("the real world's step budgets belong to their roles") {
  auto with = [](const std::string& prefill_extra, const std::string& decode_extra) {
    auto text = std::string(minimal);
    auto at = text.find("gpus_per_instance = 8\n");
    text.insert(at + std::string("gpus_per_instance = 8\n").size(), prefill_extra);
    text += decode_extra;
    return parse_topology(text, "inline.toml");
  };
  auto ok = with("chunk_tokens = 256\n", "max_batch = 32\n");
  INFO(all_errors(ok));
  REQUIRE(ok.ok());
  CHECK(pool_named(*ok.value, "p").chunk_tokens == 256);
  CHECK(pool_named(*ok.value, "d").max_batch == 32);
  CHECK(pool_named(*parse_topology(minimal, "inline.toml").value, "p").chunk_tokens == 0);
  auto misplaced = with("max_batch = 32\n", "chunk_tokens = 256\n");
  REQUIRE_FALSE(misplaced.ok());
  const auto errors = all_errors(misplaced);
  CHECK(errors.find("pool[0].max_batch: applies only to decode pools") != std::string::npos);
  CHECK(errors.find("pool[1].chunk_tokens: applies only to prefill pools") != std::string::npos);
  auto zero = with("chunk_tokens = 0\n", "");
  CHECK_FALSE(zero.ok());
}

TEST_CASE("ranks_per_process splits an instance's ranks over processes, at most all of them") {
  auto with = [](const std::string& line) {
    auto text = std::string(minimal);
    auto at = text.find("gpus_per_instance = 8\n");
    text.insert(at + std::string("gpus_per_instance = 8\n").size(), line);
    return parse_topology(text, "inline.toml");
  };
  auto ok = with("ranks_per_process = 4\n");
  INFO(all_errors(ok));
  REQUIRE(ok.ok());
  CHECK(pool_named(*ok.value, "p").ranks_per_process == 4);
  CHECK(pool_named(*ok.value, "d").ranks_per_process == 0);
  auto too_many = with("ranks_per_process = 9\n");
  REQUIRE_FALSE(too_many.ok());
  CHECK(all_errors(too_many).find("pool[0].ranks_per_process: is 9, but an instance has 8 rank(s) "
                                  "(gpus_per_instance)") != std::string::npos);
  CHECK_FALSE(with("ranks_per_process = 0\n").ok());
}

TEST_CASE("storage.shards spreads the store over shards (unset, a real cluster has one); replicas copy it") {
  auto with = [](const std::string& line) {
    auto text = std::string(minimal);
    auto at = text.find("capacity = 4096\n");
    text.insert(at + std::string("capacity = 4096\n").size(), line);
    return parse_topology(text, "inline.toml");
  };
  auto unset = parse_topology(minimal, "inline.toml");
  REQUIRE(unset.ok());
  CHECK(unset.value->storage.shards == 0);
  CHECK(unset.value->storage.real_shards() == 1);
  auto four = with("shards = 4\n");
  INFO(all_errors(four));
  REQUIRE(four.ok());
  CHECK(four.value->storage.real_shards() == 4);
  CHECK(describe(*four.value).find("  shards    4\n") != std::string::npos);
  for (const char* bad : {"shards = 0\n", "shards = 1025\n", "shards = \"two\"\n"}) {
    auto r = with(bad);
    CHECK_FALSE(r.ok());
    CHECK(all_errors(r).find("storage.shards") != std::string::npos);
  }
  // Replicas: copies on different shards, so no more than the shards.
  CHECK(unset.value->storage.real_replicas() == 1);
  auto copies = with("shards = 4\nreplicas = 2\n");
  INFO(all_errors(copies));
  REQUIRE(copies.ok());
  CHECK(copies.value->storage.real_replicas() == 2);
  CHECK(describe(*copies.value).find("  replicas  2\n") != std::string::npos);
  CHECK(with("replicas = 1\n").ok());
  auto alone = with("replicas = 2\n");
  CHECK_FALSE(alone.ok());
  CHECK(all_errors(alone).find("storage.replicas: a block's copies are on different shards: 2 "
                               "replicas need at least as many shards, and storage.shards is "
                               "not set (one shard)")
        != std::string::npos);
  for (const char* bad : {"shards = 2\nreplicas = 3\n", "shards = 16\nreplicas = 9\n",
                          "shards = 2\nreplicas = 0\n"}) {
    auto r = with(bad);
    CHECK_FALSE(r.ok());
    CHECK(all_errors(r).find("storage.replicas") != std::string::npos);
  }
}

TEST_CASE("a capacity with an unknown size unit is an error") {
  expect_error("bad-capacity.toml", 8, "storage.capacity: '1PiBs' has an unknown size unit 'PiBs'");
}

TEST_CASE("a TTL with an unknown duration unit is an error") {
  expect_error("bad-ttl.toml", 12,
               "storage.ttl.chatbot: '7days' has an unknown duration unit 'days'");
}

TEST_CASE("a grace period without a unit is an error that suggests one") {
  expect_error("grace-without-unit.toml", 21, "a duration needs a unit: write \"60s\"");
}

TEST_CASE("a quota below the pools' minimum GPUs is an error") {
  expect_error("quota-below-min.toml", 23,
               "quota of 16 GPUs is below the 32 GPUs the pools need at their minimum sizes");
}

TEST_CASE("an over-provision fraction above one is an error") {
  expect_error("over-provision-range.toml", 23,
               "autoscaler.over_provision: must be at least 0 and at most 1, got 10");
}

TEST_CASE("a single [pool] table instead of [[pool]] is an error") {
  expect_error("pool-not-array.toml", 10, "pool: expected an array of tables, got a table");
}

TEST_CASE("a cluster without a decode pool is an error") {
  expect_error("no-decode-pool.toml", 10, "has no decode pool");
}

TEST_CASE("a posix store without a path is an error") {
  expect_error("posix-without-path.toml", 7, "storage.path: missing required key");
}

TEST_CASE("a count written as a string is an error that says to drop the quotes") {
  expect_error("quoted-integer.toml", 14,
               "expected an integer, got a string (write 8 without quotes)");
}

TEST_CASE("duplicate node names are an error") {
  expect_error("duplicate-node-name.toml", 30, "duplicate node name 'n0'");
}

TEST_CASE("a port above 65535 is an error") {
  expect_error("port-out-of-range.toml", 25, "node[0].port: must be at most 65535, got 70000");
}

TEST_CASE("a pool role that no node serves is an error when nodes are given") {
  expect_error("role-without-node.toml", 18, "no [[node]] serves role 'decode'");
}

TEST_CASE("all errors of a file are reported, in line order") {
  auto r = load_bad("many-errors.toml");
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 3);
  CHECK(r.errors[0].line == 5);
  CHECK(r.errors[0].path == "cluster.hardware");
  CHECK(r.errors[1].line == 19);
  CHECK(r.errors[1].path == "pool[1].instances");
  CHECK(r.errors[2].line == 23);
  CHECK(r.errors[2].path == "autoscaler.interval");
}

TEST_CASE("diagnostics print as file:line:col: path: message (hint)") {
  diagnostic d{"t.toml", 3, 7, "pool[0].role", "unknown pool role 'x'", "expected one of: a"};
  CHECK(d.to_string() == "t.toml:3:7: pool[0].role: unknown pool role 'x' (expected one of: a)");
  diagnostic bare{"t.toml", 1, 1, "", "TOML syntax error: oops", ""};
  CHECK(bare.to_string() == "t.toml:1:1: TOML syntax error: oops");
}

TEST_CASE("inline text is labelled with the file name given") {
  auto r = parse_topology("[cluster]\nname = 1\n", "synthetic.toml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.errors[0].to_string().rfind("synthetic.toml:", 0) == 0);
  auto name_error = std::find_if(r.errors.begin(), r.errors.end(),
                                 [](const diagnostic& d) { return d.path == "cluster.name"; });
  REQUIRE(name_error != r.errors.end());
  CHECK(name_error->line == 2);
  CHECK(name_error->message == "expected a string, got an integer");
}

TEST_CASE("an empty pool list is an error") {
  auto r = parse_topology("pool = []\n[cluster]\nname = \"a\"\nmodel = \"deepseek-v3\"\n"
                          "hardware = \"cpu\"\n[storage]\ncapacity = \"1GiB\"\n",
                          "empty-pools.toml");
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].line == 1);
  CHECK(r.errors[0].message == "must list at least one pool");
}

TEST_CASE("an unknown key far from every known key lists the keys allowed there") {
  auto r = parse_topology("[autoscaler]\nfoo = 1\n", "far.toml");
  REQUIRE_FALSE(r.ok());
  auto it = std::find_if(r.errors.begin(), r.errors.end(),
                         [](const diagnostic& d) { return d.path == "autoscaler.foo"; });
  REQUIRE(it != r.errors.end());
  CHECK(it->line == 2);
  CHECK(it->hint.rfind("expected one of: interval, max_step_up", 0) == 0);
}

TEST_CASE("a cluster above the stated limits is rejected with the limit") {
  std::string text{minimal};
  // 1,000,000 instances of 65,536 GPUs: each key is in its own range, the whole is not.
  auto pos = text.find("instances = 2\ngpus_per_instance = 16");
  REQUIRE(pos != std::string::npos);
  text.replace(pos, std::string{"instances = 2\ngpus_per_instance = 16"}.size(),
               "instances = 1000000\ngpus_per_instance = 65536");
  text.replace(text.find("ep_size = 4"), 11, "ep_size = 65536");
  auto r = parse_topology(text, "huge.toml");
  INFO(all_errors(r));
  REQUIRE_FALSE(r.ok());
  auto errors = all_errors(r);
  CHECK(errors.find("the limit is 1048576") != std::string::npos);
  CHECK(errors.find("instances at their max sizes; the limit is 65536") != std::string::npos);
}
