// Tests of cluster/sim/fault_plan: loading fault plans, validating them against a topology,
// and expanding periodic entries and wildcards deterministically.
#include "cluster/sim/fault_plan.hpp"

#include "runtime/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

using namespace std::chrono_literals;
using namespace troupe::cluster;
using namespace troupe::cluster::sim;

namespace {

const std::filesystem::path source_dir{TROUPE_SOURCE_DIR};

const topology& topo(const char* name = "small.toml") {
  static std::map<std::string, topology> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto r = load_topology(source_dir / "examples" / "topologies" / name);
    REQUIRE(r.ok());
    it = cache.emplace(name, *r.value).first;
  }
  return it->second;
}

std::string all_errors(const fault_plan_result& r) {
  std::string out;
  for (const auto& d : r.errors)
    out += d.to_string() + "\n";
  return out;
}

fault_plan_result parse(std::string_view text) {
  return parse_fault_plan(text, "plan.toml", topo());
}

// The fixture is invalid against small.toml, and one of its errors, printed, is on `line`
// and contains `text`.
void expect_error(const char* file, std::uint32_t line, std::string_view text) {
  auto r = load_fault_plan(source_dir / "tests" / "cluster" / "faults" / "bad" / file, topo());
  INFO("file: ", file, "\nerrors:\n", all_errors(r));
  REQUIRE_FALSE(r.ok());
  auto found = std::any_of(r.errors.begin(), r.errors.end(), [&](const diagnostic& d) {
    return d.line == line && d.to_string().find(text) != std::string::npos;
  });
  CHECK(found);
}

fault_plan plan_of(std::string_view text) {
  auto r = parse(text);
  INFO(all_errors(r));
  REQUIRE(r.ok());
  return *r.value;
}

} // namespace

TEST_CASE("every example fault plan is valid against the shipped topologies") {
  for (auto t : {"small.toml", "v4flash-1k.toml"})
    for (auto& f : std::filesystem::directory_iterator(source_dir / "examples" / "faults")) {
      auto r = load_fault_plan(f.path(), topo(t));
      INFO(f.path().string(), " on ", t, "\n", all_errors(r));
      CHECK(r.ok());
    }
}

TEST_CASE("a one-shot gpu failure reads its time, target and note") {
  auto p = plan_of(R"(
name = "x"
[[fault]]
at = "2min"
kind = "fail"
gpu = "decode/1/15"
note = "xid"
)");
  CHECK(p.name == "x");
  REQUIRE(p.entries.size() == 1);
  auto& e = p.entries[0];
  CHECK(e.line == 3);
  CHECK(e.kind == fault_kind::fail);
  CHECK(e.at == 2min);
  CHECK_FALSE(e.every);
  CHECK(to_string(e.target) == "gpu decode/1/15");
  CHECK(e.note == "xid");
}

TEST_CASE("a drain takes the pool's grace unless it gives its own") {
  auto p = plan_of(R"(
[[fault]]
at = "0s"
kind = "drain"
instance = "decode/0"
[[fault]]
at = "1min"
kind = "drain"
instance = "decode/1"
grace = "5s"
)");
  CHECK(p.entries[0].grace == topo().pools[1].grace);
  CHECK(p.entries[1].grace == 5s);
}

TEST_CASE("a link joins pools or instances") {
  auto p = plan_of(R"(
[[fault]]
at = "1min"
kind = "partition"
link = ["prefill/1", "decode"]
duration = "30s"
)");
  CHECK(to_string(p.entries[0].target) == "link prefill/1 <-> decode");
  CHECK(p.entries[0].duration == 30s);
}

// -- malformed plans: message and line --------------------------------------------------------

TEST_CASE("an unknown key is an error with a did-you-mean") {
  expect_error("unknown-key.toml", 3, "fault[0].kindd: unknown key (did you mean 'kind'?)");
}

TEST_CASE("an unknown kind lists or suggests the kinds") {
  expect_error("unknown-kind.toml", 3, "fault[0].kind: unknown fault kind 'crash'");
}

TEST_CASE("a pool that does not exist is an error with a did-you-mean") {
  expect_error("unknown-pool.toml", 4,
               "fault[0].gpu: pool 'decod' does not exist (did you mean 'decode'?)");
}

TEST_CASE("a rank beyond the instance's GPUs is an error") {
  expect_error("rank-out-of-range.toml", 5,
               "fault[0].gpu: rank 16 does not exist: instances of pool 'decode' have 16 GPUs "
               "(rank indices run from 0 to 15)");
}

TEST_CASE("an instance beyond the pool's max is an error") {
  expect_error("instance-out-of-range.toml", 4,
               "instance 4 does not exist: pool 'prefill' has at most 4 instances");
}

TEST_CASE("a store shard beyond the store's shards is an error") {
  expect_error("shard-out-of-range.toml", 4,
               "fault[0].shard: shard 8 does not exist: the KV store has 8 shards");
}

TEST_CASE("a gpu target needs pool/instance/rank") {
  expect_error("gpu-wrong-form.toml", 4, "expected 'pool/instance/rank', got 'decode/0'");
}

TEST_CASE("a slowdown without a duration is reported at its entry") {
  expect_error("slow-without-duration.toml", 6, "fault[1].duration: missing required key");
}

TEST_CASE("a slowdown factor of at most 1 is out of range") {
  expect_error("factor-out-of-range.toml", 5,
               "fault[0].factor: must be above 1 and at most 1000, got 0.5");
}

TEST_CASE("only prefill and decode instances drain") {
  expect_error("drain-vision.toml", 4,
               "drain applies only to prefill and decode instances, and pool 'vision' is a "
               "vision pool");
}

TEST_CASE("a fault has one target") {
  expect_error("two-targets.toml", 5, "a fault has one target, but this entry names both");
}

TEST_CASE("at and every exclude each other") {
  expect_error("at-and-every.toml", 3, "fault[0].every: 'at' and 'every' exclude each other");
}

TEST_CASE("jitter above half the period is refused") {
  expect_error("jitter-too-large.toml", 3,
               "fault[0].jitter: jitter (6m) is more than half the period (10m)");
}

TEST_CASE("a duration without a unit suggests one") {
  expect_error("duration-without-unit.toml", 5,
               "fault[0].duration: expected a duration, got an integer (a duration needs a unit");
}

TEST_CASE("an entry without a time is an error") {
  expect_error("no-time.toml", 1, "fault[0].at: missing required key");
}

TEST_CASE("a surge has no target") {
  expect_error("surge-with-target.toml", 4, "kind 'surge' cannot target a pool");
}

TEST_CASE("a node target needs the topology's nodes") {
  expect_error("node-without-nodes.toml", 4,
               "node 'node-0' does not exist: the topology has no [[node]] sections");
}

TEST_CASE("a store shard takes the store kinds") {
  expect_error("fail-on-shard.toml", 4, "kind 'fail' cannot target a shard (store shards take "
                                        "kind = \"store_fail\")");
}

TEST_CASE("a link joins two different places") {
  expect_error("link-same-ends.toml", 4, "both ends of the link are 'decode/0'");
}

TEST_CASE("a TOML syntax error is the only error reported") {
  auto r = load_fault_plan(source_dir / "tests/cluster/faults/bad/syntax-error.toml", topo());
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].line == 2);
  CHECK(r.errors[0].message.find("TOML syntax error") != std::string::npos);
}

TEST_CASE("every problem of a plan is reported, in line order") {
  auto r = load_fault_plan(source_dir / "tests/cluster/faults/bad/many-errors.toml", topo());
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0].line == 6);
  CHECK(r.errors[0].path == "fault[0].gpu");
  CHECK(r.errors[1].line == 14);
  CHECK(r.errors[1].to_string().find("fault[1].grac: unknown key (did you mean 'grace'?)")
        != std::string::npos);
}

TEST_CASE("an unreadable plan is one diagnostic at 1:1") {
  auto r = load_fault_plan(source_dir / "no-such-plan.toml", topo());
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].line == 1);
  CHECK(r.errors[0].hint == "no such file");
}

// -- expansion --------------------------------------------------------------------------------

TEST_CASE("a periodic entry repeats from start until its end, with jitter within bounds") {
  auto p = plan_of(R"(
[[fault]]
every = "10min"
start = "5min"
jitter = "1min"
until = "1h"
kind = "fail"
pool = "decode"
)");
  auto t = expand(p, troupe::runtime::rng{7}, 10h);
  REQUIRE(t.size() == 6); // 5, 15, 25, 35, 45, 55 min
  for (std::size_t k = 0; k < t.size(); ++k) {
    auto base = 5min + k * 10min;
    CHECK(t[k].at >= base - 1min);
    CHECK(t[k].at <= base + 1min);
    CHECK(t[k].line == 2);
  }
  CHECK(std::is_sorted(t.begin(), t.end(),
                       [](const fault& a, const fault& b) { return a.at < b.at; }));
}

TEST_CASE("expansion stops at the horizon") {
  auto p = plan_of(R"(
[[fault]]
every = "10min"
kind = "fail"
pool = "decode"
[[fault]]
at = "2h"
kind = "recover"
pool = "decode"
)");
  auto t = expand(p, troupe::runtime::rng{1}, 1h);
  CHECK(t.size() == 6); // 10 .. 60 min; the 2h recovery is past the horizon
}

TEST_CASE("the same plan, seed and horizon give the same timeline; another seed another") {
  auto p = load_fault_plan(source_dir / "examples/faults/chaos.toml", topo());
  REQUIRE(p.ok());
  auto a = to_json(expand(*p.value, troupe::runtime::rng{3}.split("faults"), 3h));
  auto b = to_json(expand(*p.value, troupe::runtime::rng{3}.split("faults"), 3h));
  auto c = to_json(expand(*p.value, troupe::runtime::rng{4}.split("faults"), 3h));
  CHECK(a.dump() == b.dump());
  CHECK(a.dump() != c.dump());
  CHECK(a.size() > 10);
}

TEST_CASE("wildcards are drawn among the initial instances and the ranks") {
  auto p = plan_of(R"(
[[fault]]
every = "1min"
kind = "fail"
gpu = "prefill/*/*"
)");
  auto t = expand(p, troupe::runtime::rng{9}, 10h);
  REQUIRE(t.size() == 600);
  bool seen[2][8] = {};
  for (auto& f : t) {
    CHECK_FALSE(f.target.has_wildcard());
    REQUIRE(*f.target.place.instance < 2); // small.toml: prefill starts with 2 instances
    REQUIRE(*f.target.place.rank < 8);
    seen[*f.target.place.instance][*f.target.place.rank] = true;
  }
  for (auto& row : seen)
    for (bool s : row)
      CHECK(s);
}

TEST_CASE("an entry's draws do not depend on the other entries") {
  const char* periodic = R"(
[[fault]]
every = "10min"
jitter = "3min"
kind = "fail"
instance = "prefill/*"
)";
  auto busy = plan_of(std::string{R"(
[[fault]]
every = "1min"
jitter = "20s"
kind = "fail"
gpu = "prefill/*/*"
)"} + periodic);
  auto quiet = plan_of(std::string{R"(
[[fault]]
at = "0s"
kind = "drain"
instance = "decode/0"
)"} + periodic);
  auto second = [](const std::vector<fault>& t) {
    std::vector<std::string> out;
    for (auto& f : t)
      if (f.entry == 1)
        out.push_back(std::to_string(f.at.count()) + " " + to_string(f.target));
    return out;
  };
  troupe::runtime::rng root{5};
  auto a = second(expand(busy, root, 2h + 5min));
  CHECK(a == second(expand(quiet, root, 2h + 5min)));
  CHECK(a.size() == 12);
}

TEST_CASE("the timeline's JSON names the kind, target and parameters") {
  auto p = plan_of(R"(
[[fault]]
at = "90s"
kind = "slow"
instance = "decode/0"
factor = 2.5
duration = "1min"
)");
  auto j = to_json(expand(p, troupe::runtime::rng{0}, 1h));
  REQUIRE(j.size() == 1);
  CHECK(j[0]["at_s"] == 90.0);
  CHECK(j[0]["kind"] == "slow");
  CHECK(j[0]["target"] == "instance decode/0");
  CHECK(j[0]["factor"] == 2.5);
  CHECK(j[0]["duration_s"] == 60.0);
  CHECK(j[0]["line"] == 2);
}
